// One job: what it is and where it stands, why it waits, where its gang runs, its attempts, its
// outputs, and its live log. Kept current by job events (or polling while they are down).

import { api, V1 } from "./api.js";
import { onEvent, pollUnlessLive } from "./events.js";
import { ENDED, badge, bytes, clock, describeRequirements, empty, h, jobDuration, queueName, shellJoin, toast, when } from "./dom.js";
import { LogViewer } from "./logs.js";

export function mountJob(root, { session, id }) {
  const canCancel = session.role === "submitter" || session.role === "admin";
  const summary = h("div", { class: "job-summary" });
  const sections = h("div", { class: "job-sections" });
  const error = h("div", { class: "banner error", testid: "load-error", hidden: true });
  // Its log is shown, and its socket opened, once the job is known to exist.
  const logs = new LogViewer(id, { onEnd: () => load() });
  let job = null;
  let cancelling = false;

  root.append(
    h("nav", { class: "crumbs" }, h("a", { href: "#/jobs" }, "Jobs"), h("span", { class: "sep" }, "/"), h("span", { class: "mono" }, id)),
    error,
    summary,
    sections,
  );
  document.title = `Job ${id} · GPUlayer`;

  async function load() {
    try {
      job = await api(`${V1}/jobs/${id}`);
      error.hidden = true;
    } catch (problem) {
      if (problem.status === 404) {
        gone(problem.message);
        return;
      }
      error.textContent = problem.message;
      error.hidden = false;
      return;
    }
    if (!logs.element.isConnected) {
      summary.after(logs.element);
      logs.connect();
    }
    const distributed = job.spec.distributed;
    if (distributed) logs.setRanks(distributed.nodes * (distributed.procs_per_node || 1));
    render();
  }

  /** No such job (never submitted, or past its retention): the page says so, and stops asking. */
  function gone(message) {
    stops.forEach((stop) => stop());
    logs.close();
    error.hidden = true;
    summary.replaceChildren(h("div", { class: "card", testid: "no-such-job" }, empty(`No such job: ${id}`, message)));
    sections.replaceChildren();
    logs.element.remove();
    document.title = "No such job · GPUlayer";
  }

  async function cancel(button) {
    cancelling = true;
    button.disabled = true;
    button.textContent = "Cancelling…";
    try {
      const answer = await api(`${V1}/jobs/${id}/cancel`, { method: "POST" });
      toast(answer.state === "cancelled" ? `Job ${id} cancelled` : `Cancelling job ${id}…`, "ok");
    } catch (problem) {
      toast(problem.message);
      cancelling = false;
    }
    load();
  }

  function render() {
    const ended = ENDED.has(job.state);
    const actions = h("div", { class: "actions" });
    if (ended && job.outputs?.files) {
      actions.append(
        h(
          "a",
          { class: "btn", href: `${V1}/jobs/${id}/outputs`, download: `${id}-outputs.tar.gz`, testid: "outputs-link" },
          `Outputs · ${job.outputs.files} file${job.outputs.files === 1 ? "" : "s"}, ${bytes(job.outputs.bytes)}`,
        ),
      );
    }
    if (canCancel && !ended) {
      const button = h("button", { class: "btn danger", testid: "cancel", disabled: cancelling }, cancelling ? "Cancelling…" : "Cancel");
      button.addEventListener("click", () => cancel(button));
      actions.append(button);
    }
    const title = job.name || job.command[0] || job.id;
    summary.replaceChildren(
      h(
        "div",
        { class: "card job-head", testid: "job-head", dataset: { state: job.state } },
        h("div", { class: "title-row" }, h("h1", { testid: "job-title" }, title), badge(job.state, "job-state"), h("span", { class: "spacer" }), actions),
        h("pre", { class: "command", testid: "job-command" }, shellJoin(job.command)),
        job.reason ? h("p", { class: `reason ${job.state === "failed" || job.state === "timed_out" ? "bad" : ""}`, testid: "job-reason" }, job.reason) : null,
        facts(job),
      ),
    );
    sections.replaceChildren(...[reasons(job), parts(job), attempts(job), spec(job)].filter(Boolean));
  }

  const stops = [
    onEvent("job", (event) => event.id === id && load()),
    onEvent("status", ({ live }) => live && load()),
    pollUnlessLive(2000, () => job && !ENDED.has(job.state) && load()),
  ];
  load();
  return () => {
    stops.forEach((stop) => stop());
    logs.close();
  };
}

function facts(job) {
  const workers = job.parts?.length ? [...new Set(job.parts.map((part) => part.worker))] : job.worker ? [job.worker] : [];
  const item = (label, value, cls = "") => h("div", { class: `fact ${cls}` }, h("dt", {}, label), h("dd", {}, value ?? h("span", { class: "faint" }, "—")));
  const exact = (value) => (value ? h("span", { title: clock(value) }, clock(value).slice(11), " ", h("span", { class: "faint" }, "(", when(value), ")")) : null);
  return h(
    "dl",
    { class: "facts" },
    item("ID", h("span", { class: "mono", testid: "job-id" }, job.id)),
    item("Queue", h("span", { class: "mono", title: job.queue }, queueName(job.queue))),
    item(workers.length > 1 ? "Workers" : "Worker", workers.length ? h("span", { class: "mono", testid: "job-worker" }, workers.join(", ")) : null),
    item("GPUs", job.gpus?.length ? job.gpus.join(", ") : null),
    item("Attempt", String(job.attempt || "—")),
    item("Exit code", job.exit_code === null ? null : h("span", { class: job.exit_code ? "bad mono" : "mono" }, String(job.exit_code))),
    item("Created", exact(job.created_at)),
    item("Started", exact(job.started_at)),
    item("Ended", exact(job.ended_at)),
    item("Duration", jobDuration(job)),
    job.retry_at ? item("Retry at", exact(job.retry_at)) : null,
    ...usage(job.usage, item),
  );
}

