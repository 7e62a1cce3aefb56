// Schedules: cron schedules of definitions with their next fire times and latest tick; make
// one, pause, resume or delete it. The schedulers fire them (each tick once).

import { h, render } from "../dom.js";
import { api, ApiError, allowed } from "../api.js";
import { poll } from "../live.js";
import { card, empty, errorBox, field, mono, table, toast } from "../components.js";
import { dateTime } from "../format.js";
import { needsRole, workflowLink } from "./common.js";

export function mount(root, ctx) {
  ctx.setTitle("Schedules");
  const list = h("div", { id: "schedule-list" }, h("p", { class: "loading" }, "Loading…"));
  const problems = h("div", { class: "slot" });
  const errors = h("div", { id: "schedule-errors", "aria-live": "polite" });
  let definitions = [];

  const nameInput = h("input", { name: "name", id: "schedule-name", required: true, spellcheck: "false", autocomplete: "off", placeholder: "nightly-report" });
  const workflowSelect = h("select", { name: "workflow", id: "schedule-workflow" });
  const cronInput = h("input", { name: "cron", id: "schedule-cron", class: "mono", required: true, spellcheck: "false", autocomplete: "off", value: "0 * * * *" });
  const zoneInput = h("input", { name: "timezone", id: "schedule-timezone", value: "UTC", spellcheck: "false", autocomplete: "off" });
  const catchup = h("select", { name: "catchup", id: "schedule-catchup" }, [["skip", "Skip missed ticks"], ["latest", "Run the latest missed tick"], ["all", "Run every missed tick"]].map(([v, label]) => h("option", { value: v }, label)));
  const imageInput = h("input", { name: "image", id: "schedule-image", class: "mono", placeholder: "s3://bucket/key (empty: a dataless run)", spellcheck: "false", autocomplete: "off" });
  const submit = h("button", needsRole("operator", { type: "submit", class: "btn btn-primary", id: "schedule-submit" }), "Create schedule");
  const form = h(
    "form",
    { id: "schedule-form", novalidate: true, onsubmit: create },
    h("div", { class: "row" }, field("Name", nameInput), field("Workflow", workflowSelect)),
    h("div", { class: "row" }, field("Cron", cronInput, { hint: "minute hour day month weekday; six fields: seconds first; or @hourly, @daily" }), field("Time zone", zoneInput), field("Catch-up", catchup)),
    field("Input image", imageInput, { grow: true }),
    errors,
    h("div", { class: "buttons" }, submit),
  );

  root.append(
    h(
      "div",
      { class: "page" },
      h("div", { class: "page-head" }, h("div", {}, h("h1", { tabindex: -1 }, "Schedules"), h("p", { class: "sub" }, "Runs started at each tick of a cron expression, once per tick however many schedulers run."))),
      problems,
      card("Schedules", list, { id: "card-schedules", cls: "card-flush" }),
      card("New schedule", form, { id: "card-new-schedule" }),
    ),
  );

  async function create(event) {
    event.preventDefault();
    const image = imageInput.value.trim();
    const body = {
      name: nameInput.value.trim(),
      workflow: workflowSelect.value,
      cron: cronInput.value.trim(),
      timezone: zoneInput.value.trim() || "UTC",
      catchup: catchup.value,
      input: image ? { image } : {},
    };
    submit.disabled = true;
    try {
      const made = await api.post("/api/schedules", body);
      render(errors);
      toast(`Made schedule ${made.name}; next at ${dateTime(made.next_fire_at)}`, "success");
      nameInput.value = "";
      stop.now();
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      render(errors, errorBox(err.message, err.problems));
    } finally {
      submit.disabled = !allowed("operator");
    }
  }

  async function act(method, path, said) {
    try {
      await (method === "DELETE" ? api.del(path) : api.post(path));
      toast(said, "success");
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      toast(err.message, "error");
    }
    stop.now();
  }

  function actions(s) {
    const path = `/api/schedules/${encodeURIComponent(s.name)}`;
    return h(
      "div",
      { class: "card-actions" },
      s.paused_at
        ? h("button", needsRole("operator", { type: "button", class: "btn", "data-action": "resume", onclick: () => act("POST", `${path}/resume`, `Resumed ${s.name}`) }), "Resume")
        : h("button", needsRole("operator", { type: "button", class: "btn", "data-action": "pause", onclick: () => act("POST", `${path}/pause`, `Paused ${s.name}`) }), "Pause"),
      h("button", needsRole("operator", { type: "button", class: "btn btn-danger", "data-action": "delete", onclick: () => act("DELETE", path, `Deleted ${s.name}`) }), "Delete"),
    );
  }

  const columns = [
    { label: "Name", cell: (s) => h("b", {}, s.name) },
    { label: "Workflow", cell: (s) => mono(s.workflow) },
    { label: "Cron", cell: (s) => h("span", {}, mono(s.cron), " ", h("span", { class: "muted" }, s.timezone)) },
    { label: "State", cell: (s) => h("span", { class: ["tag", s.paused_at && "tag-warn"], "data-state": s.paused_at ? "paused" : "active" }, s.paused_at ? "paused" : `active · ${s.catchup}`) },
    { label: "Next fire times", cell: (s) => h("ol", { class: "times", "data-next": "" }, s.next_fire_times.slice(0, 3).map((t) => h("li", {}, h("time", { datetime: t }, dateTime(t))))) },
    { label: "Latest", cell: (s) => (s.last_error ? h("span", { class: "hint-error" }, s.last_error) : s.last_run_id ? h("span", {}, workflowLink(s.last_run_id), h("span", { class: "muted" }, ` for ${dateTime(s.last_fired_at)}`)) : "—") },
    { label: "", cell: actions },
  ];

  async function refresh() {
    const [schedules, defs] = await Promise.all([api.get("/api/schedules"), definitions.length ? definitions : api.get("/api/workflow-definitions")]);
    if (!definitions.length) {
      definitions = defs;
      render(workflowSelect, definitions.map((d) => h("option", { value: d.name }, d.name)));
    }
    render(problems);
    render(list, schedules.length ? table(columns, schedules, { rowAttrs: (s) => ({ "data-name": s.name }), caption: "Schedules" }) : empty("No schedule yet", "Make one below: a definition, a cron expression and its input."));
  }

  const stop = poll(refresh, 3000, (err) => render(problems, errorBox(err.message, err.problems)));
  return () => stop();
}
