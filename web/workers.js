// The workers page: a card per connected worker with what it offers and holds, its machine's CPU and
// memory use, and each GPU's use from the latest telemetry sample, with the last hour as sparklines;
// below them, the machines the autoscaler started (docs/capacity.md), where it started any.

import { api, V1 } from "./api.js";
import { sparkline } from "./charts.js";
import { ago, bytes, clock, debounced, duration, empty, h, meter, percent, when } from "./dom.js";
import { onEvent } from "./events.js";
import { TelemetryFeed } from "./feeds.js";

/** Packages worth naming on a card (a worker reports every installed one). */
const FRAMEWORKS = ["torch", "torchvision", "jax", "jaxlib", "mlx", "cupy", "tensorflow", "onnxruntime", "onnxruntime-gpu", "tensorrt", "transformers", "numpy"];

export function mountWorkers(root) {
  let workers = null;
  let machines = [];
  const grid = h("div", { class: "workers", testid: "workers" });
  const started = h("div", { class: "machines" });
  const totals = h("div", { class: "totals", testid: "worker-totals" });
  const error = h("div", { class: "banner error", testid: "load-error", hidden: true });
  const notice = h("div", { class: "banner", testid: "telemetry-notice", hidden: true });
  root.append(h("div", { class: "page-head" }, h("h1", {}, "Workers"), totals), error, notice, grid, started);
  document.title = "Workers · GPUlayer";

  const schedule = debounced(() => render(), 150);
  const telemetry = new TelemetryFeed(schedule);

  async function load() {
    try {
      const [connected, provisioned] = await Promise.all([api(`${V1}/workers`), machinesOrNone()]);
      workers = connected.workers.sort((a, b) => a.name.localeCompare(b.name));
      machines = provisioned;
      error.hidden = true;
    } catch (problem) {
      error.textContent = problem.message;
      error.hidden = false;
    }
    render();
  }

  function render() {
    if (workers === null) return;
    notice.hidden = telemetry.state !== "missing" && telemetry.state !== "error";
    notice.textContent =
      telemetry.state === "missing"
        ? "This server does not report telemetry (no /api/v1/telemetry): CPU, memory and GPU use are not shown."
        : `Telemetry: ${telemetry.error}`;
    const slots = workers.reduce((sum, w) => sum + w.slots, 0);
    const used = workers.reduce((sum, w) => sum + w.cpus_used, 0);
    const gpus = workers.reduce((sum, w) => sum + w.gpus.length, 0);
    const busy = workers.reduce((sum, w) => sum + w.gpus_busy.length, 0);
    const running = workers.reduce((sum, w) => sum + w.running, 0);
    // replaceChildren writes a null as the text "null": GPUs are counted only where there are some.
    totals.replaceChildren(
      total(workers.length, workers.length === 1 ? "worker" : "workers"),
      total(running, "running"),
      total(`${used}/${slots}`, "CPU slots"),
      ...(gpus ? [total(`${busy}/${gpus}`, "GPUs busy")] : []),
    );
    started.replaceChildren(...(machines.length ? [machineTable(machines)] : []));
    if (!workers.length) {
      grid.replaceChildren(empty("No workers are connected", "Start one with: gpulayer worker start (or gpulayer up)"));
      return;
    }
    grid.replaceChildren(...workers.map((worker) => card(worker, telemetry.workers[worker.name] || [])));
  }

  const reloadSoon = debounced(() => load(), 1000);
  // Jobs starting and ending change what workers hold; there is no event for that, so poll too.
  const timer = setInterval(() => !document.hidden && load(), 5000);
  const stops = [onEvent("worker", load), onEvent("job", reloadSoon), onEvent("status", ({ live }) => live && load())];
  load();
  return () => {
    clearInterval(timer);
    reloadSoon.cancel();
    schedule.cancel();
    telemetry.stop();
    stops.forEach((stop) => stop());
  };
}

/** The machines the autoscaler started; none from a server that predates the route (404). */
async function machinesOrNone() {
  try {
    return (await api(`${V1}/machines`)).machines;
  } catch (problem) {
    if (problem.status === 404) return [];
    throw problem;
  }
}

function machineTable(machines) {
  const rows = machines.map((m) =>
    h(
      "tr",
      { testid: "machine-row", dataset: { name: m.name } },
      h("td", { class: "mono", testid: "machine-name" }, m.name),
      h("td", {}, h("span", { class: `pill m-${m.state}`, testid: "machine-state" }, m.state)),
      h("td", { class: "mono" }, m.kind),
      h("td", { class: "mono" }, m.provider),
      h("td", { class: "num", title: `started ${clock(m.created)}` }, duration(m.age)),
      h("td", { class: "num", testid: "machine-cost" }, m.cost === null ? h("span", { class: "faint", title: "its price is not known" }, "—") : `$${m.cost.toFixed(2)}`),
      h("td", { class: "small", testid: "machine-reason" }, m.reason || (m.wanted_by ? h("span", { class: "faint" }, `for ${m.wanted_by}`) : "")),
    ),
  );
  return h(
    "section",
    { class: "card", testid: "machines" },
    h("header", {}, h("h2", {}, "Started by the autoscaler"), h("span", { class: "faint small" }, "running, and ended in the last day")),
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "table compact" },
        h("thead", {}, h("tr", {}, ["Machine", "State", "Kind", "Provider", "Age", "Cost so far", "Reason"].map((title) => h("th", {}, title)))),
        h("tbody", {}, rows),
      ),
    ),
  );
}

function total(value, label) {
  return h("span", { class: "total" }, h("b", {}, String(value)), " ", label);
}

