// The timeline of one workflow: a lane per container (the scheduler, then each worker), task
// runs as queue-wait + run bars, the scheduler's own work, and every CDI hand-off as an arrow
// between lanes with a band showing which container held the data when.

import { h, s } from "./dom.js";
import { niceTicks } from "./charts.js";
import { bytes, duration, micros } from "./format.js";
import { statusWord } from "./components.js";

const LABEL_W = 118;
const LANE_H = 46;
const AXIS_H = 26;
const RIGHT = 16;
let uid = 0;

const ms = (v) => (v ? Date.parse(v) : null);

function lanesOf(workflow, runs, handoffs) {
  const lanes = [workflow.claimed_by || "scheduler"];
  const add = (name) => name && !lanes.includes(name) && lanes.push(name);
  runs.forEach((r) => add(r.worker_id));
  handoffs.forEach((x) => (add(x.from_container), add(x.to_container)));
  return lanes;
}

/**
 * Hand-offs in the order they happened, the object starting with ``owner``. Several can share
 * a time stamp (a report's hand-back and the next step's hand-over are written by one
 * statement, whose ids come in either order), so among equal times each next one is the
 * hand-off from the container that owns the object by then.
 */
export function inOrder(handoffs, owner = null) {
  const left = [...handoffs].sort((a, b) => ms(a.at) - ms(b.at) || a.id - b.id);
  const ordered = [];
  while (left.length) {
    const at = ms(left[0].at);
    const i = left.findIndex((x) => ms(x.at) === at && x.from_container === owner);
    const [next] = left.splice(i >= 0 ? i : 0, 1);
    ordered.push(next);
    owner = next.to_container;
  }
  return ordered;
}

/**
 * Intervals [{owner, from, to}] during which each container held the workflow's data, from
 * ``end`` (the run's end, or now). Before the first hand-off the data is with the worker that
 * made it from the input: the first task run's worker, from that run's start.
 */
export function ownership(handoffs, end, runs = []) {
  const first = [...runs].filter((r) => r.worker_id && (r.started_at || r.queued_at)).sort((a, b) => ms(a.started_at || a.queued_at) - ms(b.started_at || b.queued_at))[0];
  const sorted = inOrder(handoffs, first ? first.worker_id : null);
  const bands = [];
  if (first && (!sorted.length || sorted[0].from_container === first.worker_id)) {
    bands.push({ owner: first.worker_id, from: ms(first.started_at || first.queued_at), to: sorted.length ? ms(sorted[0].at) : end });
  }
  sorted.forEach((x, i) => bands.push({ owner: x.to_container, from: ms(x.at), to: i + 1 < sorted.length ? ms(sorted[i + 1].at) : end }));
  return bands;
}

export function timelineLegend() {
  const item = (cls, text) => h("li", {}, h("span", { class: ["swatch", cls], "aria-hidden": "true" }), text);
  return h(
    "ul",
    { class: "legend" },
    item("sw-queue", "Queue wait"),
    item("sw-run", "Running / done"),
    item("sw-failed", "Failed"),
    item("sw-sched", "Scheduler: claim and place"),
    item("sw-held", "Holds the data (CDI owner)"),
    item("sw-handoff", "Ownership hand-off"),
  );
}

