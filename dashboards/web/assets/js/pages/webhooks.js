// Webhooks (admins): where runs' ends are POSTed, signed; register one (its secret is shown
// once), delete one, and read each one's delivery log.

import { h, render } from "../dom.js";
import { api, ApiError, allowed } from "../api.js";
import { poll } from "../live.js";
import { card, empty, errorBox, field, mono, table, toast } from "../components.js";
import { dateTime } from "../format.js";
import { needsRole, workflowLink } from "./common.js";

const EVENTS = ["workflow.completed", "workflow.failed", "workflow.cancelled", "workflow.timed_out", "task.completed", "task.failed", "task.timed_out"];

export function mount(root, ctx) {
  ctx.setTitle("Webhooks");
  let selected = ctx.query.get("name") || "";
  const list = h("div", { id: "webhook-list" }, h("p", { class: "loading" }, "Loading…"));
  const deliveries = h("div", { id: "delivery-log" });
  const problems = h("div", { class: "slot" });
  const errors = h("div", { id: "webhook-errors", "aria-live": "polite" });
  const secretBox = h("div", { id: "webhook-secret", "aria-live": "polite" });

  const nameInput = h("input", { name: "name", id: "webhook-name", required: true, spellcheck: "false", autocomplete: "off", placeholder: "ci-notify" });
  const urlInput = h("input", { name: "url", id: "webhook-url", class: "mono", required: true, spellcheck: "false", autocomplete: "off", placeholder: "the receiver's http(s) URL" });
  const workflowInput = h("input", { name: "workflow", id: "webhook-workflow", spellcheck: "false", autocomplete: "off", placeholder: "every workflow" });
  const boxes = EVENTS.map((e) => h("label", { class: "check" }, h("input", { type: "checkbox", name: "events", value: e, checked: e.startsWith("workflow.") }), " ", mono(e)));
  const submit = h("button", needsRole("admin", { type: "submit", class: "btn btn-primary", id: "webhook-submit" }), "Register webhook");
  const form = h(
    "form",
    { id: "webhook-form", novalidate: true, onsubmit: create },
    h("div", { class: "row" }, field("Name", nameInput), field("URL", urlInput, { grow: true })),
    h("div", { class: "row" }, field("Only runs of", workflowInput)),
    h("fieldset", { class: "checks" }, h("legend", {}, "Events"), boxes),
    errors,
    secretBox,
    h("div", { class: "buttons" }, submit),
  );

  root.append(
    h(
      "div",
      { class: "page" },
      h("div", { class: "page-head" }, h("div", {}, h("h1", { tabindex: -1 }, "Webhooks"), h("p", { class: "sub" }, "Runs' ends POSTed to a URL, signed (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature), retried with backoff."))),
      problems,
      card("Webhooks", list, { id: "card-webhooks", cls: "card-flush" }),
      card("Deliveries", deliveries, { id: "card-deliveries", cls: "card-flush", subtitle: "Newest first" }),
      card("Register a webhook", form, { id: "card-new-webhook" }),
    ),
  );

  async function create(event) {
    event.preventDefault();
    const events = [...form.querySelectorAll("input[name=events]:checked")].map((b) => b.value);
    const body = { name: nameInput.value.trim(), url: urlInput.value.trim(), events };
    if (workflowInput.value.trim()) body.workflow = workflowInput.value.trim();
    submit.disabled = true;
    try {
      const made = await api.post("/api/webhooks", body);
      render(errors);
      // Shown this once: the API keeps it to sign with and never shows it again.
      render(secretBox, h("div", { class: "alert alert-info", role: "status" }, h("p", {}, "Signing secret of ", mono(made.name), " (shown once; keep it where the receiver checks signatures):"), h("code", { class: "secret", id: "webhook-secret-value" }, made.secret)));
      selected = made.name;
      nameInput.value = "";
      stop.now();
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      render(errors, errorBox(err.message, err.problems));
    } finally {
      submit.disabled = !allowed("admin");
    }
  }

  async function remove(name) {
    try {
      await api.del(`/api/webhooks/${encodeURIComponent(name)}`);
      toast(`Deleted ${name}`, "success");
      if (selected === name) selected = "";
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      toast(err.message, "error");
    }
    stop.now();
  }

  const columns = [
    { label: "Name", cell: (w) => h("button", { type: "button", class: "linkish", "aria-pressed": String(w.name === selected), onclick: () => ((selected = w.name), ctx.replaceQuery({ name: w.name }), stop.now()) }, w.name) },
    { label: "URL", cell: (w) => mono(w.url) },
    { label: "Events", cell: (w) => w.events.map((e) => h("span", { class: "tag" }, e)) },
    { label: "Workflow", cell: (w) => w.workflow || "every one" },
    { label: "", cell: (w) => h("button", needsRole("admin", { type: "button", class: "btn btn-danger", "data-action": "delete", onclick: () => remove(w.name) }), "Delete") },
  ];

  const deliveryColumns = [
    { label: "Id", cls: "num", cell: (d) => String(d.id) },
    { label: "Event", cell: (d) => mono(d.event) },
    { label: "Run", cell: (d) => (d.workflow_id ? workflowLink(d.workflow_id) : "—") },
    { label: "Status", cell: (d) => h("span", { class: ["tag", d.status === "FAILED" && "tag-warn"], "data-status": d.status }, d.status) },
    { label: "Attempts", cls: "num", cell: (d) => String(d.attempts) },
    { label: "Receiver said", cell: (d) => (d.last_status ? `HTTP ${d.last_status}` : d.last_error || "—") },
    { label: "When", cell: (d) => (d.delivered_at ? `delivered ${dateTime(d.delivered_at)}` : d.status === "PENDING" ? `next try ${dateTime(d.next_attempt_at)}` : dateTime(d.created_at)) },
  ];

  async function refresh() {
    if (!allowed("admin")) {
      render(list, empty("Webhooks are for admins", "Sign in with an API key of the role admin to see and register them."));
      return;
    }
    const hooks = await api.get("/api/webhooks");
    if (!selected && hooks.length) selected = hooks[0].name;
    render(problems);
    render(list, hooks.length ? table(columns, hooks, { rowAttrs: (w) => ({ "data-name": w.name }), caption: "Webhooks" }) : empty("No webhook yet", "Register one below."));
    if (!selected || !hooks.some((w) => w.name === selected)) {
      render(deliveries, empty("No webhook chosen", "Choose one above to see its deliveries."));
      return;
    }
    const page = await api.get(`/api/webhooks/${encodeURIComponent(selected)}/deliveries?limit=50`);
    render(deliveries, page.items.length ? table(deliveryColumns, page.items, { rowAttrs: (d) => ({ "data-delivery": String(d.id) }), caption: `Deliveries of ${selected}` }) : empty(`Nothing sent to ${selected} yet`, "A delivery is made when a run it follows ends."));
  }

  const stop = poll(refresh, 3000, (err) => render(problems, errorBox(err.message, err.problems)));
  return () => stop();
}
