// How numbers, sizes, times and ids read on screen.

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "—";
}

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let value = Number(n);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** 0.42 ms, 38 ms, 1.24 s, 3 min 05 s, 2 h 10 min. */
export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  const v = Math.max(0, ms);
  if (v < 1) return `${v.toFixed(2)} ms`;
  if (v < 1000) return `${v < 10 ? v.toFixed(1) : Math.round(v)} ms`;
  if (v < 60_000) return `${(v / 1000).toFixed(v < 10_000 ? 2 : 1)} s`;
  const s = Math.round(v / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

export function micros(us) {
  if (us === null || us === undefined) return "—";
  return us < 1000 ? `${Math.round(us)} µs` : duration(us / 1000);
}

export function time(value) {
  return value ? new Date(value) : null;
}

/** "12 s ago", "3 min ago", "yesterday 14:02" — for tables that refresh themselves. */
export function ago(value, now = Date.now()) {
  const t = value instanceof Date ? value.getTime() : Date.parse(value);
  if (!Number.isFinite(t)) return "—";
  return agoSeconds((now - t) / 1000);
}

export function agoSeconds(seconds) {
  const s = Math.max(0, seconds);
  if (s < 1) return "just now";
  if (s < 60) return `${Math.floor(s)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

export function clock(value) {
  const d = value instanceof Date ? value : new Date(value);
  if (Number.isNaN(d.getTime())) return "—";
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
}

export function dateTime(value) {
  if (!value) return "—";
  const d = new Date(value);
  return `${d.toLocaleDateString([], { year: "numeric", month: "short", day: "numeric" })} ${clock(d)}`;
}

export function between(start, end) {
  if (!start) return null;
  const a = Date.parse(start);
  const b = end ? Date.parse(end) : Date.now();
  return b - a;
}

export function percent(value) {
  return value === null || value === undefined ? "—" : `${Math.round(value)}%`;
}

export function plural(n, one, many = `${one}s`) {
  return `${n.toLocaleString()} ${n === 1 ? one : many}`;
}
