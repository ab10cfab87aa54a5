// A job's live log: its stored lines then each new one over a websocket, resumed after the last line
// seen if the connection drops. It follows the end of the log unless the reader has scrolled up.

import { LiveSocket } from "./api.js";
import { h, hhmmss, icon } from "./dom.js";

/** Lines kept on the page; older ones are dropped (the full log stays on the server). */
const MAX_LINES = 20000;

export class LogViewer {
  constructor(jobId, { onEnd }) {
    Object.assign(this, { jobId, onEnd, rank: "", ranks: 0, follow: true });
    this.body = h("div", { class: "log-body", testid: "log", tabindex: 0, role: "log" });
    this.body.addEventListener("scroll", () => {
      const { scrollHeight, scrollTop, clientHeight } = this.body;
      this.follow = scrollHeight - scrollTop - clientHeight < 24;
      this.followButton.hidden = this.follow;
    });
    this.followButton = h("button", { class: "btn small follow", hidden: true, onclick: () => this.scrollToEnd() }, icon("down"), "Follow");
    this.rankSelect = h("select", { testid: "rank-select", hidden: true, "aria-label": "Rank", onchange: () => this.setRank(this.rankSelect.value) });
    this.counter = h("span", { class: "faint small", testid: "log-count" });
    this.status = h("span", { class: "log-status", testid: "log-status" });
    const wrap = h("button", { class: "btn small", "aria-pressed": "true" }, "Wrap");
    wrap.addEventListener("click", () => {
      const on = this.body.classList.toggle("nowrap");
      wrap.setAttribute("aria-pressed", String(!on));
    });
    this.element = h(
      "section",
      { class: "card logs", testid: "logs" },
      h("header", {}, h("h2", {}, "Logs"), this.rankSelect, this.counter, h("span", { class: "spacer" }), this.status, wrap),
      h("div", { class: "log-wrap" }, this.body, this.followButton),
    );
    this.reset();
  }

  reset() {
    this.lastId = "0-0";
    this.count = 0;
    this.lastAttempt = null;
    this.pending = [];
    this.body.replaceChildren(h("div", { class: "log-note" }, "No output yet."));
    this.counter.textContent = "";
  }

  /** A gang job's ranks become selectable once its spec is known. */
  setRanks(ranks) {
    if (ranks < 2 || this.ranks === ranks) return;
    this.ranks = ranks;
    const options = [h("option", { value: "" }, "all ranks")];
    for (let rank = 0; rank < ranks; rank += 1) options.push(h("option", { value: String(rank) }, `rank ${rank}`));
    this.rankSelect.replaceChildren(...options);
    this.rankSelect.hidden = false;
    this.body.classList.add("ranked");
  }

  setRank(rank) {
    this.rank = rank;
    this.socket?.close();
    this.reset();
    this.connect();
  }

  /** Called by the page, not at construction: it first checks that the job exists. */
  connect() {
    this.setStatus("connecting");
    this.socket = new LiveSocket(
      () => `/ws/jobs/${this.jobId}/logs?after=${this.lastId}${this.rank === "" ? "" : `&rank=${this.rank}`}`,
      {
        onMessage: (message) => {
          if ("end" in message) {
            this.flush();
            this.setStatus("ended", message.end);
            this.onEnd(message.end);
            return "done";
          }
          this.lastId = message.id;
          this.pending.push(message);
          this.flushTimer ??= setTimeout(() => this.flush(), 40);
          return undefined;
        },
        onStatus: (status) => {
          if (status === "open") this.setStatus("live");
          else if (status === "retrying") this.setStatus("reconnecting");
        },
      },
    );
  }

  setStatus(status, state) {
    this.status.className = `log-status ${status}`;
    this.status.textContent = status === "ended" ? `ended · ${state.replace("_", " ")}` : status;
    if (status === "ended" && !this.count) {
      this.body.replaceChildren(h("div", { class: "log-note" }, this.rank === "" ? "No output." : `No output from rank ${this.rank}.`));
    }
  }

  flush() {
    clearTimeout(this.flushTimer);
    this.flushTimer = null;
    if (!this.pending.length) return;
    const stick = this.follow;
    if (!this.count) this.body.replaceChildren(); // the "no output yet" note
    const lines = document.createDocumentFragment();
    for (const line of this.pending) {
      if (this.lastAttempt !== null && line.attempt !== this.lastAttempt) {
        lines.append(h("div", { class: "log-divider" }, `attempt ${line.attempt}`));
      }
      this.lastAttempt = line.attempt;
      lines.append(
        h(
          "div",
          { class: `line ${line.stream}`, testid: "log-line" },
          h("span", { class: "ts", title: line.time }, hhmmss(line.time)),
          this.ranks ? h("span", { class: "rk" }, line.rank === null ? "" : `r${line.rank}`) : null,
          h("span", { class: "tx" }, line.text),
        ),
      );
    }
    this.count += this.pending.length;
    this.pending = [];
    this.body.append(lines);
    while (this.body.childElementCount > MAX_LINES) this.body.firstElementChild.remove();
    this.counter.textContent = `${this.count.toLocaleString()} line${this.count === 1 ? "" : "s"}`;
    if (stick) this.scrollToEnd();
  }

  scrollToEnd() {
    this.body.scrollTop = this.body.scrollHeight;
    this.follow = true;
    this.followButton.hidden = true;
  }

  close() {
    clearTimeout(this.flushTimer);
    this.socket?.close();
  }
}
