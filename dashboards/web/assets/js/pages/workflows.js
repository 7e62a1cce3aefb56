// Workflows: filter by status, workflow, policy and time; search by id; page through by cursor
// (a page is read from where the one before stopped, so it costs the same however deep it is).

import { h, render, s } from "../dom.js";
import { api, query } from "../api.js";
import { poll } from "../live.js";
import { card, empty, errorBox, field, table, WORKFLOW_STATUSES, statusWord } from "../components.js";
import { WORKFLOW_COLUMNS, clickableRow, needsRole, startWorkflowDialog } from "./common.js";

const RANGES = [
  ["", "Any time"],
  ["15m", "Last 15 minutes"],
  ["1h", "Last hour"],
  ["24h", "Last 24 hours"],
  ["7d", "Last 7 days"],
  ["custom", "Custom range…"],
];
const RANGE_MS = { "15m": 15 * 60e3, "1h": 3600e3, "24h": 86400e3, "7d": 7 * 86400e3 };
const PAGE_SIZES = [25, 50, 100];
const ID_PREFIX = /^[0-9a-fA-F-]{0,36}$/;

function select(name, label, options, value) {
  return field(label, h("select", { name, "data-filter": name }, options.map(([v, text]) => h("option", { value: v, selected: v === value }, text))));
}

/** A datetime-local value ("2024-05-01T12:30") for a Date, in local time. */
function localInput(date) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

