// Talking to the server: JSON requests with the session's CSRF token, and websockets that reconnect.

export const V1 = "/api/v1";

/** Sent on every change the session makes; kept in memory only, re-read from /session on load. */
let csrfToken = "";

export function setCsrf(token) {
  csrfToken = token || "";
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** A JSON request; throws ApiError with the server's one-line message. A 401 outside /login means
 * the session ended (token revoked or expired): the app hears of it and shows the login form. */
export async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRF-Token"] = csrfToken;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
    });
  } catch {
    throw new ApiError(0, "cannot reach the GPUlayer server");
  }
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const message = data?.error || `${response.status} ${response.statusText}`;
    if (response.status === 401 && path !== "/login") {
      window.dispatchEvent(new CustomEvent("gpulayer:unauthorized", { detail: message }));
    }
    throw new ApiError(response.status, message);
  }
  return data;
}

/** A same-origin websocket that reconnects with backoff (1 s doubling to 30 s) until closed.
 * `path` may be a function, so a reconnect can resume (e.g. after the last log line seen).
 * `onMessage` gets each parsed message and may return "done" to stop reconnecting. */
export class LiveSocket {
  constructor(path, { onMessage, onStatus = () => {} }) {
    this.path = path;
    this.onMessage = onMessage;
    this.onStatus = onStatus;
    this.delay = 1000;
    this.closed = false;
    this.timer = null;
    this.connect();
  }

  connect() {
    const path = typeof this.path === "function" ? this.path() : this.path;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}${path}`);
    this.ws = ws;
    let finished = false;
    ws.addEventListener("open", () => {
      this.delay = 1000;
      this.onStatus("open");
    });
    ws.addEventListener("message", (event) => {
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return;
      }
      if (this.onMessage(message) === "done") finished = true;
    });
    ws.addEventListener("close", (event) => {
      if (this.closed || this.ws !== ws) return;
      if (finished) {
        this.closed = true;
        this.onStatus("done");
        return;
      }
      // 1008: the token was revoked or expired, or the session ended; the next request says so.
      if (event.code === 1008) {
        this.closed = true;
        this.onStatus("refused");
        api(`${V1}/session`).catch(() => {});
        return;
      }
      this.onStatus("retrying");
      this.timer = setTimeout(() => this.connect(), this.delay);
      this.delay = Math.min(this.delay * 2, 30000);
    });
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    this.ws?.close();
  }
}
