// Hand-written SVG charts: stacked bars per minute and lines of percentiles.

import { h, s } from "./dom.js";

const PAD = { top: 12, right: 12, bottom: 26, left: 46 };

/** Round steps for an axis from 0 to at least `max`: [0, 2, 4, 6]. */
export function niceTicks(max, count = 4) {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((st) => st >= raw);
  const ticks = [];
  for (let v = 0; v < max + step * 0.999; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

function hhmm(date) {
  return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
}

function frame(width, height, ticks, fmt, points, label) {
  const innerW = width - PAD.left - PAD.right;
  const innerH = height - PAD.top - PAD.bottom;
  const top = ticks[ticks.length - 1] || 1;
  const y = (v) => PAD.top + innerH - (v / top) * innerH;
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": label });
  for (const t of ticks) {
    svg.append(
      s("line", { class: "grid", x1: PAD.left, x2: width - PAD.right, y1: y(t), y2: y(t) }),
      s("text", { class: "axis", x: PAD.left - 6, y: y(t) + 4, "text-anchor": "end" }, fmt(t)),
    );
  }
  const n = points.length;
  const slot = innerW / Math.max(n, 1);
  const every = Math.max(1, Math.ceil(n / Math.max(2, Math.floor(innerW / 64))));
  points.forEach((p, i) => {
    if ((n - 1 - i) % every === 0) {
      svg.append(s("text", { class: "axis", x: PAD.left + slot * (i + 0.5), y: height - 8, "text-anchor": "middle" }, hhmm(p.t)));
    }
  });
  return { svg, y, slot, innerH };
}

export function legend(series) {
  return h(
    "ul",
    { class: "legend" },
    series.map((se) => h("li", {}, h("span", { class: ["swatch", se.cls], "aria-hidden": "true" }), se.label)),
  );
}

/** Stacked bars: `points` [{t: Date, values: {key: number}}], `series` [{key, label, cls}]. */
export function barChart({ points, series, width, height = 180, label, unit = "" }) {
  const totals = points.map((p) => series.reduce((a, se) => a + (p.values[se.key] || 0), 0));
  const ticks = niceTicks(Math.max(...totals, 1), 4).map((t) => Math.round(t * 100) / 100);
  const { svg, y, slot } = frame(width, height, ticks, (v) => String(v), points, label);
  const barW = Math.max(2, Math.min(28, slot * 0.66));
  points.forEach((p, i) => {
    let base = 0;
    const x = PAD.left + slot * i + (slot - barW) / 2;
    const parts = [];
    for (const se of series) {
      const v = p.values[se.key] || 0;
      if (v > 0) {
        parts.push(`${v} ${se.label.toLowerCase()}`);
        svg.append(s("rect", { class: ["bar", se.cls], x, y: y(base + v), width: barW, height: Math.max(0.5, y(base) - y(base + v)), rx: 2 }));
      }
      base += v;
    }
    // A full-height hit area so the tooltip is easy to find with a mouse.
    svg.append(
      s(
        "rect",
        { class: "hit", x: PAD.left + slot * i, y: PAD.top, width: slot, height: y(0) - PAD.top },
        s("title", {}, `${hhmm(p.t)} — ${parts.length ? parts.join(", ") : `none${unit}`}`),
      ),
    );
  });
  return svg;
}

/** Lines with dots; a null value leaves a gap. */
export function lineChart({ points, series, width, height = 180, label, fmt = String }) {
  const all = points.flatMap((p) => series.map((se) => p.values[se.key])).filter((v) => v !== null && v !== undefined);
  const ticks = niceTicks(Math.max(...all, 1), 4);
  const { svg, y, slot } = frame(width, height, ticks, fmt, points, label);
  const x = (i) => PAD.left + slot * (i + 0.5);
  for (const se of series) {
    let d = "";
    let pen = false;
    points.forEach((p, i) => {
      const v = p.values[se.key];
      if (v === null || v === undefined) {
        pen = false;
        return;
      }
      d += `${pen ? "L" : "M"}${x(i).toFixed(1)},${y(v).toFixed(1)} `;
      pen = true;
    });
    if (d) svg.append(s("path", { class: ["line", se.cls], d }));
    points.forEach((p, i) => {
      const v = p.values[se.key];
      if (v !== null && v !== undefined) {
        svg.append(s("circle", { class: ["point", se.cls], cx: x(i), cy: y(v), r: 3 }, s("title", {}, `${hhmm(p.t)} ${se.label}: ${fmt(v)}`)));
      }
    });
  }
  return svg;
}