export function gantt(workflow, runs, handoffs, { width, now = Date.now() }) {
  const t0 = ms(workflow.created_at);
  const stamps = [
    ms(workflow.finished_at),
    ...runs.flatMap((r) => [ms(r.queued_at), ms(r.started_at), ms(r.finished_at)]),
    ...handoffs.map((x) => ms(x.at)),
  ].filter((v) => v !== null);
  const live = !workflow.finished_at;
  const tEnd = Math.max(t0 + 1, ...stamps, live ? now : t0 + 1);
  const span = tEnd - t0;
  const lanes = lanesOf(workflow, runs, handoffs);
  const innerW = Math.max(200, width - LABEL_W - RIGHT);
  const height = lanes.length * LANE_H + AXIS_H;
  const x = (t) => LABEL_W + ((t - t0) / span) * innerW;
  const laneY = (name) => lanes.indexOf(name) * LANE_H;

  const marker = `hand-${++uid}`;
  const hatch = `hatch-${uid}`;
  const svg = s(
    "svg",
    { class: "gantt", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": `Timeline of ${runs.length} task runs on ${lanes.length} lanes` },
    s(
      "defs",
      {},
      s("marker", { id: marker, viewBox: "0 0 10 10", refX: 8, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" }, s("path", { d: "M0,0 L10,5 L0,10 z", class: "handoff-head" })),
      s("pattern", { id: hatch, width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" }, s("rect", { width: 6, height: 6, class: "hatch-bg" }), s("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "hatch-line" })),
    ),
  );

  // Lanes and the time axis.
  lanes.forEach((name, i) => {
    svg.append(
      s("rect", { class: ["lane", i % 2 && "lane-alt"], x: 0, y: i * LANE_H, width, height: LANE_H }),
      s("text", { class: "lane-label", x: 10, y: i * LANE_H + LANE_H / 2 + 4 }, name),
    );
  });
  for (const t of niceTicks(span, Math.max(3, Math.floor(innerW / 110)))) {
    if (t > span * 1.001) continue;
    svg.append(
      s("line", { class: "grid", x1: x(t0 + t), x2: x(t0 + t), y1: 0, y2: lanes.length * LANE_H }),
      s("text", { class: "axis", x: x(t0 + t), y: height - 8, "text-anchor": "middle" }, t === 0 ? "0" : duration(t)),
    );
  }

  const bar = (lane, from, to, cls, tip, text, { top = 9, tall = 20, fill = null } = {}) => {
    const x1 = x(from);
    const w = Math.max(2, x(to) - x1);
    const g = s("g", { class: cls }, s("title", {}, tip));
    g.append(s("rect", { x: x1, y: laneY(lane) + top, width: w, height: tall, rx: 3, fill }));
    if (text && w > text.length * 6.6 + 10) {
      g.append(s("text", { class: "bar-text", x: x1 + 6, y: laneY(lane) + top + tall / 2 + 4 }, text));
    }
    svg.append(g);
  };

  // The scheduler's own work: waiting to be claimed, then claiming and placing the first task
  // (the first task's worker loads the input; the last task's worker stores the result).
  const sched = lanes[0];
  const started = ms(workflow.started_at);
  const firstQueued = Math.min(...runs.map((r) => ms(r.queued_at)));
  if (started && started - t0 > 0) {
    bar(sched, t0, started, "seg seg-pending", `pending ${duration(started - t0)} (waiting for a scheduler)`, "pending", { fill: `url(#${hatch})` });
  }
  if (started && Number.isFinite(firstQueued) && firstQueued > started) {
    bar(sched, started, firstQueued, "seg seg-sched", `claim and place the first task (${duration(firstQueued - started)})`, "place");
  }
  const finished = ms(workflow.finished_at);

  // Which container held the data, as a thin band at the foot of its lane (a run with an
  // input image has data; a dataless one moves none).
  // One object moving along a chain; a graph's several objects (shared, copied) have no one
  // owner to draw: their hand-offs say where each went.
  const oneObject = handoffs.every((x) => !x.mode || x.mode === "transfer");
  const hasData = workflow.data_plane === "cdi" && Boolean(workflow.input?.image) && oneObject;
  for (const band of hasData ? ownership(handoffs, finished || now, runs) : []) {
    if (!lanes.includes(band.owner) || !(band.to > band.from)) continue;
    svg.append(
      s("rect", { class: "held", x: x(band.from), y: laneY(band.owner) + LANE_H - 11, width: Math.max(1.5, x(band.to) - x(band.from)), height: 5, rx: 2 }, s("title", {}, `${band.owner} owned the data for ${duration(band.to - band.from)}`)),
    );
  }

  // Task runs: queue wait (hatched, light) then the run itself (solid, by status).
  for (const r of runs) {
    if (r.status === "SKIPPED" || (!r.worker_id && r.task === "switch")) continue; // ran nowhere
    const lane = r.worker_id || sched;
    const q = ms(r.queued_at);
    // A run a worker holds but has not reported yet: its start is known only from the report.
    const st = ms(r.started_at) || (r.status === "RUNNING" ? q : null);
    const end = ms(r.finished_at) || (live ? now : tEnd);
    const status = r.status.toLowerCase();
    const name = r.attempt > 1 ? `${r.ref} #${r.attempt}` : r.ref;
    const waitEnd = st || end;
    if (waitEnd > q) {
      bar(lane, q, waitEnd, `seg seg-queue st-${status}`, `${name}: queued ${duration(waitEnd - q)}`, "", { top: 13, tall: 12 });
    }
    if (st) {
      const tip = [`${name} (${r.task}) — ${statusWord(r.status)}`, `queue wait ${duration(r.queue_wait_ms ?? st - q)}, run ${duration(r.run_ms ?? end - st)}`, r.bytes_in ? `in ${bytes(r.bytes_in)}, out ${bytes(r.bytes_out)}` : null, r.error].filter(Boolean).join("\n");
      bar(lane, st, end, `seg seg-run st-${status}`, tip, name);
    }
  }

  // Hand-offs: an arrow from the giver's lane to the taker's at the moment of the transfer.
  for (const x0 of handoffs) {
    if (!lanes.includes(x0.from_container) || !lanes.includes(x0.to_container)) continue;
    const at = x(ms(x0.at));
    const y1 = laneY(x0.from_container) + LANE_H / 2;
    const y2 = laneY(x0.to_container) + LANE_H / 2;
    const down = y2 > y1;
    const how = { share: "shared read-only", copy: "copied" }[x0.mode] || "by ownership";
    svg.append(
      s(
        "g",
        { class: ["handoff", x0.mode && `handoff-${x0.mode}`], "data-handoff": x0.id, "data-datum": x0.datum || null },
        s("title", {}, `${x0.datum ? `${x0.datum}: ` : ""}${x0.from_container} → ${x0.to_container}: ${bytes(x0.bytes)} ${how}, ${micros(x0.duration_us)}`),
        s("line", { x1: at, x2: at, y1: y1 + (down ? 4 : -4), y2: y2 + (down ? -6 : 6), "marker-end": `url(#${marker})` }),
        s("circle", { cx: at, cy: y1, r: 3.5 }),
      ),
    );
  }

  if (live) svg.append(s("line", { class: "now", x1: x(now), x2: x(now), y1: 0, y2: lanes.length * LANE_H }));
  return svg;
}
