// The task graph: a layered left-to-right drawing of a workflow definition's DAG, each step
// coloured by the state of its latest attempt. A step follows what it depends on, the steps
// whose outputs it reads (`inputs`), and the switch whose case runs it; a skipped step (a case
// not taken) is greyed; a step run once per element (`for_each`) or a sub-workflow's step is
// one node with the count of its runs (`×16`), its runs listed in its tooltip.

import { s } from "./dom.js";
import { statusWord } from "./components.js";
import { duration } from "./format.js";

const W = 164;
const H = 62;
const COL_GAP = 48;
const ROW_GAP = 20;
const MARGIN = 10;
let uid = 0;

/** The steps `st` comes after: its `depends_on`, what its inputs and switch read, and the
 * switches whose cases name it. */
export function depsOf(st, steps) {
  const deps = new Set(st.depends_on || []);
  const refs = [...Object.values(st.inputs || {}).flat(), st.switch].filter((v) => typeof v === "string");
  refs.forEach((text) => {
    const ref = text.split(".")[0];
    if (ref !== "input") deps.add(ref);
  });
  for (const other of steps) {
    const cases = [...Object.values(other.cases || {}).flat(), ...(other.default || [])];
    if (other.ref !== st.ref && cases.includes(st.ref)) deps.add(other.ref);
  }
  deps.delete(st.ref);
  return [...deps];
}

/** Column of each step: the longest chain of dependencies before it. */
export function layers(steps) {
  const byRef = new Map(steps.map((st) => [st.ref, { ...st, depends_on: depsOf(st, steps) }]));
  const depth = new Map();
  const visiting = new Set();
  const visit = (ref) => {
    if (depth.has(ref)) return depth.get(ref);
    if (visiting.has(ref)) return 0; // a cycle cannot be registered; stay safe anyway
    visiting.add(ref);
    const deps = (byRef.get(ref)?.depends_on || []).filter((d) => byRef.has(d));
    const d = deps.length ? 1 + Math.max(...deps.map(visit)) : 0;
    visiting.delete(ref);
    depth.set(ref, d);
    return d;
  };
  steps.forEach((st) => visit(st.ref));
  const columns = [];
  for (const st of steps) {
    const d = depth.get(st.ref);
    (columns[d] ||= []).push(st);
  }
  return columns;
}

function clip(text, max) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/**
 * `steps` [{ref, task, depends_on}]; `states` maps a ref to {status, worker, attempts, ms}.
 * Steps without state are drawn as waiting, or, with `plain`, as a definition (no run).
 */
export function taskGraph(steps, states = {}, { label = "Task graph", plain = false } = {}) {
  const columns = layers(steps);
  const tallest = Math.max(...columns.map((c) => c.length), 1);
  const width = MARGIN * 2 + columns.length * W + Math.max(0, columns.length - 1) * COL_GAP;
  const height = MARGIN * 2 + tallest * H + (tallest - 1) * ROW_GAP;
  const pos = new Map();
  columns.forEach((col, ci) => {
    const offset = (height - (col.length * H + (col.length - 1) * ROW_GAP)) / 2;
    col.forEach((st, ri) => pos.set(st.ref, { x: MARGIN + ci * (W + COL_GAP), y: offset + ri * (H + ROW_GAP) }));
  });

  const marker = `arrow-${++uid}`;
  const svg = s(
    "svg",
    { class: "dag", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": label },
    s("defs", {}, s("marker", { id: marker, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M0,0 L10,5 L0,10 z", class: "arrowhead" }))),
  );

  for (const st of steps) {
    for (const dep of depsOf(st, steps)) {
      const a = pos.get(dep);
      const b = pos.get(st.ref);
      if (!a || !b) continue;
      const x1 = a.x + W;
      const y1 = a.y + H / 2;
      const x2 = b.x - 2;
      const y2 = b.y + H / 2;
      const mid = (x1 + x2) / 2;
      const done = states[dep]?.status === "COMPLETED";
      svg.append(s("path", { class: ["edge", done && "edge-done"], d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`, "marker-end": `url(#${marker})` }));
    }
  }

  for (const st of steps) {
    const p = pos.get(st.ref);
    const state = states[st.ref];
    const status = state?.status || (plain ? "PLAIN" : "WAITING");
    const kind = st.task || (st.workflow ? `workflow ${st.workflow}` : "switch");
    const line2 = [kind !== st.ref ? kind : null, state?.runs ? state.workers?.join(", ") : state?.worker].filter(Boolean).join(" · ") || kind;
    const deps = depsOf(st, steps);
    const line3 = state
      ? [statusWord(status), state.ms !== null && state.ms !== undefined ? duration(state.ms) : null].filter(Boolean).join(" · ")
      : plain
        ? deps.length ? `after ${deps.join(", ")}` : "first step"
        : "Waiting";
    const runs = state?.runs ? state.runs.map((r) => `  ${r.ref}: ${statusWord(r.status)}${r.worker ? ` on ${r.worker}` : ""}`) : [];
    const tip = [`${st.ref} (${kind})`, line3, !state?.runs && state?.worker && `on ${state.worker}`, state?.attempts > 1 && `${state.attempts} attempts`, state?.error, ...runs].filter(Boolean).join("\n");
    const g = s(
      "g",
      { class: ["node", `st-${status.toLowerCase()}`], transform: `translate(${p.x},${p.y})`, "data-ref": st.ref, "data-status": status, "data-runs": state?.runs ? state.runs.length : null },
      s("title", {}, tip),
      s("rect", { class: "node-box", width: W, height: H, rx: 9 }),
      s("rect", { class: "node-strip", width: 5, height: H - 2, x: 1, y: 1, rx: 2 }),
      s("text", { class: "node-ref", x: 16, y: 21 }, clip(st.ref, 18)),
      s("text", { class: "node-sub", x: 16, y: 38 }, clip(line2, 22)),
      s("text", { class: "node-state", x: 16, y: 53 }, clip(line3, 24)),
    );
    const badge = state?.runs ? `×${state.runs.length}` : state?.attempts > 1 ? `×${state.attempts}` : null;
    if (badge) {
      g.append(
        s("rect", { class: "node-badge", x: W - 40, y: 8, width: 32, height: 16, rx: 8 }),
        s("text", { class: "node-badge-text", x: W - 24, y: 20, "text-anchor": "middle" }, badge),
      );
    }
    svg.append(g);
  }
  return svg;
}