const HINTS = {
  Jobs: "Jobs it has taken and not yet ended",
  "CPU slots": "CPU slots its jobs hold, of those it offers",
  Reserved: "Memory its jobs reserved (--memory), of what it offers",
  CPU: "Its machine's CPU use and 1-minute load average over the last hour",
  Memory: "Its machine's memory in use over the last hour",
};

// How the worker contains its jobs, in a word or two ("cgroup v1"); the whole line is the tag's title.
function containment(line) {
  if (!line) return "containment unknown";
  return line.startsWith("none") ? "no containment" : line.split(" (")[0];
}

function stat(label, value, ...extra) {
  return h("div", { class: "stat", title: HINTS[label] }, h("span", { class: "label" }, label), h("span", { class: "value" }, value), ...extra);
}

function card(worker, history) {
  const sample = history.at(-1) ?? null;
  const stale = worker.last_heartbeat && Date.now() - new Date(worker.last_heartbeat) > worker.heartbeat * 3000;
  const memoryShare = (s) => (s.memory_total ? (s.memory_used / s.memory_total) * 100 : null);
  const known = Object.entries(worker.frameworks).filter(([name]) => FRAMEWORKS.includes(name) || name.startsWith("cupy-"));
  return h(
    "article",
    { class: "card worker", testid: "worker-card", dataset: { name: worker.name } },
    h(
      "header",
      {},
      h("h2", { class: "mono", testid: "worker-name" }, worker.name),
      h("span", { class: `pill w-${worker.state}` }, worker.state),
      stale ? h("span", { class: "pill warn", title: `last heartbeat ${clock(worker.last_heartbeat)}` }, "stale") : null,
      h("span", { class: "spacer" }),
      h("span", { class: "faint small mono", title: worker.address ? `reached at ${worker.address}` : "" }, `${worker.host} · pid ${worker.pid}`),
    ),
    h(
      "div",
      { class: "stats" },
      stat("Jobs", h("b", { testid: "worker-running" }, String(worker.running))),
      stat("CPU slots", `${worker.cpus_used} / ${worker.slots}`, meter(worker.slots ? worker.cpus_used / worker.slots : 0)),
      stat("Reserved", `${bytes(worker.memory_used)} / ${bytes(worker.memory)}`, meter(worker.memory ? worker.memory_used / worker.memory : 0)),
      stat(
        "CPU",
        h("span", {}, percent(sample?.cpu_percent), sample ? h("span", { class: "faint" }, ` · load ${sample.load.toFixed(2)}`) : null),
        sparkline(history.map((s) => s.cpu_percent), { cls: "c0", testid: "cpu-spark" }),
      ),
      stat(
        "Memory",
        h("span", {}, percent(sample ? memoryShare(sample) : null), sample ? h("span", { class: "faint" }, ` · ${bytes(sample.memory_used)}`) : null),
        sparkline(history.map(memoryShare), { cls: "c3" }),
      ),
    ),
    worker.gpus.length ? gpuTable(worker, history) : null,
    h(
      "footer",
      {},
      ...Object.entries(worker.labels).map(([key, value]) => h("span", { class: "tag mono" }, `${key}=${value}`)),
      ...known.map(([name, version]) => h("span", { class: "tag" }, `${name} ${version}`)),
      h("span", { class: "tag", testid: "containment", title: worker.containment ?? "" }, containment(worker.containment)),
      h("span", { class: "spacer" }),
      h("span", { class: "faint small" }, "up since ", when(worker.birth), " · heartbeat ", h("time", { datetime: worker.last_heartbeat, dataset: { ago: "" } }, ago(worker.last_heartbeat))),
    ),
  );
}

function gpuTable(worker, history) {
  const busy = new Set(worker.gpus_busy);
  const latest = history.at(-1)?.gpus ?? [];
  const rows = worker.gpus.map((gpu) => {
    const now = latest.find((g) => g.uuid === gpu.uuid);
    const past = history.map((s) => s.gpus.find((g) => g.uuid === gpu.uuid)?.utilization ?? null);
    const memoryUsed = now?.memory_used ?? null;
    return h(
      "tr",
      { testid: "gpu-row", dataset: { uuid: gpu.uuid } },
      h("td", { class: "gpu-name", title: gpu.uuid }, h("span", { class: "index mono" }, String(gpu.index)), gpu.name, gpu.simulated ? h("span", { class: "pill sim", testid: "simulated", title: "from GPULAYER_FAKE_GPUS: not a real device" }, "simulated") : null),
      h("td", {}, busy.has(gpu.uuid) ? h("span", { class: "pill busy" }, "busy") : h("span", { class: "pill free" }, "free")),
      h("td", {}, h("span", { class: "util" }, h("span", { class: "num" }, percent(now?.utilization)), sparkline(past, { cls: "c1" }))),
      h(
        "td",
        { class: "num" },
        memoryUsed === null ? h("span", { class: "faint" }, `— / ${bytes(gpu.memory_total)}`) : `${bytes(memoryUsed)} / ${bytes(gpu.memory_total)}`,
        memoryUsed === null ? null : meter(memoryUsed / gpu.memory_total),
      ),
      h("td", { class: "num" }, now?.temperature === null || now?.temperature === undefined ? h("span", { class: "faint" }, "—") : `${Math.round(now.temperature)}°C`),
    );
  });
  return h(
    "div",
    { class: "gpu-wrap" },
    h(
      "table",
      { class: "table compact gpus", testid: "gpu-table" },
      h("thead", {}, h("tr", {}, ["GPU", "", "Util · last hour", "Memory", "Temp"].map((title) => h("th", {}, title)))),
      h("tbody", {}, rows),
    ),
  );
}
