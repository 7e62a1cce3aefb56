// Pieces shared by several pages: workflow table columns, worker status, the start dialog.

import { h } from "../dom.js";
import { allowed, api, ApiError } from "../api.js";
import { field, mono, statusPill, toast, errorBox } from "../components.js";
import { ago, between, dateTime, duration, shortId } from "../format.js";

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

/**
 * The "Start a workflow" dialog: definition, S3 URI, policy, data plane → POST /api/workflows.
 * Resolves with the new run, or null when cancelled.
 */
export async function startWorkflowDialog(navigate) {
  let definitions = [];
  try {
    definitions = await api.get("/api/workflow-definitions");
  } catch (err) {
    toast(err.message, "error");
    return;
  }
  let last = localStorage.getItem("cdiflow.lastImage") || "";
  if (!last) {
    // Offer the newest run's input: most people start with an image the cluster already saw.
    const recent = await api.get("/api/workflows?limit=1").catch(() => null);
    last = recent?.items?.[0]?.input?.image || "";
  }
  const errors = h("div", { "aria-live": "polite" });
  const image = h("input", { name: "image", value: last, placeholder: "s3://bucket/path/image.jpg (empty: a dataless run)", spellcheck: "false", autocomplete: "off", class: "mono" });
  const form = h(
    "form",
    { method: "dialog", novalidate: true },
    field("Workflow", h("select", { name: "workflow" }, definitions.map((d) => h("option", { value: d.name }, d.name)))),
    field("Input image (S3 URI)", image),
    h(
      "div",
      { class: "row" },
      field("Policy", h("select", { name: "policy" }, ["affinity", "transfer", "auto"].map((p) => h("option", { value: p }, p)))),
      field("Data plane", h("select", { name: "data_plane" }, ["cdi", "object-store"].map((p) => h("option", { value: p }, p)))),
    ),
    errors,
    h("div", { class: "buttons" }, h("button", { type: "button", class: "btn", value: "cancel", "data-close": "" }, "Cancel"), h("button", { type: "submit", class: "btn btn-primary" }, "Start")),
  );
  const dialog = h("dialog", { "aria-labelledby": "start-title", id: "start-dialog" }, h("h2", { id: "start-title" }, "Start a workflow"), form);
  document.body.append(dialog);
  dialog.addEventListener("close", () => dialog.remove());
  form.querySelector("[data-close]").addEventListener("click", () => dialog.close());
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = Object.fromEntries(new FormData(form));
    const uri = body.image.trim();
    const payload = { workflow: body.workflow, input: uri ? { image: uri } : {}, policy: body.policy, data_plane: body.data_plane };
    if (uri && !/^s3:\/\/[^/]+\/.+/.test(uri)) {
      image.setAttribute("aria-invalid", "true");
      errors.replaceChildren(errorBox("Write the image as s3://bucket/key."));
      image.focus();
      return;
    }
    try {
      const run = await api.post("/api/workflows", payload);
      if (uri) localStorage.setItem("cdiflow.lastImage", uri);
      dialog.close();
      toast(`Started ${shortId(run.id)}`, "success");
      navigate(`/workflows/${run.id}`);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      errors.replaceChildren(errorBox(err.message, err.problems));
    }
  });
  dialog.showModal();
  (last ? form.querySelector("select") : image).focus();
}

export { mono };