export function mount(root, ctx) {
  ctx.setTitle("Workflows");
  const q = ctx.query;
  const state = {
    q: q.get("q") || "",
    status: q.get("status") || "",
    workflow: q.get("workflow") || "",
    policy: q.get("policy") || "",
    range: q.get("range") || "",
    after: q.get("after") || "",
    before: q.get("before") || "",
    page: Math.max(1, Number(q.get("page")) || 1),
    cursor: q.get("cursor") || "",
    size: PAGE_SIZES.includes(Number(q.get("size"))) ? Number(q.get("size")) : 25,
  };
  if (!state.cursor) state.page = 1; // a page number alone cannot be found again

  const searchHint = h("span", { class: "hint hint-error", id: "search-hint", hidden: true }, "");
  const search = h("input", {
    type: "search",
    id: "search",
    name: "q",
    value: state.q,
    placeholder: "Search by run id, e.g. 3f2a9c",
    title: "Leading characters of a run id",
    "data-search": "",
    "aria-describedby": "search-hint",
    autocomplete: "off",
    spellcheck: "false",
  });
  const workflowSelect = select("workflow", "Workflow", [["", "All workflows"]], state.workflow);
  const custom = h(
    "div",
    { class: "filters", hidden: state.range !== "custom" },
    field("Created after", h("input", { type: "datetime-local", name: "after", value: state.after, "data-filter": "after" })),
    field("Created before", h("input", { type: "datetime-local", name: "before", value: state.before, "data-filter": "before" })),
  );
  const clear = h("button", { type: "button", class: "btn", onclick: clearAll }, "Clear filters");
  const form = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Filter workflows", onsubmit: (e) => e.preventDefault() },
    h(
      "div",
      { class: "field field-grow" },
      h("label", { for: "search" }, "Search"),
      h(
        "div",
        { class: "search" },
        s("svg", { viewBox: "0 0 24 24", "aria-hidden": "true" }, s("circle", { cx: 11, cy: 11, r: 7 }), s("path", { d: "M20 20l-3.6-3.6" })),
        search,
      ),
      searchHint,
    ),
    select("status", "Status", [["", "All statuses"], ...WORKFLOW_STATUSES.map((st) => [st, statusWord(st)])], state.status),
    workflowSelect,
    select("policy", "Policy", [["", "All policies"], ["affinity", "affinity"], ["transfer", "transfer"], ["auto", "auto"]], state.policy),
    select("range", "Created", RANGES, state.range),
    clear,
  );
  const results = h("div", { id: "results" }, h("p", { class: "loading", style: "padding:16px" }, "Loading…"));
  const count = h("span", { class: "sub", id: "count" });
  const problems = h("div", { class: "slot" });

  root.append(
    h(
      "div",
      { class: "page" },
      h(
        "div",
        { class: "page-head" },
        h("div", {}, h("h1", { tabindex: -1 }, "Workflows"), h("p", { class: "sub" }, count)),
        h("div", { class: "actions" }, h("button", needsRole("operator", { type: "button", class: "btn btn-primary", id: "start-workflow", onclick: () => startWorkflowDialog(ctx.navigate) }), "Start workflow")),
      ),
      h("div", { class: "card", style: "padding:14px 16px" }, form, custom),
      problems,
      card(null, results, { cls: "card-flush", id: "workflow-table" }),
    ),
  );

  api.get("/api/workflow-definitions").then(
    (defs) => {
      const sel = workflowSelect.querySelector("select");
      for (const d of defs) sel.append(h("option", { value: d.name, selected: d.name === state.workflow }, d.name));
    },
    (err) => render(problems, errorBox(err.message)),
  );

  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      const value = search.value.trim();
      const ok = ID_PREFIX.test(value);
      search.setAttribute("aria-invalid", String(!ok));
      searchHint.textContent = ok ? "" : "Run ids hold only 0-9, a-f and '-'";
      searchHint.hidden = ok;
      if (!ok) return; // the API would refuse it: say so here instead
      update({ q: value });
    }, 200);
  });
  form.addEventListener("change", (event) => {
    const name = event.target.dataset.filter;
    if (!name) return;
    const change = { [name]: event.target.value };
    if (name === "range") {
      custom.hidden = event.target.value !== "custom";
      if (event.target.value === "custom" && !state.after) {
        change.after = localInput(new Date(Date.now() - 3600e3));
        custom.querySelector("[name=after]").value = change.after;
      }
    }
    update(change);
  });
  custom.addEventListener("change", (event) => {
    const name = event.target.dataset.filter;
    if (name) update({ [name]: event.target.value });
  });

  function clearAll() {
    Object.assign(state, { q: "", status: "", workflow: "", policy: "", range: "", after: "", before: "", page: 1, cursor: "" });
    search.value = "";
    for (const el of form.querySelectorAll("select")) el.value = "";
    custom.hidden = true;
    update({});
  }

  function update(change, keepPage = false) {
    Object.assign(state, change);
    if (!keepPage || state.page <= 1) Object.assign(state, { page: 1, cursor: "" });
    const { q: text, status, workflow, policy, range, after, before, page, cursor, size } = state;
    ctx.replaceQuery({
      q: text,
      status,
      workflow,
      policy,
      range,
      after: range === "custom" ? after : "",
      before: range === "custom" ? before : "",
      page: page > 1 ? page : "",
      cursor,
      size: size !== 25 ? size : "",
    });
    stop.now();
  }

  function apiQuery() {
    const params = {
      status: state.status,
      workflow: state.workflow,
      policy: state.policy,
      q: ID_PREFIX.test(state.q) ? state.q : "",
      limit: state.size,
      cursor: state.cursor,
    };
    if (RANGE_MS[state.range]) params.created_after = new Date(Date.now() - RANGE_MS[state.range]).toISOString();
    if (state.range === "custom") {
      if (state.after) params.created_after = new Date(state.after).toISOString();
      if (state.before) params.created_before = new Date(state.before).toISOString();
    }
    return query(params);
  }

  const filtered = () => Boolean(state.q || state.status || state.workflow || state.policy || state.range);

  async function refresh() {
    const list = await api.get(`/api/workflows${apiQuery()}`);
    render(problems);
    if (list.items.length === 0 && state.page > 1) {
      update({}); // the runs of this page are gone (pruned): back to the first
      return;
    }
    const matching = list.total_exact ? list.total.toLocaleString() : `more than ${list.total.toLocaleString()}`;
    count.textContent = filtered() ? `${matching} matching` : `${matching} in total`;
    const c = WORKFLOW_COLUMNS;
    const first = list.items.length ? (state.page - 1) * state.size + 1 : 0;
    const last = first ? first + list.items.length - 1 : 0;
    const pages = list.total_exact ? ` of ${Math.max(1, Math.ceil(list.total / state.size)).toLocaleString()}` : "";
    render(
      results,
      list.items.length
        ? table([c.id, c.workflow, c.status, c.policy, c.plane, c.created, c.startedBy, c.duration, c.outcome], list.items, {
            rowAttrs: (w) => clickableRow(w, ctx.navigate),
            caption: "Workflows",
            cls: "workflows",
          })
        : filtered()
          ? empty("No workflows match these filters", "Widen the time range or clear a filter.", h("button", { type: "button", class: "btn", onclick: clearAll, "data-key": "empty-clear" }, "Clear filters"))
          : empty("No workflows yet", "Start one from here or with POST /api/workflows.", h("button", needsRole("operator", { type: "button", class: "btn btn-primary", onclick: () => startWorkflowDialog(ctx.navigate) }), "Start workflow")),
      h(
        "nav",
        { class: "pager", "aria-label": "Pages" },
        h("span", { class: "num", id: "range-text" }, list.items.length ? `${first.toLocaleString()}–${last.toLocaleString()} of ${matching}` : "Nothing to show"),
        h(
          "div",
          { class: "actions" },
          h(
            "label",
            { class: "hint" },
            "Rows ",
            h(
              "select",
              { "data-key": "size", "aria-label": "Rows per page", onchange: (e) => update({ size: Number(e.target.value) }) },
              PAGE_SIZES.map((n) => h("option", { value: n, selected: n === state.size }, n)),
            ),
          ),
          h("button", { type: "button", class: "btn btn-small", "data-key": "prev", disabled: !list.prev_cursor, onclick: () => update({ page: state.page - 1, cursor: list.prev_cursor }, true) }, "← Newer"),
          h("span", { class: "hint num" }, `Page ${state.page.toLocaleString()}${pages}`),
          h("button", { type: "button", class: "btn btn-small", "data-key": "next", disabled: !list.has_more, onclick: () => update({ page: state.page + 1, cursor: list.next_cursor }, true) }, "Older →"),
        ),
      ),
    );
  }

  const stop = poll(refresh, 2000, (err) => render(problems, errorBox(err.message, err.problems)));
  if (q.get("focus") === "search") search.focus();
  if (q.get("start") === "1") {
    ctx.replaceQuery({});
    startWorkflowDialog(ctx.navigate);
  }
  return () => {
    clearTimeout(typing); // a search typed just before leaving must not rewrite the next URL
    stop();
  };
}
