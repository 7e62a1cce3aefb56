// Definitions: workflow DAGs and task definitions; save one from a JSON editor with the API's
// validation errors shown beside it. Saving a workflow under a name that exists makes a new
// version of it (runs already started keep theirs); its versions are listed with it.

import { h, render } from "../dom.js";
import { api, ApiError } from "../api.js";
import { poll } from "../live.js";
import { taskGraph } from "../graph.js";
import { card, empty, errorBox, mono, table, toast } from "../components.js";
import { dateTime, duration, plural } from "../format.js";
import { errorOffset, lineColumn } from "../jsonpos.js";
import { needsRole } from "./common.js";

const TEMPLATES = {
  workflow: {
    name: "my_pipeline",
    description: "Sharpen, then classify.",
    tasks: [
      { ref: "deblur", task: "deblur" },
      { ref: "classify", task: "classify", depends_on: ["deblur"] },
    ],
  },
  task: {
    name: "my_task",
    module: "workflows.image_tasks:deblur",
    timeout_s: 30,
    retries: 2,
    retry_backoff_s: 0.5,
    description: "",
  },
};
const ENDPOINT = { workflow: "/api/workflow-definitions", task: "/api/tasks" };

/** Where a JSON text goes wrong, as "line 3, column 7", or null. */
function whereInJson(text) {
  const offset = errorOffset(text);
  return offset < 0 ? null : lineColumn(text, offset);
}

