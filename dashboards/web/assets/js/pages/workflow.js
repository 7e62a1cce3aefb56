// One workflow run: task graph, timeline on worker lanes, CDI hand-offs, images, errors, and
// the cancel and retry buttons.

import { h, render } from "../dom.js";
import { allowed, api, ApiError, imageUrl } from "../api.js";
import { poll } from "../live.js";
import { taskGraph } from "../graph.js";
import { gantt, timelineLegend } from "../gantt.js";
import { card, containerChip, empty, errorBox, FINISHED, kv, mono, statusPill, table, toast } from "../components.js";
import { between, bytes, dateTime, duration, micros, shortId } from "../format.js";
import { workflowDuration } from "./common.js";
import { resultsTable } from "./results.js";

export function mount(root, ctx) {
  const id = ctx.params.id;
  ctx.setTitle(`Run ${shortId(id)}`);
  const regions = {
    head: h("div", { class: "page-head" }, h("div", {}, h("div", { class: "crumbs" }, h("a", { href: "#/workflows" }, "Workflows"), " / ", shortId(id)), h("h1", { tabindex: -1 }, "Loading…"))),
    alert: h("div", { id: "wf-alert", class: "slot" }),
    meta: h("div", { id: "wf-meta" }),
    graph: h("div", { class: "dag-scroll", id: "wf-graph" }),
    images: h("div", { id: "wf-images" }, h("p", { class: "loading" }, "Loading previews…")),
    results: h("div", { id: "wf-results" }),
    timeline: h("div", { class: "gantt-scroll", id: "wf-timeline" }),
    handoffs: h("div", { id: "wf-handoffs" }),
    runs: h("div", { id: "wf-runs" }),
    events: h("div", { id: "wf-events" }),
  };
  const page = h("div", { class: "page" }, regions.head, regions.alert);
  root.append(page);

  const eventsSummary = h("summary", { class: "card-head", style: "padding-bottom:14px", id: "events-summary" }, "Events");
  let definition = null;
  let last = "";
  let imagesFor = "";
  let built = false;
  let busy = false;

  function build() {
    page.append(
      h(
        "div",
        { class: "grid-main" },
        card("Run", regions.meta, { id: "card-meta" }),
        card("Images", regions.images, { id: "card-images", subtitle: "Input and result, downscaled" }),
      ),
      card("Results", regions.results, { id: "card-results", cls: "card-flush", subtitle: "What the run stored, each to download" }),
      card("Task graph", regions.graph, { id: "card-graph", subtitle: "Each step coloured by its latest attempt" }),
      card("Timeline", h("div", {}, timelineLegend(), regions.timeline), { id: "card-timeline", subtitle: "Task runs on worker lanes: queue wait, then run; arrows are CDI ownership hand-offs" }),
      card("Data hand-offs", regions.handoffs, { id: "card-handoffs", cls: "card-flush", subtitle: "Every change of the CDI object's owner made for this run" }),
      card("Task runs", regions.runs, { id: "card-runs", cls: "card-flush", subtitle: "Every attempt of every step" }),
      h("details", { class: "card details", id: "card-events" }, eventsSummary, h("div", { class: "card-body" }, regions.events)),
    );
    built = true;
  }

  async function refresh() {
    const wf = await api.get(`/api/workflows/${id}?events=200`);
    if (!FINISHED.has(wf.status)) {
      // Postgres says QUEUED until a report arrives; the workers' in-flight lists say RUNNING.
      const active = await api.get(`/api/task-runs/active?workflow=${id}`);
      const now = new Map(active.map((r) => [r.id, r.status]));
      wf.task_runs = wf.task_runs.map((r) => (now.has(r.id) ? { ...r, status: now.get(r.id) } : r));
    }
    if (!definition || definition.name !== wf.workflow) {
      definition = await api.get(`/api/workflow-definitions/${encodeURIComponent(wf.workflow)}`);
    }
    if (!built) build();
    const finished = FINISHED.has(wf.status);
    const snapshot = JSON.stringify(wf);
    if (snapshot !== last || !finished) {
      last = snapshot;
      renderAll(wf);
    }
    if (imagesFor !== wf.status && (imagesFor === "" || finished)) {
      imagesFor = wf.status;
      renderImages(wf, await api.get(`/api/workflows/${id}/images`));
    }
  }

  function renderAll(wf) {
    ctx.setTitle(`${wf.workflow} ${shortId(wf.id)}`);
    renderHead(wf);
    const ended = { CANCELLED: "was cancelled", TIMED_OUT: "timed out" }[wf.status] || "failed";
    // The step that ended the run, when its code raised: its traceback, unfolded on demand.
    const failing = wf.error ? [...wf.task_runs].reverse().find((r) => r.traceback && !["COMPLETED", "SKIPPED"].includes(r.status)) : null;
    render(
      regions.alert,
      wf.error ? errorBox(`This run ${ended}: ${wf.error}`) : null,
      failing ? traceback(failing, { id: "wf-traceback", cls: "alert-traceback", title: `Traceback of step ${failing.ref} (attempt ${failing.attempt}${failing.worker_id ? `, on ${failing.worker_id}` : ""})` }) : null,
      // What the run waits for while it cannot go on by itself (e.g. no worker has its task).
      wf.status_detail ? h("div", { class: "alert alert-info", role: "status", id: "wf-waiting" }, "This run is ", wf.status_detail) : null,
    );
    renderMeta(wf);
    render(regions.results, resultsTable(wf));
    renderGraph(wf);
    renderTimeline(wf);
    renderHandoffs(wf);
    renderRuns(wf);
    renderEvents(wf);
  }

  function renderHead(wf) {
    const operator = allowed("operator");
    const roleHint = "Needs an API key with the role operator or higher";
    const cancels = wf.status === "PENDING" || wf.status === "RUNNING";
    const retries = ["FAILED", "CANCELLED", "TIMED_OUT"].includes(wf.status);
    render(
      regions.head,
      h(
        "div",
        {},
        h("div", { class: "crumbs" }, h("a", { href: "#/workflows" }, "Workflows"), " / ", mono(shortId(wf.id))),
        h("div", { class: "title-row" }, h("h1", { tabindex: -1 }, wf.workflow), statusPill(wf.status, { id: "wf-status" }), wf.paused_at && !FINISHED.has(wf.status) && h("span", { class: "tag tag-warn", id: "wf-paused", title: `Paused since ${dateTime(wf.paused_at)}: its next steps wait` }, "paused")),
      ),
      // Only the action that applies: cancel while the run may still run, retry once it
      // failed or was cancelled; a completed run offers neither. Without the role, the
      // button is there but disabled, saying which role it needs.
      h(
        "div",
        { class: "actions" },
        cancels && h("button", { type: "button", class: "btn btn-danger", id: "cancel", "data-key": "cancel", disabled: !operator || busy, title: operator ? "Stop this run" : roleHint, onclick: cancel }, "Cancel run"),
        cancels && !wf.paused_at && h("button", { type: "button", class: "btn", id: "pause", "data-key": "pause", disabled: !operator || busy, title: operator ? "What runs finishes; the next steps wait" : roleHint, onclick: () => act(`/api/workflows/${id}/pause`, () => toast("Paused", "success")) }, "Pause"),
        cancels && wf.paused_at && h("button", { type: "button", class: "btn btn-primary", id: "resume", "data-key": "resume", disabled: !operator || busy, title: operator ? "Let the next steps go" : roleHint, onclick: () => act(`/api/workflows/${id}/resume`, () => toast("Resumed", "success")) }, "Resume"),
        retries && h("button", { type: "button", class: "btn btn-primary", id: "retry", "data-key": "retry", disabled: !operator || busy, title: operator ? "Start a new run with the same input" : roleHint, onclick: retry }, "Retry"),
      ),
    );
  }

  function renderMeta(wf) {
    render(
      regions.meta,
      kv([
        ["Run id", mono(wf.id)],
        ["Policy", h("span", { class: "tag" }, wf.policy)],
        ["Data plane", h("span", { class: "tag" }, wf.data_plane)],
        ["Created", dateTime(wf.created_at)],
        ["Waited", duration(between(wf.created_at, wf.started_at || wf.finished_at))],
        ["Ran for", duration(workflowDuration(wf))],
        wf.timeout_s && ["Time limit", h("span", { id: "wf-timeout" }, duration(wf.timeout_s * 1000))],
        ["Started by", h("span", { id: "wf-started-by" }, wf.started_by || "—")],
        ["Priority", String(wf.priority ?? 0)],
        wf.tags?.length > 0 && ["Tags", h("span", { id: "wf-tags" }, wf.tags.map((t) => h("span", { class: "tag" }, t)))],
        wf.schedule_id && ["Scheduled for", h("span", { id: "wf-scheduled" }, dateTime(wf.scheduled_for))],
        ["Scheduler", wf.claimed_by || "—"],
        ["Input", mono(wf.input?.image ?? "—", { title: wf.input?.image })],
        wf.input?.data && ["Data", mono(JSON.stringify(wf.input.data), { title: JSON.stringify(wf.input.data, null, 2) })],
        wf.retry_of && ["Retry of", h("a", { href: `#/workflows/${wf.retry_of}`, class: "mono" }, shortId(wf.retry_of))],
        wf.output?.label && ["Result label", h("b", {}, wf.output.label)],
      ]),
    );
  }

  function latestByRef(runs) {
    const states = {};
    for (const r of runs) {
      const prev = states[r.ref];
      if (prev && prev.attempt > r.attempt) continue;
      const ms = r.run_ms ?? (r.started_at ? between(r.started_at, r.finished_at) : null);
      states[r.ref] = { status: r.status, worker: r.worker_id, attempt: r.attempt, attempts: r.attempt, ms, error: r.error };
    }
    // A step run per element ("blur[3]") or a sub-workflow's step ("enhance/deblur"): one
    // node for the step, with its runs.
    const grouped = {};
    for (const [ref, state] of Object.entries(states)) {
      const step = ref.match(/^([^[/]+)(\[\d+\]|\/)/)?.[1];
      if (step) (grouped[step] ||= []).push({ ref, ...state });
    }
    for (const [step, parts] of Object.entries(grouped)) {
      const some = (status) => parts.some((p) => p.status === status);
      const status = ["FAILED", "TIMED_OUT", "RUNNING", "QUEUED", "CANCELLED"].find(some) || (parts.every((p) => p.status === "SKIPPED") ? "SKIPPED" : "COMPLETED");
      const done = parts.filter((p) => p.ms !== null && p.ms !== undefined);
      states[step] = {
        status,
        runs: parts.map((p) => ({ ref: p.ref, status: p.status, worker: p.worker })),
        workers: [...new Set(parts.map((p) => p.worker).filter(Boolean))],
        ms: done.length ? Math.max(...done.map((p) => p.ms)) : null,
        error: parts.find((p) => p.error)?.error,
      };
    }
    return states;
  }

  function renderGraph(wf) {
    render(regions.graph, taskGraph(definition.tasks, latestByRef(wf.task_runs), { label: `Task graph of ${wf.workflow}` }));
  }

  function renderTimeline(wf) {
    if (!wf.started_at && wf.task_runs.length === 0) {
      render(regions.timeline, empty("Not started yet", wf.status === "PENDING" ? "The run waits for a scheduler to claim it." : "This run never started."));
      return;
    }
    const width = Math.max(640, regions.timeline.clientWidth || 900);
    render(regions.timeline, gantt(wf, wf.task_runs, wf.handoffs, { width }));
  }

  function renderHandoffs(wf) {
    const list = wf.handoffs;
    if (!list.length) {
      const why = wf.data_plane === "cdi" ? "No hand-off: the first task's worker makes the object from the input in S3, and it moves only when a later task runs on another worker (straight from worker to worker along a chain; never under affinity)." : "This run uses the object-store data plane: every task downloads and uploads through S3, so no CDI ownership moves.";
      render(regions.handoffs, h("div", { style: "padding:0 16px 4px" }, empty("No hand-offs", why)));
      return;
    }
    const refOf = new Map(wf.task_runs.map((r) => [r.id, r.attempt > 1 ? `${r.ref} #${r.attempt}` : r.ref]));
    const t0 = Date.parse(wf.created_at);
    const moved = list.reduce((a, x) => a + x.bytes, 0);
    const spent = list.reduce((a, x) => a + x.duration_us, 0);
    // Two known, different hosts: the bytes were copied to another host's minion.
    const crosses = (x) => Boolean(x.from_host && x.to_host && x.from_host !== x.to_host);
    const crossed = list.filter(crosses);
    const hostOf = (host) => (host ? h("span", { class: "muted", title: `CDI host ${host}` }, ` @${host}`) : "");
    render(
      regions.handoffs,
      h(
        "div",
        { class: "summary", style: "padding:0 16px" },
        h("span", {}, h("b", { id: "handoff-count" }, list.length), ` hand-off${list.length === 1 ? "" : "s"}`),
        crossed.length
          ? h("span", {}, h("b", { id: "handoff-crossings" }, crossed.length), ` crossed between hosts (${bytes(crossed.reduce((a, x) => a + x.bytes, 0))} copied)`)
          : h("span", {}, h("b", {}, bytes(moved)), " handed over by ownership, not copied"),
        h("span", {}, h("b", {}, micros(spent)), " spent in transfers"),
      ),
      table(
        [
          { label: "#", cls: "num muted", cell: (x) => String(list.indexOf(x) + 1) },
          { label: "At", cls: "num nowrap", cell: (x) => h("span", { title: dateTime(x.at) }, `+${duration(Date.parse(x.at) - t0)}`) },
          { label: "From → To", cls: "nowrap", cell: (x) => h("span", { class: "handoff-pair" }, containerChip(x.from_container), hostOf(x.from_host), crosses(x) ? " ⇒ " : " → ", containerChip(x.to_container), hostOf(x.to_host)) },
          { label: "Data", cls: "nowrap", cell: (x) => (x.datum ? h("span", { class: "mono" }, x.datum, h("span", { class: "muted" }, ` ${x.mode || "transfer"}`)) : h("span", { class: "muted" }, "—")) },
          { label: "Bytes", align: "right", cls: "num", cell: (x) => h("span", { title: `${x.bytes.toLocaleString()} bytes` }, bytes(x.bytes)) },
          { label: "Transfer time", align: "right", cls: "num", cell: (x) => micros(x.duration_us) },
          { label: "For step", cell: (x) => (x.task_run_id && refOf.get(x.task_run_id)) || h("span", { class: "muted" }, "—") },
        ],
        list,
        { rowAttrs: (x) => ({ "data-handoff": x.id, "data-mode": x.mode || "transfer", "data-crosses-hosts": crosses(x) ? "yes" : "no" }), caption: "CDI ownership hand-offs", cls: "handoffs" },
      ),
    );
  }

  function renderRuns(wf) {
    if (!wf.task_runs.length) {
      render(regions.runs, h("div", { style: "padding:0 16px 4px" }, empty("No task has run yet", null)));
      return;
    }
    render(
      regions.runs,
      table(
        [
          { label: "Step", cell: (r) => h("b", {}, r.ref) },
          { label: "Task", cell: (r) => mono(r.task) },
          { label: "Attempt", align: "right", cls: "num", cell: (r) => String(r.attempt) },
          { label: "Status", cell: (r) => statusPill(r.status) },
          { label: "Worker", cell: (r) => (r.worker_id ? containerChip(r.worker_id) : "—") },
          { label: "Queue wait", align: "right", cls: "num nowrap", cell: (r) => duration(r.queue_wait_ms ?? (r.started_at ? between(r.queued_at, r.started_at) : null)) },
          { label: "Run", align: "right", cls: "num nowrap", cell: (r) => duration(r.run_ms ?? (r.started_at ? between(r.started_at, r.finished_at) : null)) },
          { label: "Task CPU", align: "right", cls: "num nowrap", cell: (r) => duration(r.cpu_ms) },
          { label: "In / out", align: "right", cls: "num nowrap", cell: (r) => `${bytes(r.bytes_in)} / ${bytes(r.bytes_out)}` },
          { label: "Error", cls: "wrap error-text", cell: (r) => h("div", {}, r.error || "", r.traceback && traceback(r)) },
        ],
        wf.task_runs,
        { rowAttrs: (r) => ({ "data-run": r.id, "data-ref": r.ref, "data-status": r.status }), caption: "Task runs", cls: "runs" },
      ),
    );
  }

  // Where the task's code raised (or was when it was stopped), folded until asked for.
  function traceback(r, { id = null, cls = "", title = "Traceback" } = {}) {
    return h(
      "details",
      { class: ["traceback", cls], id, "data-traceback": r.id },
      h("summary", {}, title),
      h("pre", { class: "traceback-text" }, r.traceback),
    );
  }

  function renderEvents(wf) {
    const t0 = Date.parse(wf.created_at);
    eventsSummary.textContent = `Events (${wf.events.length})`;
    render(
      regions.events,
      wf.events.length
        ? table(
            [
              { label: "At", cls: "num nowrap", cell: (e) => h("span", { title: dateTime(e.at) }, `+${duration(Date.parse(e.at) - t0)}`) },
              { label: "Event", cell: (e) => mono(e.kind) },
              { label: "Details", cls: "wrap", cell: (e) => mono(Object.entries(e.data).filter(([, v]) => v !== "" && v !== null).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join("  ")) },
            ],
            wf.events,
            { caption: "Events" },
          )
        : empty("No events", null),
    );
  }

  // Thumbnails come through fetch with the key, as object URLs freed when replaced or left.
  let objectUrls = [];
  function freeImages() {
    for (const url of objectUrls) URL.revokeObjectURL(url);
    objectUrls = [];
  }

  function thumbnail(image, title) {
    const img = h("img", { alt: `${title} image of the run`, width: image.width, height: image.height });
    imageUrl(image.thumbnail_url).then(
      (url) => {
        objectUrls.push(url);
        img.src = url;
      },
      (err) => {
        if (!(err instanceof ApiError)) throw err;
        img.replaceWith(h("p", { class: "empty-text" }, `The preview failed to load: ${err.message}`));
      },
    );
    return img;
  }

  function imageBox(image, title) {
    const frame = image.available ? thumbnail(image, title) : h("p", { class: "empty-text" }, image.problem || "No image");
    const caption = image.available ? [image.format, `${image.width}×${image.height}`, bytes(image.bytes)].filter(Boolean).join(" · ") : "";
    return h(
      "figure",
      { class: "image-box", style: "margin:0", "data-image": image.role, "data-available": String(image.available) },
      h("div", { class: "image-frame" }, frame),
      h("figcaption", { class: "image-cap", title: image.uri || "" }, h("b", {}, title), h("span", {}, caption || (image.uri ?? "")), h("span", { class: "mono" }, caption ? image.uri : "")),
    );
  }

  function renderImages(wf, images) {
    freeImages();
    render(
      regions.images,
      h("div", { class: "images" }, imageBox(images.input, "Input"), h("span", { class: "arrow", "aria-hidden": "true" }, "→"), imageBox(images.result, "Result")),
      wf.output?.label && h("p", { class: "result-label" }, "Classified as ", h("b", {}, wf.output.label), wf.output.brightness !== undefined ? h("span", { class: "muted" }, ` · brightness ${wf.output.brightness}`) : null),
    );
  }

  async function act(path, done) {
    busy = true;
    for (const b of regions.head.querySelectorAll("button")) b.disabled = true;
    try {
      done(await api.post(path));
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      toast(err.message, "error");
    } finally {
      busy = false;
      stop.now();
    }
  }

  function cancel() {
    act(`/api/workflows/${id}/cancel`, () => toast("Cancelled", "success"));
  }

  function retry() {
    act(`/api/workflows/${id}/retry`, (run) => {
      toast(`Retrying as ${shortId(run.id)}`, "success");
      ctx.navigate(`/workflows/${run.id}`);
    });
  }

  const stop = poll(refresh, 1500, (err) => {
    if (err.status === 404) {
      stop();
      render(regions.head, h("div", {}, h("div", { class: "crumbs" }, h("a", { href: "#/workflows" }, "Workflows")), h("h1", { tabindex: -1 }, "Run not found")));
      render(regions.alert, empty("There is no workflow run with this id", id, h("a", { class: "btn", href: "#/workflows" }, "Back to workflows")));
      return;
    }
    render(regions.alert, errorBox(err.message, err.problems));
  });
  return () => {
    stop();
    freeImages();
  };
}
