// Building elements, formatting values, and the few widgets every page shares (badges, toasts).
// The page's CSP forbids inline styles and handlers, so everything is set through the DOM.

/** An element: h("td", {class: "mono", title: "x", onclick: fn}, "text", child, [more]). */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      element.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      element.className = value;
    } else if (key === "testid") {
      element.dataset.testid = value;
    } else if (key === "dataset") {
      Object.assign(element.dataset, value);
    } else if (typeof value === "boolean" || key === "value") {
      element[key] = value;
    } else {
      element.setAttribute(key, value);
    }
  }
  element.append(...children.flat(Infinity).filter((child) => child !== null && child !== undefined && child !== false));
  return element;
}

export const ENDED = new Set(["succeeded", "failed", "cancelled", "timed_out"]);
export const STATES = ["queued", "scheduled", "running", "succeeded", "failed", "cancelled", "timed_out"];

/** A coloured state badge; running ones carry a pulsing dot. */
// Runs `action` once, `ms` after the first of a burst of calls: many events, one redraw.
// `.cancel()` drops a pending run (a page that is left).
export function debounced(action, ms) {
  let timer = null;
  const call = () => {
    timer ??= setTimeout(() => {
      timer = null;
      action();
    }, ms);
  };
  call.cancel = () => clearTimeout(timer);
  return call;
}

export function badge(state, testid = "state") {
  return h("span", { class: `badge st-${state}`, testid }, h("i", { class: "dot" }), state.replace("_", " "));
}

/** An argv as one shell line, quoting only the arguments that need it. */
export function shellJoin(args) {
  return args
    .map((arg) => (/^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`))
    .join(" ");
}

const pad = (n) => String(n).padStart(2, "0");

/** Local wall-clock time: "2025-11-29 14:03:07". */
export function clock(value) {
  if (!value) return "";
  const d = new Date(value);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function hhmm(ms) {
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

export function hhmmss(ms) {
  const d = new Date(ms);
  return `${hhmm(ms)}:${pad(d.getSeconds())}`;
}

/** Seconds as "14ms", "2.4s", "12s", "3m 04s", "2h 05m", "3d 4h". */
/** A span of seconds, short: "850ms", "4.2s", "3m 05s", "2h 07m". */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "";
  if (seconds < 1) return `${Math.max(Math.round(seconds * 1000), 0)}ms`;
  if (seconds < 10) return `${seconds.toFixed(1)}s`;
  if (seconds < 60) return `${Math.round(seconds)}s`;
  const m = Math.floor(seconds / 60);
  if (m < 60) return `${m}m ${pad(Math.floor(seconds % 60))}s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours}h ${pad(m % 60)}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

/** How long ago: "now", "12s ago", "5m ago", "3h ago", else the date. */
export function ago(value) {
  if (!value) return "";
  const seconds = (Date.now() - new Date(value).getTime()) / 1000;
  if (seconds < 5) return "just now";
  if (seconds < 60) return `${Math.floor(seconds)}s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ago`;
  return clock(value).slice(0, 10);
}

/** A time shown relatively, with the exact local time on hover. */
export function when(value) {
  if (!value) return h("span", { class: "faint" }, "—");
  return h("time", { datetime: value, title: clock(value), dataset: { ago: "" } }, ago(value));
}

/** How long a job ran; one still running counts up (see refreshTimes). */
export function jobDuration(job) {
  if (!job.started_at) return h("span", { class: "faint" }, "—");
  if (!job.ended_at) {
    return h("span", { dataset: { since: job.started_at } }, duration((Date.now() - new Date(job.started_at)) / 1000));
  }
  return h("span", {}, duration((new Date(job.ended_at) - new Date(job.started_at)) / 1000));
}

/** Bytes in binary units, as GPU and memory sizes are usually quoted: "79.6 GiB". */
export function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
}

export function percent(value) {
  return value === null || value === undefined ? "—" : `${Math.round(value)}%`;
}

/** A queue's name without the installation's key prefix ("gpulayer:default" → "default"). */
export function queueName(name) {
  return name ? name.slice(name.lastIndexOf(":") + 1) : "";
}

/** A horizontal meter for a fraction 0..1; `level` colours it when high. */
export function meter(fraction, testid) {
  const bar = h("i");
  const clamped = Math.min(Math.max(fraction || 0, 0), 1);
  bar.style.width = `${(clamped * 100).toFixed(1)}%`;
  const level = clamped >= 0.9 ? "hot" : clamped >= 0.7 ? "warm" : "";
  return h("span", { class: `meter ${level}`, testid }, bar);
}

/** A short message in the corner; errors stay longer. */
export function toast(message, kind = "error") {
  const box = document.getElementById("toasts");
  const item = h("div", { class: `toast ${kind}`, testid: "toast", role: kind === "error" ? "alert" : "status" }, message);
  item.addEventListener("click", () => item.remove());
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
}

/** A placeholder shown where a list or chart has nothing yet. */
export function empty(title, hint) {
  return h("div", { class: "empty", testid: "empty" }, h("strong", {}, title), hint ? h("p", {}, hint) : null);
}

/** Requirements as one line, as `gpulayer status` words them. */
export function describeRequirements(req = {}) {
  const parts = [];
  const gpus = req.gpus || 0;
  if (gpus) {
    const kind = !req.accelerator || req.accelerator === "any" ? "GPU" : `${req.accelerator} GPU`;
    let text = `${gpus} ${kind}${gpus > 1 ? "s" : ""}`;
    if (req.gpu_memory) text += `, ${bytes(req.gpu_memory)}+ each`;
    if (req.gpu_name) text += `, named like '${req.gpu_name}'`;
    parts.push(text);
  } else {
    parts.push("CPU only");
  }
  const cpus = req.cpus ?? (gpus ? 0 : 1);
  if (cpus) parts.push(`${cpus} CPU slot${cpus > 1 ? "s" : ""}`);
  if (req.memory) parts.push(`${bytes(req.memory)} memory`);
  parts.push(...(req.frameworks || []));
  for (const [key, value] of Object.entries(req.labels || {})) parts.push(`${key}=${value}`);
  return parts.join(", ");
}

/** Keeps relative times and running durations current: the app calls this every second. */
export function refreshTimes(root) {
  for (const element of root.querySelectorAll("time[data-ago]")) {
    element.textContent = ago(element.getAttribute("datetime"));
  }
  for (const element of root.querySelectorAll("[data-since]")) {
    element.textContent = duration((Date.now() - new Date(element.dataset.since)) / 1000);
  }
}

const ICONS = {
  sun: "M12 7a5 5 0 1 0 0 10a5 5 0 0 0 0-10zM12 1v3M12 20v3M4.2 4.2l2.1 2.1M17.7 17.7l2.1 2.1M1 12h3M20 12h3M4.2 19.8l2.1-2.1M17.7 6.3l2.1-2.1",
  moon: "M21 12.8A9 9 0 1 1 11.2 3a7 7 0 0 0 9.8 9.8z",
  out: "M9 21H5a2 2 0 0 1-2-2V5a2 2 0 0 1 2-2h4M16 17l5-5-5-5M21 12H9",
  down: "M12 5v14M5 12l7 7 7-7",
};

/** A small stroked icon. */
export function icon(name) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("class", `icon icon-${name}`);
  svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
  path.setAttribute("d", ICONS[name]);
  svg.append(path);
  return svg;
}
