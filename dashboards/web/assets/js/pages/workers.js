// Workers: each worker process's own CPU and memory (with a short history; its host's beside
// them), queue depth, the images held between tasks, its host's input cache as it sees it, the
// task running now and the last heartbeat. A worker that stopped heartbeating is shown as gone.

import { h, render } from "../dom.js";
import { api } from "../api.js";
import { poll } from "../live.js";
import { card, empty, errorBox, meter, sparkline, statusPill } from "../components.js";
import { between, bytes, clock, duration, percent, plural, shortId } from "../format.js";
import { workerState } from "./common.js";

const HISTORY = 60; // samples kept per worker for the sparklines (2 minutes at 2 s)
// Kept across visits to the page, so coming back does not start the lines over.
const history = new Map(); // worker id → {cpu: [], mem: [], beat: last heartbeat seen}

export function mount(root, ctx) {
  ctx.setTitle("Workers");
  const grid = h("div", { class: "workers", id: "workers" }, h("p", { class: "loading" }, "Loading…"));
  const summary = h("p", { class: "sub", id: "workers-summary" });
  const problems = h("div", { class: "slot" });
  const queuedBox = h("div", { id: "queued" });
  root.append(
    h(
      "div",
      { class: "page" },
      h("div", { class: "page-head" }, h("div", {}, h("h1", { tabindex: -1 }, "Workers"), summary)),
      problems,
      grid,
      card("Queued tasks", queuedBox, { id: "card-queued", cls: "card-flush", subtitle: "Task runs waiting in a worker's queue" }),
    ),
  );

  function remember(w) {
    let item = history.get(w.id);
    if (!item) history.set(w.id, (item = { cpu: [], mem: [], beat: null }));
    if (w.last_heartbeat !== null && w.last_heartbeat !== item.beat) {
      item.beat = w.last_heartbeat; // one sample per heartbeat, not per poll
      item.cpu.push(w.cpu ?? 0);
      item.mem.push(w.mem ?? 0);
      if (item.cpu.length > HISTORY) item.cpu.shift(), item.mem.shift();
    }
    return item;
  }

  function metric(name, value, series, id, shown = percent(value), title = null) {
    return [
      h("div", { class: "metric", title }, h("span", {}, name), meter(value, `${name} of ${id}`), h("span", { class: "val", "data-metric": name.toLowerCase() }, shown)),
      h("div", { class: "metric" }, h("span"), h("div", { class: "metric-spark" }, sparkline(series, { width: 200, height: 26, label: `${name} history of ${id}` }))),
    ];
  }

  function workerCard(w, active) {
    const item = remember(w);
    const gone = !w.alive;
    const running = active.filter((r) => r.worker_id === w.id && r.status === "RUNNING");
    const queued = active.filter((r) => r.worker_id === w.id && r.status === "QUEUED");
    const uptime = w.started_at ? Date.now() / 1000 - w.started_at : null;
    return h(
      "article",
      { class: ["card", "worker", gone && "is-gone"], "data-worker": w.id, "data-alive": String(w.alive), "aria-label": `${w.id}, ${gone ? "gone" : "up"}` },
      h("div", { class: "worker-head" }, h("div", {}, h("div", { class: "worker-id" }, w.id), h("div", { class: "muted", style: "font-size:12px" }, w.host ? `on ${w.host}` : "host unknown")), statusPill(workerState(w), { "data-worker-state": workerState(w) })),
      gone &&
        h(
          "div",
          { class: "gone-note", role: "status" },
          w.heartbeat_age_s === null ? "No heartbeat on record — the worker is gone." : `No heartbeat for ${duration(w.heartbeat_age_s * 1000)} — presumed dead. Its tasks are retried elsewhere.`,
        ),
      ...metric("CPU", w.cpu, item.cpu, w.id, percent(w.cpu), "The worker process's CPU, percent of one core"),
      ...metric("Memory", w.mem, item.mem, w.id, w.rss_bytes === null || w.rss_bytes === undefined ? percent(w.mem) : bytes(w.rss_bytes), "The worker process's resident memory (the bar: its share of the host's)"),
      w.host_cpu !== null && w.host_cpu !== undefined && h("div", { class: "muted host-load", "data-host-load": "" }, `Host: ${percent(w.host_cpu)} CPU, ${percent(w.host_mem)} memory in use`),
      h(
        "div",
        { class: "worker-stats" },
        h("div", { class: "stat" }, h("div", { class: "stat-label" }, "Queue"), h("div", { class: "stat-value", "data-stat": "queue" }, w.queue_depth ?? "—")),
        h("div", { class: "stat" }, h("div", { class: "stat-label" }, "Running"), h("div", { class: "stat-value", "data-stat": "running" }, w.running ?? "—")),
        h(
          "div",
          { class: "stat", title: "Images held in memory between a workflow's tasks (affinity), not yet written to a CDI object" },
          h("div", { class: "stat-label" }, "Held"),
          h("div", { class: "stat-value", "data-stat": "held" }, w.held_images === null || w.held_images === undefined ? "—" : w.held_images ? `${w.held_images} · ${bytes(w.held_bytes)}` : "none"),
        ),
        h("div", { class: "stat" }, h("div", { class: "stat-label" }, "Heartbeat"), h("div", { class: "stat-value", "data-stat": "heartbeat" }, w.heartbeat_age_s === null ? "—" : duration(w.heartbeat_age_s * 1000))),
      ),
      inputCache(w),
      h(
        "div",
        { class: "worker-task", "data-running": running.map((r) => r.ref).join(",") },
        running.length
          ? running.map((r) =>
              h("div", {}, "Running ", h("b", {}, r.ref), " of ", h("a", { href: `#/workflows/${r.workflow_id}`, class: "mono", "data-key": `run-${r.id}` }, shortId(r.workflow_id)), h("span", { class: "muted" }, ` · queued ${duration(between(r.queued_at))} ago`)),
            )
          : h("span", { class: "muted" }, gone ? "Not running anything" : "Idle"),
      ),
      h(
        "div",
        { class: "worker-foot" },
        h("span", { "data-heartbeat": "" }, w.last_heartbeat ? `Last heartbeat at ${clock(new Date(w.last_heartbeat * 1000))}` : "No heartbeat on record"),
        h("span", {}, uptime !== null && !gone ? `up ${duration(uptime * 1000)}` : queued.length ? `${queued.length} queued` : ""),
      ),
    );
  }

  // The host's input cache (docs/input-cache.md): this worker's hits and misses, the S3 bytes
  // its hits spared, and, on the one worker that holds the host's cache, what it holds.
  function inputCache(w) {
    const c = w.input_cache;
    if (!c) return h("div", { class: "muted input-cache", "data-input-cache": "off", title: "CDIFLOW_INPUT_CACHE is off: every workflow fetches its input from S3" }, "Input cache off");
    return h(
      "div",
      { class: "input-cache", "data-input-cache": c.holder ? "holder" : "on", title: "Inputs fetched once per host: this worker's fetches through the host's cache" },
      h("span", {}, "Input cache: "),
      h("span", { "data-cache": "hits" }, plural(c.hits, "hit")),
      ", ",
      h("span", { "data-cache": "misses" }, plural(c.misses, "miss", "misses")),
      " · ",
      h("span", { "data-cache": "saved", title: `${c.saved_bytes.toLocaleString()} bytes not fetched from S3; ${c.s3_bytes.toLocaleString()} fetched` }, `${bytes(c.saved_bytes)} saved`),
      c.holder ? [" · holds ", h("span", { "data-cache": "held", title: `This worker holds the input cache of ${w.host || "its host"}` }, `${plural(c.entries, "input")} (${bytes(c.bytes)})`)] : null,
    );
  }

  async function refresh() {
    const [beats, active] = await Promise.all([api.get("/api/workers"), api.get("/api/task-runs/active")]);
    render(problems);
    const up = beats.filter((w) => w.alive).length;
    const runningNow = active.filter((r) => r.status === "RUNNING").length;
    const queuedNow = active.length - runningNow;
    summary.textContent = beats.length ? `${up} of ${plural(beats.length, "worker")} up · ${plural(runningNow, "task")} running, ${queuedNow} queued` : "";
    render(grid, beats.length ? beats.map((w) => workerCard(w, active)) : empty("No workers have registered", "Workers appear here after their first heartbeat. Start the stack with `cdiflow up`."));
    const queued = active.filter((r) => r.status === "QUEUED");
    render(
      queuedBox,
      queued.length
        ? h(
            "ul",
            { class: "moves", style: "padding:0 16px 12px" },
            queued.map((r) => h("li", {}, h("b", {}, r.ref), " of ", h("a", { href: `#/workflows/${r.workflow_id}`, class: "mono" }, shortId(r.workflow_id)), " → ", h("span", { class: "mono" }, r.worker_id || "unplaced"), h("span", { class: "when" }, `waiting ${duration(between(r.queued_at))}`))),
          )
        : h("div", { style: "padding:0 16px 4px" }, empty("Nothing queued", "Every worker keeps up with its queue.")),
    );
  }

  return poll(refresh, 2000, (err) => render(problems, errorBox(err.message, err.problems)));
}
