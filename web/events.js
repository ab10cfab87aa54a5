// One /ws/events connection for the whole page: job state changes, workers joining and leaving, and
// telemetry samples, handed to whichever page listens. While it is down, pages fall back to polling.

import { LiveSocket } from "./api.js";

const listeners = new Map(); // type ("job", "worker", "telemetry", "status") → Set of functions
let socket = null;
let live = false;

function emit(type, message) {
  for (const listener of listeners.get(type) || []) listener(message);
}

export function startEvents() {
  if (socket) return;
  socket = new LiveSocket("/ws/events", {
    onMessage: (message) => emit(message.type, message),
    onStatus: (status) => {
      live = status === "open";
      emit("status", { live });
    },
  });
}

export function stopEvents() {
  socket?.close();
  socket = null;
  live = false;
  emit("status", { live });
}

/** Whether events arrive now (else pages poll). */
export function eventsLive() {
  return live;
}

/** Listen for one type of event; returns the function that stops listening. */
export function onEvent(type, listener) {
  if (!listeners.has(type)) listeners.set(type, new Set());
  listeners.get(type).add(listener);
  return () => listeners.get(type).delete(listener);
}

/** Run `poll` every `ms` while events are not live; returns a stop function. */
export function pollUnlessLive(ms, poll) {
  const timer = setInterval(() => {
    if (!live && !document.hidden) poll();
  }, ms);
  return () => clearInterval(timer);
}