/** What the job's latest ended attempt used, as its worker measured it (unknown peaks are left out). */
function usage(used, item) {
  if (!used) return [];
  return [
    item("CPU time", h("span", { class: "mono", testid: "job-cpu" }, `${used.cpu_seconds.toFixed(2)} s`)),
    used.peak_memory === null ? null : item("Peak memory", h("span", { class: "mono", testid: "job-peak-memory" }, bytes(used.peak_memory))),
    used.peak_gpu_memory === null ? null : item("Peak GPU memory", h("span", { class: "mono", testid: "job-peak-gpu-memory" }, bytes(used.peak_gpu_memory))),
  ];
}

function table(headings, rows, testid) {
  return h("table", { class: "table compact", testid }, h("thead", {}, h("tr", {}, headings.map((title) => h("th", {}, title)))), h("tbody", {}, rows));
}

function section(title, body, testid) {
  return h("section", { class: "card", testid }, h("header", {}, h("h2", {}, title)), body);
}

/** Why each worker is not running a queued job, and what the autoscaler decided for it. */
function reasons(job) {
  if (job.state !== "queued") return null;
  const rows = (job.reasons || []).map((r) =>
    h("tr", { testid: "reason-row" }, h("td", { class: "mono" }, r.worker || h("span", { class: "faint" }, "—")), h("td", {}, r.reason)),
  );
  const body = rows.length ? table(["Worker", "Why not here"], rows) : empty("Waiting for a free worker");
  // What the autoscaler decided for it (docs/capacity.md): a machine starting for it, or why none.
  const capacity = job.capacity ? h("p", { class: "capacity", testid: "capacity-decision" }, h("b", {}, "Autoscaler: "), job.capacity) : null;
  return section("Why it waits", h("div", {}, body, capacity), "placement-reasons");
}

function parts(job) {
  if (!job.parts?.length) return null;
  const perNode = job.spec.distributed?.procs_per_node || 1;
  const rows = job.parts.map((part) =>
    h(
      "tr",
      { testid: "part-row" },
      h("td", { class: "num" }, String(part.node)),
      h("td", { class: "mono" }, `${part.node * perNode}–${part.node * perNode + perNode - 1}`),
      h("td", { class: "mono" }, part.worker),
      h("td", { class: "mono" }, part.gpus.length ? part.gpus.join(", ") : "—"),
    ),
  );
  return section("Gang", table(["Node", "Ranks", "Worker", "GPUs"], rows), "gang-parts");
}

function attempts(job) {
  if (!job.attempts?.length) return null;
  const rows = job.attempts.map((a) =>
    h(
      "tr",
      { testid: "attempt-row" },
      h("td", { class: "num" }, String(a.attempt)),
      h("td", { class: "mono" }, a.worker || "—"),
      h("td", {}, h("span", { class: `badge st-${a.outcome}` }, h("i", { class: "dot" }), a.outcome.replace("_", " "))),
      h("td", { class: "num mono" }, a.exit_code === null ? "—" : String(a.exit_code)),
      h("td", {}, when(a.started_at)),
      h("td", { class: "num" }, jobDuration(a)),
      h("td", { class: "small" }, a.reason || ""),
    ),
  );
  return section("Attempts", table(["#", "Worker", "Outcome", "Exit", "Started", "Ran", "Reason"], rows), "attempts");
}

/** What the job asked for, from its spec (fields left at their defaults are not sent). */
function spec(job) {
  const s = job.spec;
  const line = (label, value) => (value ? h("div", { class: "fact" }, h("dt", {}, label), h("dd", {}, value)) : null);
  const d = s.distributed;
  return section(
    "Spec",
    h(
      "dl",
      { class: "facts" },
      line("Needs", describeRequirements(s.requirements)),
      d ? line("Gang", `${d.nodes} node${d.nodes > 1 ? "s" : ""} × ${d.procs_per_node || 1} rank${(d.procs_per_node || 1) > 1 ? "s" : ""}, ${d.launcher || "direct"}`) : null,
      line("Timeout", s.timeout ? `${s.timeout} s` : null),
      line("Priority", s.priority ? String(s.priority) : null),
      line("Retries", `${s.retries ?? 2} on ${s.retry_on || "lost"}`),
      line("Environment", s.env && Object.keys(s.env).length ? h("span", { class: "mono" }, Object.keys(s.env).join(" ")) : null),
      line("Outputs", s.outputs?.length ? h("span", { class: "mono" }, s.outputs.join(" ")) : null),
      line("Function", s.function ? h("span", { class: "mono" }, s.function.name) : null),
      job.outputs?.missing?.length ? line("Missing outputs", h("span", { class: "mono bad" }, job.outputs.missing.join(" "))) : null,
    ),
    "job-spec",
  );
}
