// Pieces shared by several pages: workflow table columns, worker status, the start dialog
// (start.js).

import { h } from "../dom.js";
import { allowed } from "../api.js";
import { mono, statusPill } from "../components.js";
import { ago, between, dateTime, duration, shortId } from "../format.js";

export { startWorkflowDialog } from "./start.js";

export function workflowLink(id, attrs = {}) {
  return h("a", { href: `#/workflows/${id}`, class: "mono", title: id, "data-key": `wf-${id}`, ...attrs }, shortId(id));
}

export function workflowDuration(w) {
  if (!w.started_at) return null;
  return between(w.started_at, w.finished_at);
}

/** What a finished run produced, in a few words: its label, or why it failed. */
export function outcome(w) {
  if (w.error) return h("span", { class: "error-text", title: w.error }, w.error);
  const label = w.output && w.output.label;
  if (label) return h("span", {}, "label ", h("b", {}, label));
  return h("span", { class: "muted" }, "—");
}

export const WORKFLOW_COLUMNS = {
  id: { label: "Run", cell: (w) => workflowLink(w.id) },
  workflow: { label: "Workflow", cell: (w) => w.workflow },
  status: { label: "Status", cell: (w) => statusPill(w.status) },
  policy: { label: "Policy", cell: (w) => h("span", { class: "tag" }, w.policy) },
  plane: { label: "Data plane", cell: (w) => h("span", { class: "tag" }, w.data_plane) },
  created: { label: "Created", cell: (w) => h("time", { datetime: w.created_at, title: dateTime(w.created_at), class: "nowrap" }, ago(w.created_at)) },
  duration: { label: "Duration", align: "right", cls: "num nowrap", cell: (w) => duration(workflowDuration(w)) },
  outcome: { label: "Outcome", cls: "outcome", cell: (w) => outcome(w) },
  startedBy: { label: "Started by", cls: "nowrap", cell: (w) => w.started_by || "—" },
};

/** Attributes that disable a control the signed-in key's role may not use, saying why. */
export function needsRole(role, attrs = {}) {
  if (allowed(role)) return attrs;
  return { ...attrs, disabled: true, title: `Needs an API key with the role ${role} or higher` };
}

/** Whole-row click for tables whose first cell holds the real link (keyboard uses that). */
export function clickableRow(w, navigate) {
  return {
    class: "clickable",
    "data-id": w.id,
    "data-status": w.status,
    onclick: (event) => {
      if (event.target.closest("a, button")) return;
      navigate(`/workflows/${w.id}`);
    },
  };
}

export function workerState(worker) {
  return worker.alive ? "UP" : "GONE";
}

export { mono };
