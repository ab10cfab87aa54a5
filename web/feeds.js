// The last hour of samples the workers and activity pages draw: fetched once, then extended by
// telemetry events, or by asking for the last minute every few seconds while events are down (activity
// samples have no event: they are always polled).

import { api, V1 } from "./api.js";
import { eventsLive, onEvent } from "./events.js";

export const HOUR = 3600e3;
const POLL = 5000;

/** Adds `samples` (oldest first) after those in `list` and drops what is over an hour older than the newest. */
function extend(list, samples) {
  for (const sample of samples) {
    if (!list.length || sample.time > list.at(-1).time) list.push(sample);
  }
  const cutoff = (list.at(-1)?.time ?? 0) - HOUR;
  while (list.length && list[0].time < cutoff) list.shift();
}

/** A feed's `state`: "loading", "ok", "missing" (the server has no such endpoint), "error" (see `error`). */
class Feed {
  constructor(path, onChange) {
    Object.assign(this, { path, onChange, state: "loading", error: "", interval: 5 });
    this.fetch(60);
  }

  async fetch(minutes) {
    try {
      const data = await api(`${V1}/${this.path}?minutes=${minutes}`);
      this.interval = data.interval || this.interval;
      this.take(data);
      this.state = "ok";
    } catch (problem) {
      if (this.state !== "ok") this.state = problem.status === 404 ? "missing" : "error";
      this.error = problem.message;
    }
    this.onChange();
  }

  /** Milliseconds past which two samples are not joined by a line. */
  get gap() {
    return this.interval * 3000;
  }

  stop() {
    clearInterval(this.timer);
    this.unlisten?.();
  }
}

/** Each worker's machine: CPU, load, memory and each GPU's use, oldest first. */
export class TelemetryFeed extends Feed {
  constructor(onChange) {
    super("telemetry", onChange);
    this.workers = {};
    this.unlisten = onEvent("telemetry", ({ worker, sample }) => {
      extend((this.workers[worker] ||= []), [sample]);
      this.onChange();
    });
    this.timer = setInterval(() => {
      if (this.state === "ok" && !eventsLive() && !document.hidden) this.fetch(1);
    }, POLL);
  }

  take(data) {
    for (const [worker, samples] of Object.entries(data.workers || {})) extend((this.workers[worker] ||= []), samples);
  }

  latest(worker) {
    return this.workers[worker]?.at(-1) ?? null;
  }
}

/** The installation: jobs by state, queue depths and gangs waiting, oldest first. */
export class ActivityFeed extends Feed {
  constructor(onChange) {
    super("activity", onChange);
    this.samples = [];
    this.timer = setInterval(() => {
      if (this.state === "ok" && !document.hidden) this.fetch(1);
    }, POLL);
  }

  take(data) {
    extend(this.samples, data.samples || []);
  }
}
