// Polling that stops with its page, waits while the tab is hidden and reports API health.

const listeners = new Set();
let lastOk = null;
let failing = false;

/** Subscribe to {ok, lastOk, error} after every poll of any page. */
export function onHealth(listener) {
  listeners.add(listener);
  listener({ ok: !failing, lastOk, error: null });
  return () => listeners.delete(listener);
}

function report(ok, error) {
  failing = !ok;
  if (ok) lastOk = Date.now();
  for (const listener of listeners) listener({ ok, lastOk, error });
}

/**
 * Run `task` now and then every `intervalMs` until `stop()` (or the returned function) is
 * called. A run never overlaps the previous one; a hidden tab is not polled. An `ApiError` goes
 * to `onError` (the page shows it); anything else is a bug and is logged as one.
 */
export function poll(task, intervalMs, onError = () => {}) {
  let stopped = false;
  let timer = null;

  async function tick() {
    timer = null;
    if (stopped) return;
    if (document.hidden) {
      timer = setTimeout(tick, intervalMs);
      return;
    }
    try {
      await task();
      report(true, null);
    } catch (err) {
      if (err && err.status !== undefined) {
        report(err.status !== 0, err); // only "no answer at all" means the API is down
        onError(err);
      } else {
        console.error("dashboard bug while refreshing", err);
      }
    }
    if (!stopped) timer = setTimeout(tick, intervalMs);
  }

  function wake() {
    if (!document.hidden && timer !== null && !stopped) {
      clearTimeout(timer);
      tick();
    }
  }
  document.addEventListener("visibilitychange", wake);
  tick();

  const stop = () => {
    stopped = true;
    if (timer !== null) clearTimeout(timer);
    document.removeEventListener("visibilitychange", wake);
  };
  stop.now = () => {
    if (timer !== null && !stopped) {
      clearTimeout(timer);
      tick();
    }
  };
  return stop;
}
