// Pieces every page uses: status pills, cards, empty states, tables, toasts, sparklines.

import { h, s } from "./dom.js";

export const WORKFLOW_STATUSES = ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"];
export const FINISHED = new Set(["COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"]);

const STATUS_WORDS = {
  PENDING: "Pending",
  QUEUED: "Queued",
  RUNNING: "Running",
  COMPLETED: "Completed",
  FAILED: "Failed",
  TIMED_OUT: "Timed out",
  CANCELLED: "Cancelled",
  SKIPPED: "Skipped",
  WAITING: "Waiting",
  UP: "Up",
  GONE: "Gone",
};

export function statusWord(status) {
  return STATUS_WORDS[status] || status;
}

/** A coloured pill; `data-status` carries the raw value for tests and styles. */
export function statusPill(status, extra = {}) {
  return h(
    "span",
    { class: ["pill", `st-${String(status).toLowerCase()}`], "data-status": status, ...extra },
    h("span", { class: "dot", "aria-hidden": "true" }),
    statusWord(status),
  );
}

export function card(title, body, { actions = null, id = null, cls = "", subtitle = null } = {}) {
  return h(
    "section",
    { class: ["card", cls], id, "aria-labelledby": id ? `${id}-title` : null },
    title &&
      h(
        "header",
        { class: "card-head" },
        h("div", {}, h("h2", { id: id ? `${id}-title` : null }, title), subtitle && h("p", { class: "card-sub" }, subtitle)),
        actions && h("div", { class: "card-actions" }, actions),
      ),
    h("div", { class: "card-body" }, body),
  );
}

export function empty(title, text, action = null) {
  return h(
    "div",
    { class: "empty", role: "status" },
    h("div", { class: "empty-icon", "aria-hidden": "true" }, emptyIcon()),
    h("p", { class: "empty-title" }, title),
    text && h("p", { class: "empty-text" }, text),
    action,
  );
}

function emptyIcon() {
  return s(
    "svg",
    { viewBox: "0 0 24 24", width: 28, height: 28, fill: "none", stroke: "currentColor", "stroke-width": 1.6 },
    s("rect", { x: 3, y: 4, width: 18, height: 16, rx: 3 }),
    s("path", { d: "M3 9h18M8 14h8" }),
  );
}

export function errorBox(message, problems = []) {
  return h(
    "div",
    { class: "alert alert-error", role: "alert" },
    h("strong", {}, message),
    problems.length > 0 && h("ul", { class: "problems" }, problems.map((p) => h("li", {}, p))),
  );
}

/**
 * A table from column specs: {label, cell(row) → node|string, cls, align}. `rowAttrs(row)` may
 * add attributes such as a data-key. Header cells are real <th scope="col">.
 */
export function table(columns, rows, { rowAttrs = () => ({}), caption = null, cls = "" } = {}) {
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: ["table", cls] },
      caption && h("caption", { class: "sr-only" }, caption),
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: [c.cls, c.align && `al-${c.align}`] }, c.label)))),
      h(
        "tbody",
        {},
        rows.map((row) =>
          h("tr", rowAttrs(row), columns.map((c) => h("td", { class: [c.cls, c.align && `al-${c.align}`] }, c.cell(row)))),
        ),
      ),
    ),
  );
}

export function kv(pairs) {
  return h(
    "dl",
    { class: "kv" },
    pairs.filter(Boolean).map(([k, v]) => h("div", { class: "kv-row" }, h("dt", {}, k), h("dd", {}, v ?? "—"))),
  );
}

/** A horizontal gauge, 0–100. */
export function meter(value, label) {
  const v = value === null || value === undefined ? 0 : Math.max(0, Math.min(100, value));
  const level = v >= 85 ? "high" : v >= 60 ? "mid" : "low";
  return h(
    "div",
    { class: ["meter", `meter-${level}`], role: "meter", "aria-valuemin": 0, "aria-valuemax": 100, "aria-valuenow": Math.round(v), "aria-label": label },
    h("div", { class: "meter-fill", style: `width:${v}%` }),
  );
}

/** A small line over the last values (0–100 unless `max` is given). */
export function sparkline(values, { width = 120, height = 28, max = 100, label = "" } = {}) {
  const n = values.length;
  const svg = s("svg", { class: "spark", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": label });
  if (n < 2) return svg;
  const top = Math.max(max, ...values);
  const x = (i) => (i / (n - 1)) * (width - 2) + 1;
  const y = (v) => height - 2 - (v / (top || 1)) * (height - 4);
  const points = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`);
  svg.append(
    s("path", { class: "spark-area", d: `M1,${height - 1} L${points.join(" L")} L${x(n - 1).toFixed(1)},${height - 1} Z` }),
    s("path", { class: "spark-line", d: `M${points.join(" L")}` }),
  );
  return svg;
}

let toastRegion = null;

/** A short message in the corner, read out by screen readers. */
export function toast(message, kind = "info") {
  if (!toastRegion) {
    toastRegion = h("div", { class: "toasts", role: "status", "aria-live": "polite" });
    document.body.append(toastRegion);
  }
  const item = h("div", { class: ["toast", `toast-${kind}`] }, message);
  toastRegion.append(item);
  setTimeout(() => item.classList.add("toast-out"), 4200);
  setTimeout(() => item.remove(), 4700);
}

export function button(label, attrs = {}) {
  return h("button", { type: "button", class: "btn", ...attrs }, label);
}

export function mono(text, attrs = {}) {
  return h("code", { class: "mono", ...attrs }, text);
}

/** A stable colour for a container name: scheduler purple, workers from a palette. */
export function containerHue(name) {
  if (!name) return 220;
  if (name.startsWith("scheduler")) return 268;
  const match = /(\d+)$/.exec(name);
  let n = match ? Number(match[1]) : [...name].reduce((a, c) => a + c.charCodeAt(0), 0);
  const palette = [199, 152, 28, 330, 90, 4, 240, 48];
  return palette[(n - 1 + palette.length) % palette.length];
}

export function containerChip(name) {
  if (!name) return h("span", { class: "chip chip-none" }, "nobody");
  return h("span", { class: "chip", style: `--hue:${containerHue(name)}` }, h("span", { class: "dot", "aria-hidden": "true" }), name);
}

let fieldIds = 0;

/** A labelled form control: <div class=field><label for=…>text</label>control hint</div>. */
export function field(label, control, { grow = false, hint = null } = {}) {
  if (!control.id) control.id = `f-${++fieldIds}`;
  return h("div", { class: ["field", grow && "field-grow"] }, h("label", { for: control.id }, label), control, hint);
}
