// Small SVG charts drawn by hand: time series with axes and a hover read-out, and sparklines.
// Colours come from CSS classes (c0..c7, st-<state>) so the theme switch recolours them for free.

import { h, hhmm, hhmmss } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";

function s(tag, attrs = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) element.setAttribute(key, value);
  }
  element.append(...children);
  return element;
}

/** A round step at least `raw`: 1, 2, 2.5 or 5 times a power of ten (no 2.5 for whole numbers). */
function niceStep(raw, integer) {
  const power = 10 ** Math.floor(Math.log10(raw));
  const steps = integer ? [1, 2, 5, 10] : [1, 2, 2.5, 5, 10];
  return Math.max(steps.map((m) => m * power).find((step) => step >= raw), integer ? 1 : 0);
}

/** Index of the point whose time is nearest `t` (points sorted by time). */
function nearest(points, t) {
  let low = 0;
  let high = points.length - 1;
  while (high - low > 1) {
    const mid = (low + high) >> 1;
    if (points[mid][0] < t) low = mid;
    else high = mid;
  }
  return Math.abs(points[low][0] - t) <= Math.abs(points[high][0] - t) ? low : high;
}

/** Runs of indices into `points` ([t, bottom, top]) with values, broken where samples are more than
 * `gap` ms apart (a worker that stopped reporting shows as a hole, not a straight line). */
function runs(points, gap) {
  const found = [];
  let run = [];
  points.forEach(([t, , v], i) => {
    if (v === null || (i > 0 && t - points[i - 1][0] > gap)) {
      if (run.length) found.push(run);
      run = [];
    }
    if (v !== null) run.push(i);
  });
  if (run.length) found.push(run);
  return found;
}

const MARGIN = { left: 44, right: 10, top: 8, bottom: 20 };
let charts = 0;

/**
 * A chart of series over time. `update({series, from, to, note})` redraws it (`note`: what an empty
 * chart says); each series is
 * `{name, cls, points: [[ms, value|null], ...]}`, oldest first. Options: `stacked` (areas summed,
 * series sharing their times), `max` (a fixed top, e.g. 100 for percentages), `format` (axis and
 * read-out labels), `integer` (whole-number ticks, for counts), `gap` (ms between samples past which the line breaks),
 * `height`.
 */
export class TimeChart {
  constructor({ title, stacked = false, max = null, integer = false, format = (v) => `${v}`, gap = 20000, height = 150, testid }) {
    Object.assign(this, { stacked, max, integer, format, gap, height });
    this.clip = `chart-clip-${(charts += 1)}`;
    this.data = { series: [], from: Date.now() - 3600e3, to: Date.now() };
    this.plot = h("div", { class: "plot" });
    this.tip = h("div", { class: "tip", hidden: true });
    this.legend = h("div", { class: "legend" });
    this.element = h(
      "section",
      { class: `card chart ${stacked ? "stacked" : ""}`, testid },
      h("header", {}, h("h3", {}, title)),
      this.plot,
      this.legend,
      this.tip,
    );
    this.plot.addEventListener("pointermove", (event) => this.hover(event));
    this.plot.addEventListener("pointerleave", () => this.unhover());
    this.observer = new ResizeObserver(() => this.draw());
    this.observer.observe(this.plot);
  }

  update(data) {
    this.data = data;
    this.draw();
    this.drawLegend();
  }

  destroy() {
    this.observer.disconnect();
  }

  /** Each series as [t, bottom, top] values: stacked ones on the sum of those before. */
  layers() {
    const below = new Map();
    return this.data.series.map((series) => ({
      ...series,
      points: series.points.map(([t, v]) => {
        if (v === null || v === undefined) return [t, null, null];
        const base = this.stacked ? below.get(t) || 0 : 0;
        if (this.stacked) below.set(t, base + v);
        return [t, base, base + v];
      }),
    }));
  }

