// The activity page: the last hour (or 15 or 5 minutes) of the installation (jobs by state, queue depths) and of each
// worker's machine (CPU, memory, GPU use, the processes its jobs run), redrawn as samples arrive.

import { TimeChart } from "./charts.js";
import { debounced, h, queueName } from "./dom.js";
import { ActivityFeed, HOUR, TelemetryFeed } from "./feeds.js";

/** The spans one may look back over; the choice is remembered. */
const SPANS = { "5m": 5 * 60e3, "15m": 15 * 60e3, "1h": HOUR };
const SPAN = "gpulayer.span";
const count = (v) => (v >= 10000 ? `${(v / 1000).toFixed(0)}k` : `${Math.round(v * 10) / 10}`);
const pct = (v) => `${Math.round(v)}%`;

export function mountActivity(root) {
  const charts = {
    active: new TimeChart({ title: "Jobs waiting and running", stacked: true, integer: true, format: count, testid: "chart-active" }),
    ended: new TimeChart({ title: "Ended jobs kept", integer: true, format: count, testid: "chart-ended" }),
    queues: new TimeChart({ title: "Queue depth", integer: true, format: count, testid: "chart-queues" }),
    cpu: new TimeChart({ title: "CPU use by worker", max: 100, format: pct, testid: "chart-cpu" }),
    memory: new TimeChart({ title: "Memory use by worker", max: 100, format: pct, testid: "chart-memory" }),
    gpu: new TimeChart({ title: "GPU use by worker (mean of its GPUs)", max: 100, format: pct, testid: "chart-gpu" }),
    tasks: new TimeChart({ title: "Task processes by worker", integer: true, format: count, testid: "chart-tasks" }),
  };
  const notice = h("div", { class: "banner", testid: "activity-notice", hidden: true });
  let span = SPANS[localStorage.getItem(SPAN)] ? localStorage.getItem(SPAN) : "1h";
  const spans = h("div", { class: "segmented", testid: "span", role: "group", "aria-label": "Time span" });
  const showSpans = () =>
    spans.replaceChildren(
      ...Object.keys(SPANS).map((name) =>
        h(
          "button",
          {
            "aria-pressed": String(name === span),
            onclick: () => {
              span = name;
              localStorage.setItem(SPAN, name);
              showSpans();
              render();
            },
          },
          name,
        ),
      ),
    );
  showSpans();
  root.append(
    h("div", { class: "page-head" }, h("h1", {}, "Activity"), h("span", { class: "spacer" }), h("span", { class: "faint" }, "last"), spans),
    notice,
    h("div", { class: "charts" }, Object.values(charts).map((chart) => chart.element)),
  );
  document.title = "Activity · GPUlayer";

  const schedule = debounced(() => render(), 200);
  const activity = new ActivityFeed(schedule);
  const telemetry = new TelemetryFeed(schedule);

  function render() {
    const missing = [activity, telemetry].filter((feed) => feed.state === "missing").map((feed) => `/api/v1/${feed.path}`);
    const failed = [activity, telemetry].filter((feed) => feed.state === "error").map((feed) => feed.error);
    notice.hidden = !missing.length && !failed.length;
    notice.textContent = missing.length ? `This server does not report ${missing.join(" or ")}; those charts stay empty.` : failed.join("; ");

    const newest = Math.max(activity.samples.at(-1)?.time ?? 0, ...Object.values(telemetry.workers).map((list) => list.at(-1)?.time ?? 0));
    const to = Math.max(Date.now(), newest);
    const from = to - SPANS[span];
    const samples = activity.samples;
    const states = (names) => names.map((state) => ({ name: state.replace("_", " "), cls: `st-${state}`, points: samples.map((s) => [s.time, s.jobs[state] ?? 0]) }));
    for (const chart of [charts.active, charts.ended, charts.queues]) chart.gap = activity.gap;
    charts.active.update({ from, to, series: states(["queued", "scheduled", "running"]) });
    charts.ended.update({ from, to, series: states(["succeeded", "failed", "cancelled", "timed_out"]) });

    const queues = [...new Set(samples.flatMap((s) => Object.keys(s.queues)))].sort();
    const depth = queues.map((queue) => ({ name: queueName(queue), points: samples.map((s) => [s.time, s.queues[queue] ?? 0]) }));
    if (samples.some((s) => s.gangs_waiting)) depth.push({ name: "gangs waiting", cls: "c7", points: samples.map((s) => [s.time, s.gangs_waiting]) });
    charts.queues.update({ from, to, series: depth, note: samples.length ? "No queues" : null });

    const names = Object.keys(telemetry.workers).sort();
    const perWorker = (value, only = () => true) =>
      names.filter((name) => only(telemetry.workers[name])).map((name) => ({ name, points: telemetry.workers[name].map((s) => [s.time, value(s)]) }));
    for (const chart of [charts.cpu, charts.memory, charts.gpu, charts.tasks]) chart.gap = telemetry.gap;
    charts.cpu.update({ from, to, series: perWorker((s) => s.cpu_percent) });
    charts.memory.update({ from, to, series: perWorker((s) => (s.memory_total ? (100 * s.memory_used) / s.memory_total : null)) });
    const gpuUse = (s) => {
      const known = s.gpus.filter((g) => g.utilization !== null);
      return known.length ? known.reduce((sum, g) => sum + g.utilization, 0) / known.length : null;
    };
    const hasGpus = (list) => list.some((s) => s.gpus.length);
    charts.gpu.update({ from, to, series: perWorker(gpuUse, hasGpus), note: names.length ? "No worker has GPUs" : null });
    // A worker older than the count sends none: it draws no line rather than a false zero.
    charts.tasks.update({ from, to, series: perWorker((s) => s.task_processes ?? null) });
  }

  // The time axis moves on even when no sample comes.
  const timer = setInterval(() => !document.hidden && render(), 5000);
  return () => {
    clearInterval(timer);
    schedule.cancel();
    activity.stop();
    telemetry.stop();
    Object.values(charts).forEach((chart) => chart.destroy());
  };
}
