// The readiness panel under the live indicator: /api/readyz every 5 s, each part's answer.

import { api } from "./api.js";
import { h } from "./dom.js";

const LABELS = { postgres: "Postgres", redis: "Redis", minion: "CDI minion", scheduler: "Scheduler", workers: "Workers", s3: "S3" };
const INTERVAL_MS = 5000;

/** Paint `/api/readyz` into #ready: "All parts ready", or each part that is not, and why. */
export function readinessPanel() {
  const box = document.getElementById("ready");
  const text = document.getElementById("ready-text");
  const list = document.getElementById("ready-checks");

  function paint(body) {
    // Without a key the API says only ok or unavailable; with one, each part (checks).
    const checks = (body && body.checks) || {};
    const failing = Object.entries(checks).filter(([, c]) => !c.ok);
    const ready = body !== null && body.status === "ok";
    box.dataset.state = body === null ? "unknown" : ready ? "ready" : "degraded";
    const which = failing.length ? `: ${failing.map(([n]) => LABELS[n] || n).join(", ")}` : "";
    text.textContent = body === null ? "Readiness unknown" : ready ? "All parts ready" : `Not ready${which}`;
    list.replaceChildren(
      ...Object.entries(checks).map(([name, check]) =>
        h("li", { "data-check": name, "data-ok": String(check.ok), title: check.detail },
          h("span", { class: "ready-dot", "aria-hidden": "true" }),
          `${LABELS[name] || name}: ${check.ok ? "ok" : check.detail}`),
      ),
    );
  }

  async function tick() {
    try {
      paint(await api.get("/api/readyz"));
    } catch (err) {
      // 503 carries the checks too; no answer at all leaves readiness unknown.
      paint(err && err.status === 503 && err.body ? err.body : null);
    }
    setTimeout(tick, INTERVAL_MS);
  }
  tick();
}