  draw() {
    const width = this.plot.clientWidth;
    if (!width) return;
    const { from, to } = this.data;
    const layers = this.layers();
    const highest = Math.max(0, ...layers.flatMap((layer) => layer.points.filter((p) => p[0] >= from).map((p) => p[2] ?? 0)));
    const step = niceStep(Math.max(this.max ?? highest, 1) / 4, this.integer);
    const top = this.max ?? Math.max(step * Math.ceil(highest / step), step);
    const inner = { w: width - MARGIN.left - MARGIN.right, h: this.height - MARGIN.top - MARGIN.bottom };
    const x = (t) => MARGIN.left + ((t - from) / (to - from)) * inner.w;
    const y = (v) => MARGIN.top + inner.h - (Math.min(v, top) / top) * inner.h;
    this.geometry = { x, y, from, to, inner, layers };

    const svg = s("svg", { width, height: this.height, viewBox: `0 0 ${width} ${this.height}`, role: "img" });
    const axis = s("g", { class: "axis" });
    for (let v = 0; v <= top + step / 1e6; v += step) {
      axis.append(
        s("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: y(v), y2: y(v), class: v ? "grid" : "base" }),
        s("text", { x: MARGIN.left - 6, y: y(v) + 3.5, "text-anchor": "end" }, this.format(v)),
      );
    }
    const minutes = [1, 2, 5, 10, 15, 30, 60, 120].find((m) => (to - from) / (m * 60e3) <= Math.max(inner.w / 90, 2)) || 240;
    const tick = minutes * 60e3;
    for (let t = Math.ceil(from / tick) * tick; t <= to; t += tick) {
      axis.append(
        s("line", { x1: x(t), x2: x(t), y1: MARGIN.top + inner.h, y2: MARGIN.top + inner.h + 4, class: "base" }),
        s("text", { x: x(t), y: this.height - 5, "text-anchor": "middle" }, hhmm(t)),
      );
    }
    svg.append(axis);
    if (!layers.some((layer) => layer.points.length)) {
      const middle = MARGIN.top + inner.h / 2;
      svg.append(s("text", { x: MARGIN.left + inner.w / 2, y: middle, class: "nodata", "text-anchor": "middle" }, this.data.note || "No samples yet"));
    }

    // Samples older than the span shown are cut off at the axis, not drawn over its labels.
    const plot = s("g", { "clip-path": `url(#${this.clip})` });
    svg.append(s("clipPath", { id: this.clip }, s("rect", { x: MARGIN.left, y: 0, width: inner.w, height: this.height })), plot);
    const filled = this.stacked || layers.length === 1;
    layers.forEach((layer, i) => {
      const cls = layer.cls || `c${i % 8}`;
      const at = (j, k) => `${x(layer.points[j][0]).toFixed(1)},${y(layer.points[j][k]).toFixed(1)}`;
      for (const run of runs(layer.points, this.gap)) {
        const line = run.map((j, n) => `${n ? "L" : "M"}${at(j, 2)}`).join("");
        if (filled) {
          // The area closes along the layer below (the axis for the first), walking back.
          const floor = [...run].reverse().map((j) => `L${at(j, 1)}`).join("");
          plot.append(s("path", { d: `${line}${floor}Z`, class: `area ${cls}` }));
        }
        plot.append(s("path", { d: line, class: `line ${cls}` }));
      }
    });
    this.cursor = s("line", { class: "cursor", y1: MARGIN.top, y2: MARGIN.top + inner.h, visibility: "hidden" });
    svg.append(this.cursor);
    this.plot.replaceChildren(svg);
  }

  drawLegend() {
    this.legend.replaceChildren(
      ...this.data.series.map((series, i) => {
        const last = [...series.points].reverse().find((p) => p[1] !== null && p[1] !== undefined);
        return h(
          "span",
          { class: `item ${series.cls || `c${i % 8}`}` },
          h("i", { class: "swatch" }),
          series.name,
          last ? h("b", {}, this.format(last[1])) : null,
        );
      }),
    );
  }

  hover(event) {
    const geometry = this.geometry;
    if (!geometry || !this.data.series.length) return;
    const box = this.plot.getBoundingClientRect();
    const px = event.clientX - box.left;
    const t = geometry.from + ((px - MARGIN.left) / geometry.inner.w) * (geometry.to - geometry.from);
    const rows = [];
    let at = null;
    this.data.series.forEach((series, i) => {
      if (!series.points.length) return;
      const point = series.points[nearest(series.points, t)];
      if (Math.abs(point[0] - t) > this.gap || point[1] === null) return;
      at ??= point[0];
      rows.push(h("div", { class: `item ${series.cls || `c${i % 8}`}` }, h("i", { class: "swatch" }), series.name, h("b", {}, this.format(point[1]))));
    });
    if (at === null) return this.unhover();
    this.cursor.setAttribute("x1", geometry.x(at));
    this.cursor.setAttribute("x2", geometry.x(at));
    this.cursor.setAttribute("visibility", "visible");
    this.tip.replaceChildren(h("div", { class: "when" }, hhmmss(at)), ...rows);
    this.tip.hidden = false;
    const left = geometry.x(at) + 14;
    const flip = left + this.tip.offsetWidth > box.width;
    this.tip.style.left = `${flip ? geometry.x(at) - this.tip.offsetWidth - 14 : left}px`;
    this.tip.style.top = `${this.plot.offsetTop + 6}px`;
  }

  unhover() {
    this.tip.hidden = true;
    this.cursor?.setAttribute("visibility", "hidden");
  }
}

/** A tiny line of recent values (oldest first), scaled to `max`; nulls are skipped. */
export function sparkline(values, { max = 100, cls = "c0", testid } = {}) {
  const width = 100;
  const height = 24;
  const svg = s("svg", { class: `spark ${cls}`, viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none" });
  if (testid) svg.dataset.testid = testid;
  const points = values
    .map((v, i) => (v === null || v === undefined ? null : [(i / Math.max(values.length - 1, 1)) * width, height - 1 - (Math.min(v, max) / max) * (height - 2)]))
    .filter(Boolean);
  if (points.length < 2) return svg;
  const line = points.map(([px, py], i) => `${i ? "L" : "M"}${px.toFixed(2)},${py.toFixed(2)}`).join("");
  svg.append(
    s("path", { d: `${line}L${points.at(-1)[0]},${height}L${points[0][0]},${height}Z`, class: "area" }),
    s("path", { d: line, class: "line", "vector-effect": "non-scaling-stroke" }),
  );
  return svg;
}