export function mount(root, ctx) {
  ctx.setTitle("Definitions");
  let selected = ctx.query.get("name") || "";
  let kind = ctx.query.get("new") === "task" ? "task" : "workflow";
  let flows = [];
  let tasks = [];
  let lastSnapshot = "";

  const list = h("div", { id: "def-list" });
  const detail = h("div", { id: "def-detail" });
  const taskTable = h("div", { id: "task-table" });
  const problems = h("div", { class: "slot" });
  const countText = h("p", { class: "sub", id: "def-count" });

  // The editor.
  const textarea = h("textarea", { id: "def-json", name: "definition", rows: 16, spellcheck: "false", "aria-describedby": "def-errors def-help", "aria-label": "Definition as JSON" });
  const errors = h("div", { id: "def-errors", class: "slot", "aria-live": "polite" });
  const preview = h("div", { class: "dag-scroll slot", id: "def-preview" });
  const kindSwitch = h(
    "div",
    { class: "segmented", role: "group", "aria-label": "Kind of definition" },
    ["workflow", "task"].map((k) => h("button", { type: "button", "data-kind": k, "aria-pressed": String(k === kind), onclick: () => setKind(k) }, k === "workflow" ? "Workflow" : "Task")),
  );
  const submit = h("button", needsRole("admin", { type: "submit", class: "btn btn-primary", id: "def-submit" }), "Save");
  const editorForm = h(
    "form",
    { class: "editor", onsubmit: save, "aria-label": "Save a definition" },
    h("div", { class: "editor-bar" }, kindSwitch, h("div", { class: "card-actions" }, h("button", { type: "button", class: "btn", onclick: format }, "Format"), h("button", { type: "button", class: "btn", onclick: () => setKind(kind, true) }, "Reset"), submit)),
    textarea,
    h("p", { class: "hint", id: "def-help" }, "The API checks names, modules, unknown tasks, duplicate refs, dependencies and cycles; every problem it finds is listed here. A workflow saved under a name that exists becomes its next version."),
    errors,
    preview,
  );
  const editorCard = card("Save a definition", editorForm, { id: "card-editor", subtitle: "JSON, as PUT /api/workflow-definitions/{name} or /api/tasks/{name} takes it" });

  function setKind(next, reset = false) {
    const changed = next !== kind;
    kind = next;
    for (const b of kindSwitch.querySelectorAll("button")) b.setAttribute("aria-pressed", String(b.dataset.kind === kind));
    if (changed || reset || !textarea.value.trim()) {
      textarea.value = JSON.stringify(TEMPLATES[kind], null, 2);
    }
    render(errors);
    textarea.removeAttribute("aria-invalid");
    livePreview();
  }

  function parse() {
    try {
      return { value: JSON.parse(textarea.value) };
    } catch (err) {
      const where = whereInJson(textarea.value);
      return { error: `Not valid JSON${where ? ` at ${where}` : ""}: ${err.message}` };
    }
  }

  function format() {
    const parsed = parse();
    if (parsed.error) {
      render(errors, errorBox(parsed.error));
      textarea.setAttribute("aria-invalid", "true");
      return;
    }
    textarea.value = JSON.stringify(parsed.value, null, 2);
  }

  function livePreview() {
    const parsed = parse();
    const steps = parsed.value && Array.isArray(parsed.value.tasks) ? parsed.value.tasks.filter((t) => t && typeof t.ref === "string") : [];
    render(preview, kind === "workflow" && steps.length ? h("p", { class: "preview-label" }, "Preview") : null, kind === "workflow" && steps.length ? taskGraph(steps.map((t) => ({ ref: t.ref, task: String(t.task ?? "?"), depends_on: Array.isArray(t.depends_on) ? t.depends_on : [] })), {}, { label: "Preview of the graph", plain: true }) : null);
  }
  textarea.addEventListener("input", livePreview);

  async function save(event) {
    event.preventDefault();
    const parsed = parse();
    const name = parsed.value && typeof parsed.value.name === "string" ? parsed.value.name.trim() : "";
    if (parsed.error || !name) {
      textarea.setAttribute("aria-invalid", "true");
      render(errors, errorBox(parsed.error || `A ${kind} needs a "name".`));
      textarea.focus();
      return;
    }
    submit.disabled = true;
    try {
      const before = kind === "workflow" ? flows.find((f) => f.name === name) : null;
      const saved = await api.put(`${ENDPOINT[kind]}/${encodeURIComponent(name)}`, parsed.value);
      textarea.removeAttribute("aria-invalid");
      let what = `Saved ${kind} `;
      let after = ".";
      if (kind === "workflow") {
        what = before && before.version === saved.version ? `Unchanged: workflow ` : `Saved workflow `;
        after = `, version ${saved.version}.`;
      }
      render(errors, h("div", { class: "alert alert-info", role: "status" }, what, mono(saved.name), after));
      toast(`${what}${saved.name}${after}`, "success");
      if (kind === "workflow") selected = saved.name;
      versionsOf = null;
      lastSnapshot = "";
      stop.now();
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      textarea.setAttribute("aria-invalid", "true");
      const title = err.status === 422 ? "The API found problems" : "The API refused it";
      const problems = err.problems;
      const count = problems.length ? `: ${problems.length} problem${problems.length === 1 ? "" : "s"}` : ` — ${err.message}`;
      render(errors, errorBox(`${title}${count}`, problems));
    } finally {
      submit.disabled = false;
    }
  }

  root.append(
    h(
      "div",
      { class: "page" },
      h("div", { class: "page-head" }, h("div", {}, h("h1", { tabindex: -1 }, "Definitions"), countText)),
      problems,
      h("div", { class: "def-layout" }, card("Workflows", list, { id: "card-flows", cls: "card-flush" }), h("div", { style: "display:grid;gap:18px;min-width:0" }, detail, editorCard)),
      card("Tasks", taskTable, { id: "card-tasks", cls: "card-flush", subtitle: "Functions workers can run, with their limits" }),
    ),
  );
  setKind(kind, true);

  function renderList() {
    render(
      list,
      flows.length
        ? h(
            "ul",
            { class: "def-list" },
            flows.map((f) =>
              h(
                "li",
                {},
                h(
                  "a",
                  { href: `#/definitions?name=${encodeURIComponent(f.name)}`, "aria-current": String(f.name === selected), "data-key": `def-${f.name}`, "data-def": f.name, onclick: (e) => (e.preventDefault(), choose(f.name)) },
                  h("span", { class: "name" }, f.name),
                  h("span", { class: "meta" }, `${plural(f.tasks.length, "step")} · ${f.tasks.map((t) => t.ref).join(" → ")}`),
                ),
              ),
            ),
          )
        : empty("No workflow definitions", "Register one with the editor."),
    );
  }

  function choose(name) {
    selected = name;
    versionsOf = null;
    ctx.replaceQuery({ name });
    renderList();
    renderDetail();
  }

  // The selected workflow's versions, loaded when its detail is shown.
  let versionsOf = null;
  const versionList = h("div", { id: "def-versions" });

  async function loadVersions(flow) {
    const name = flow.name;
    const key = `${name}@${flow.version}`;
    versionsOf = key;
    render(versionList, h("p", { class: "loading" }, "Loading versions…"));
    try {
      const versions = await api.get(`/api/workflow-definitions/${encodeURIComponent(name)}/versions`);
      if (versionsOf !== key) return;
      render(
        versionList,
        table(
          [
            { label: "Version", align: "right", cls: "num", cell: (v) => h("b", {}, String(v.version)) },
            { label: "Saved", cls: "nowrap", cell: (v) => dateTime(v.created_at) },
            { label: "Steps", cell: (v) => v.tasks.map((t) => t.ref).join(" → ") },
            { label: "", cell: (v) => h("button", { type: "button", class: "btn btn-small", "data-edit-version": v.version, onclick: () => edit(v) }, "Edit") },
          ],
          versions,
          { caption: `Versions of ${name}`, rowAttrs: (v) => ({ "data-version": v.version }) },
        ),
      );
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      render(versionList, errorBox(err.message));
    }
  }

  /** Load a definition into the editor, to save it (changed) as the next version. */
  function edit(flow) {
    setKind("workflow");
    textarea.value = JSON.stringify({ name: flow.name, description: flow.description, tasks: flow.tasks }, null, 2);
    livePreview();
    textarea.focus();
  }

  async function toggleQueue(flow) {
    const verb = flow.paused_at ? "resume" : "pause";
    try {
      await api.post(`/api/workflow-definitions/${encodeURIComponent(flow.name)}/${verb}`);
      toast(verb === "pause" ? `Paused the queue of ${flow.name}: its new runs wait` : `Resumed the queue of ${flow.name}`, "success");
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      toast(err.message, "error");
    }
    lastSnapshot = "";
    stop.now();
  }

  function renderDetail() {
    const flow = flows.find((f) => f.name === selected) || flows[0];
    if (!flow) {
      render(detail);
      return;
    }
    render(
      detail,
      card(
        flow.name,
        h(
          "div",
          { style: "display:grid;gap:12px" },
          flow.description && h("p", { style: "margin:0", class: "muted" }, flow.description),
          h("div", { class: "dag-scroll" }, taskGraph(flow.tasks, {}, { label: `Graph of ${flow.name}`, plain: true })),
          h("details", {}, h("summary", {}, "JSON"), h("pre", { class: "json" }, JSON.stringify({ name: flow.name, description: flow.description, tasks: flow.tasks }, null, 2))),
          h("details", { id: "def-versions-box" }, h("summary", {}, `Versions (${flow.version})`), versionList),
          h("p", { class: "hint", style: "margin:0", id: "def-queue" }, `Priority ${flow.priority ?? 0} · ${flow.max_concurrent_runs ? `at most ${flow.max_concurrent_runs} running at once` : "no limit on running runs"} · queue `, flow.paused_at ? h("b", { "data-queue": "paused" }, `paused since ${dateTime(flow.paused_at)}: new runs wait`) : h("span", { "data-queue": "open" }, "open")),
          h("p", { class: "hint", style: "margin:0" }, `Version ${flow.version} saved ${dateTime(flow.updated_at)} · first registered ${dateTime(flow.created_at)} · `, h("a", { href: `#/workflows?workflow=${encodeURIComponent(flow.name)}` }, "Runs of this workflow →")),
        ),
        {
          id: "card-def-detail",
          subtitle: `Workflow definition · version ${flow.version}`,
          actions: [
            h("button", needsRole("operator", { type: "button", class: "btn", id: "def-queue-toggle", onclick: () => toggleQueue(flow) }), flow.paused_at ? "Resume queue" : "Pause queue"),
            h("button", { type: "button", class: "btn", id: "def-edit", onclick: () => edit(flow) }, "Edit"),
          ],
        },
      ),
    );
    if (versionsOf !== `${flow.name}@${flow.version}`) loadVersions(flow);
  }

  function renderTasks() {
    render(
      taskTable,
      tasks.length
        ? table(
            [
              { label: "Name", cell: (t) => h("b", { "data-task": t.name }, t.name) },
              { label: "Module", cell: (t) => mono(t.module) },
              { label: "Timeout", align: "right", cls: "num", cell: (t) => duration(t.timeout_s * 1000) },
              { label: "Retries", align: "right", cls: "num", cell: (t) => String(t.retries) },
              { label: "Backoff", align: "right", cls: "num", cell: (t) => duration(t.retry_backoff_s * 1000) },
              { label: "Description", cls: "wrap muted", cell: (t) => t.description || "" },
            ],
            tasks,
            { caption: "Task definitions" },
          )
        : empty("No task definitions", null),
    );
  }

  async function refresh() {
    const [f, t] = await Promise.all([api.get("/api/workflow-definitions"), api.get("/api/tasks")]);
    render(problems);
    const snapshot = JSON.stringify([f, t, selected]);
    if (snapshot === lastSnapshot) return;
    lastSnapshot = snapshot;
    flows = f;
    tasks = t;
    if (!flows.some((x) => x.name === selected) && flows.length) selected = flows[0].name;
    countText.textContent = `${plural(flows.length, "workflow")} · ${plural(tasks.length, "task")}`;
    renderList();
    renderDetail();
    renderTasks();
  }

  const stop = poll(refresh, 10000, (err) => render(problems, errorBox(err.message, err.problems)));
  return stop;
}
