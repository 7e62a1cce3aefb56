// Overview: counts by status, throughput and latency per minute, workers and CDI data at a glance.

import { h, render } from "../dom.js";
import { api, query } from "../api.js";
import { poll } from "../live.js";
import { barChart, legend, lineChart } from "../charts.js";
import { card, empty, errorBox, statusPill, table, statusWord, WORKFLOW_STATUSES, meter } from "../components.js";
import { bytes, duration, percent, plural } from "../format.js";
import { WORKFLOW_COLUMNS, clickableRow, needsRole, startWorkflowDialog, workerState } from "./common.js";

const WINDOWS = [
  [15, "15 min"],
  [60, "1 hour"],
  [360, "6 hours"],
];

export function mount(root, ctx) {
  ctx.setTitle("Overview");
  let windowMinutes = Number(ctx.query.get("window")) || 15;
  const tiles = h("div", { class: "tiles", id: "tiles" }, h("p", { class: "loading" }, "Loading…"));
  const throughput = h("div", { class: "chart-box", id: "throughput" });
  const latency = h("div", { class: "chart-box", id: "latency" });
  const recent = h("div", { id: "recent" });
  const workers = h("div", { id: "workers-mini" });
  const problems = h("div", { id: "problems", class: "slot" });

  const switcher = h(
    "div",
    { class: "segmented", role: "group", "aria-label": "Time window" },
    WINDOWS.map(([minutes, label]) =>
      h("button", { type: "button", "aria-pressed": String(minutes === windowMinutes), "data-window": minutes, onclick: () => choose(minutes) }, label),
    ),
  );
  function choose(minutes) {
    windowMinutes = minutes;
    for (const b of switcher.querySelectorAll("button")) b.setAttribute("aria-pressed", String(Number(b.dataset.window) === minutes));
    ctx.replaceQuery(minutes === 15 ? {} : { window: minutes });
    stop.now();
  }

  root.append(
    h(
      "div",
      { class: "page" },
      h(
        "div",
        { class: "page-head" },
        h("div", {}, h("h1", { tabindex: -1 }, "Overview"), h("p", { class: "sub" }, "Workflows, workers and CDI data across the cluster, live.")),
        h("div", { class: "actions" }, switcher, h("button", needsRole("operator", { type: "button", class: "btn btn-primary", onclick: () => startWorkflowDialog(ctx.navigate) }), "Start workflow")),
      ),
      problems,
      tiles,
      h(
        "div",
        { class: "grid-2" },
        card("Throughput", throughput, { id: "card-throughput", subtitle: "Workflows finished per minute" }),
        card("Latency", latency, { id: "card-latency", subtitle: "Created → finished, completed workflows, per minute" }),
      ),
      h(
        "div",
        { class: "grid-main" },
        card("Recent workflows", recent, { id: "card-recent", cls: "card-flush", actions: h("a", { href: "#/workflows" }, "All workflows →") }),
        card("Workers", workers, { id: "card-workers", cls: "card-flush", actions: h("a", { href: "#/workers" }, "Details →") }),
      ),
    ),
  );

  async function refresh() {
    const [stats, list, beats, cdi] = await Promise.all([
      api.get(`/api/stats${query({ window_minutes: windowMinutes })}`),
      api.get("/api/workflows?limit=8"),
      api.get("/api/workers"),
      api.get("/api/cdi/objects").catch((err) => ({ error: err })),
    ]);
    render(problems);
    renderTiles(stats, beats, cdi);
    renderCharts(stats);
    renderRecent(list);
    renderWorkers(beats);
  }

  function renderTiles(stats, beats, cdi) {
    const inWindow = (key) => stats.minutes.reduce((a, m) => a + m[key], 0);
    const notes = {
      PENDING: "waiting for a scheduler",
      RUNNING: "in progress now",
      COMPLETED: `+${inWindow("completed")} in ${label(windowMinutes)}`,
      FAILED: `${stats.counts.CANCELLED + stats.counts.FAILED ? "" : "none so far"}`,
      CANCELLED: "stopped by a user",
      TIMED_OUT: "past their time limit",
    };
    notes.FAILED = `+${inWindow("failed")} stopped in ${label(windowMinutes)}`;
    const up = beats.filter((w) => w.alive).length;
    const objects = cdi.error ? null : cdi.objects;
    render(
      tiles,
      WORKFLOW_STATUSES.map((st) =>
        h(
          "a",
          { class: ["tile", `st-${st.toLowerCase()}`], href: `#/workflows?status=${st}`, "data-key": `tile-${st}`, "data-count": stats.counts[st] },
          h("span", { class: "tile-label" }, statusWord(st)),
          h("span", { class: "tile-value", "data-tile": st }, stats.counts[st].toLocaleString()),
          h("span", { class: "tile-note" }, notes[st]),
        ),
      ),
      h(
        "a",
        { class: ["tile", up < beats.length ? "t-bad" : "t-workers"], href: "#/workers", "data-key": "tile-workers" },
        h("span", { class: "tile-label" }, "Workers up"),
        h("span", { class: "tile-value", "data-tile": "workers" }, `${up} / ${beats.length}`),
        h("span", { class: "tile-note" }, up < beats.length ? `${beats.length - up} gone` : beats.length ? "all heartbeating" : "none registered"),
      ),
      h(
        "a",
        { class: "tile t-data", href: "#/data", "data-key": "tile-data" },
        h("span", { class: "tile-label" }, "CDI objects"),
        h("span", { class: "tile-value", "data-tile": "objects" }, objects ? objects.length.toLocaleString() : "—"),
        h("span", { class: "tile-note" }, objects ? `${bytes(cdi.total_bytes)} in shared memory` : "controller unavailable"),
      ),
    );
  }

  function renderCharts(stats) {
    const points = stats.minutes.map((m) => ({ t: new Date(m.minute), values: m }));
    const width = Math.max(320, throughput.clientWidth || 480);
    const totals = stats.minutes.reduce((a, m) => ({ c: a.c + m.completed, f: a.f + m.failed, n: a.n + m.created }), { c: 0, f: 0, n: 0 });
    const tput = [
      { key: "completed", label: "Completed", cls: "s-completed" },
      { key: "failed", label: "Failed or cancelled", cls: "s-failed" },
    ];
    render(
      throughput,
      h(
        "div",
        { class: "summary" },
        h("span", {}, h("b", {}, totals.c), " completed"),
        h("span", {}, h("b", {}, totals.f), " failed or cancelled"),
        h("span", {}, h("b", {}, totals.n), " started"),
        h("span", {}, "median queue wait ", h("b", {}, duration(stats.tasks.queue_wait_p50_ms))),
        h("span", {}, "median task run ", h("b", {}, duration(stats.tasks.run_p50_ms))),
      ),
      legend(tput),
      barChart({ points, series: tput, width, label: `Workflows finished per minute over the last ${label(windowMinutes)}` }),
    );
    const lat = [
      { key: "p50_ms", label: "p50", cls: "s-p50" },
      { key: "p95_ms", label: "p95", cls: "s-p95" },
    ];
    const l = stats.latency;
    render(
      latency,
      h(
        "div",
        { class: "summary" },
        h("span", {}, "p50 ", h("b", {}, duration(l.p50_ms))),
        h("span", {}, "p95 ", h("b", {}, duration(l.p95_ms))),
        h("span", {}, "p99 ", h("b", {}, duration(l.p99_ms))),
        h("span", {}, "max ", h("b", {}, duration(l.max_ms))),
        h("span", {}, "over ", h("b", {}, plural(l.count, "run"))),
      ),
      legend(lat),
      l.count === 0 && stats.minutes.every((m) => m.p50_ms === null)
        ? empty("No completed workflows in this window", "Latency appears here as workflows complete.")
        : lineChart({ points, series: lat, width: Math.max(320, latency.clientWidth || 480), label: "Latency percentiles per minute", fmt: (v) => (v === 0 ? "0" : duration(v)) }),
    );
  }

  function renderRecent(list) {
    const c = WORKFLOW_COLUMNS;
    render(
      recent,
      list.items.length
        ? table([c.id, c.workflow, c.status, c.policy, c.created, c.duration], list.items, { rowAttrs: (w) => clickableRow(w, ctx.navigate), caption: "Recent workflows" })
        : empty("No workflows yet", "Start one to see it here.", h("button", needsRole("operator", { type: "button", class: "btn btn-primary", onclick: () => startWorkflowDialog(ctx.navigate) }), "Start workflow")),
    );
  }

  function renderWorkers(beats) {
    render(
      workers,
      beats.length
        ? table(
            [
              { label: "Worker", cls: "nowrap", cell: (w) => h("span", { class: "mono" }, w.id) },
              { label: "State", cell: (w) => statusPill(workerState(w)) },
              { label: "CPU", cell: (w) => h("div", { class: "mini-meter" }, meter(w.cpu, `CPU of ${w.id}`), h("span", { class: "num" }, percent(w.cpu))) },
              { label: "Queue", align: "right", cls: "num", cell: (w) => String(w.queue_depth ?? "—") },
            ],
            beats,
            { rowAttrs: (w) => ({ "data-worker": w.id }), caption: "Workers" },
          )
        : empty("No workers have registered", "Start the stack with `cdiflow up`."),
    );
  }

  const stop = poll(refresh, 2500, (err) => render(problems, errorBox(err.message, err.problems)));
  return stop;
}

function label(minutes) {
  return minutes >= 60 ? `${minutes / 60} h` : `${minutes} min`;
}
