// The jobs page: newest first, filtered by state and by text, a page at a time, kept current by job
// events (or polling while they are down); and, for submitters, a form that queues a command.

import { api, V1 } from "./api.js";
import { onEvent, pollUnlessLive } from "./events.js";
import { STATES, badge, empty, h, jobDuration, queueName, shellJoin, toast, when } from "./dom.js";

const LIMIT = 50;

export function mountJobs(root, { session, query }) {
  const view = {
    state: STATES.includes(query.get("state")) ? query.get("state") : "",
    offset: Math.max(Number.parseInt(query.get("offset"), 10) || 0, 0),
    text: "",
    jobs: [],
    next: null,
    loaded: false,
  };
  const chips = h("div", { class: "chips", testid: "state-filter", role: "group" });
  const filter = h("input", {
    type: "search",
    class: "filter",
    placeholder: "Filter rows…",
    testid: "text-filter",
    "aria-label": "Filter the rows shown",
    oninput: () => {
      view.text = filter.value.trim().toLowerCase();
      renderRows();
    },
  });
  const error = h("div", { class: "banner error", testid: "load-error", hidden: true });
  const tbody = h("tbody");
  const info = h("span", { class: "faint", testid: "page-info" });
  const prev = h("button", { class: "btn", testid: "prev-page", onclick: () => go(Math.max(view.offset - LIMIT, 0)) }, "‹ Newer");
  const next = h("button", { class: "btn", testid: "next-page", onclick: () => go(view.next) }, "Older ›");
  const canSubmit = session.role === "submitter" || session.role === "admin";

  root.append(
    h("div", { class: "page-head" }, h("h1", {}, "Jobs"), chips, h("span", { class: "spacer" }), filter),
    canSubmit ? submitForm(added) : null,
    error,
    h(
      "div",
      { class: "card table-wrap" },
      h(
        "table",
        { class: "table jobs", testid: "jobs-table" },
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ["ID", "Name / command", "State", "Exit", "Queue", "Worker", "Try", "Created", "Duration"].map((title) => h("th", {}, title)),
          ),
        ),
        tbody,
      ),
    ),
    h("div", { class: "pager" }, info, h("span", { class: "spacer" }), prev, next),
  );

  function renderChips() {
    chips.replaceChildren(
      ...["", ...STATES].map((state) =>
        h(
          "button",
          {
            class: `chip ${state ? `st-${state}` : ""}`,
            testid: "state-chip",
            dataset: { state: state || "all" },
            "aria-pressed": String(view.state === state),
            onclick: () => {
              view.state = state;
              go(0);
            },
          },
          state ? h("i", { class: "dot" }) : null,
          state ? state.replace("_", " ") : "all",
        ),
      ),
    );
  }

  function matches(job) {
    if (!view.text) return true;
    const haystack = [job.id, job.name, shellJoin(job.command), job.worker, job.queue, job.state].join(" ").toLowerCase();
    return haystack.includes(view.text);
  }

  function row(job) {
    const workers = job.parts?.length ? job.parts.map((part) => part.worker) : job.worker ? [job.worker] : [];
    const command = shellJoin(job.command);
    return h(
      "tr",
      {
        testid: "job-row",
        dataset: { id: job.id, state: job.state },
        onclick: (event) => {
          // A click that ends a text selection (copying an id) is not a navigation.
          if (event.target.closest("a") || String(window.getSelection())) return;
          location.hash = `#/jobs/${job.id}`;
        },
      },
      h("td", { class: "mono id" }, h("a", { href: `#/jobs/${job.id}` }, job.id)),
      h(
        "td",
        { class: "what" },
        job.name ? h("span", { class: "name" }, job.name) : null,
        h("code", { class: "cmd", title: command }, command),
      ),
      h("td", {}, badge(job.state)),
      h("td", { class: `num mono ${job.exit_code ? "bad" : ""}`, testid: "exit-code" }, job.exit_code === null || job.exit_code === undefined ? "—" : String(job.exit_code)),
      h("td", { class: "mono small", title: job.queue }, queueName(job.queue)),
      h("td", { class: "mono small" }, workers[0] || h("span", { class: "faint" }, "—"), workers.length > 1 ? h("span", { class: "faint" }, ` +${workers.length - 1}`) : null),
      h("td", { class: `num ${job.attempt > 1 ? "warn" : ""}` }, String(job.attempt || "—")),
      h("td", { class: "small" }, when(job.created_at)),
      h("td", { class: "num" }, jobDuration(job)),
    );
  }

  function renderRows() {
    const shown = view.jobs.filter(matches);
    if (!view.loaded) {
      tbody.replaceChildren();
    } else if (!shown.length) {
      const title = view.jobs.length ? "No job on this page matches the filter" : view.state ? `No ${view.state.replace("_", " ")} jobs` : "No jobs yet";
      const hint = view.jobs.length || view.state ? null : "Submit one above, or: gpulayer submit -- echo hello";
      tbody.replaceChildren(h("tr", { class: "empty-row" }, h("td", { colspan: 9 }, empty(title, hint))));
    } else {
      tbody.replaceChildren(...shown.map(row));
    }
    const last = view.offset + view.jobs.length;
    info.textContent = view.jobs.length ? `${view.offset + 1}–${last}${view.next === null ? "" : "+"}` : "";
    prev.disabled = view.offset === 0;
    next.disabled = view.next === null;
  }

  function go(offset) {
    view.offset = offset;
    const params = new URLSearchParams();
    if (view.state) params.set("state", view.state);
    if (offset) params.set("offset", offset);
    // The address keeps the filter for a reload, without remounting the page.
    history.replaceState(null, "", `#/jobs${params.size ? `?${params}` : ""}`);
    renderChips();
    load();
  }

  let loading = 0;
  async function load() {
    const ticket = ++loading;
    const params = new URLSearchParams({ limit: LIMIT, offset: view.offset });
    if (view.state) params.set("state", view.state);
    try {
      const data = await api(`${V1}/jobs?${params}`);
      if (ticket !== loading) return; // a newer load (another filter) answers instead
      Object.assign(view, { jobs: data.jobs, next: data.next_offset, loaded: true });
      error.hidden = true;
      renderRows();
    } catch (problem) {
      error.textContent = problem.message;
      error.hidden = false;
    }
  }

  /** A job the page should show or update: fetched (a few at once) and put in place. */
  const pending = new Set();
  let flushing = null;
  function refetch(id) {
    pending.add(id);
    flushing ??= setTimeout(async () => {
      const ids = [...pending];
      pending.clear();
      flushing = null;
      const found = await Promise.all(ids.map((one) => api(`${V1}/jobs/${one}`).catch(() => null)));
      found.filter(Boolean).forEach(place);
      renderRows();
    }, 250);
  }

  function place(job) {
    const at = view.jobs.findIndex((known) => known.id === job.id);
    if (at >= 0) {
      view.jobs[at] = job;
    } else if (view.offset === 0 && (!view.state || view.state === job.state)) {
      view.jobs.unshift(job);
      view.jobs.sort((a, b) => b.created_at.localeCompare(a.created_at));
      if (view.jobs.length > LIMIT) {
        view.jobs.length = LIMIT;
        view.next ??= LIMIT;
      }
    }
  }

  function added(job) {
    place(job);
    renderRows();
  }

  const stops = [
    onEvent("job", ({ id, state }) => {
      const known = view.jobs.find((job) => job.id === id);
      if (known) {
        // The badge changes at once; the rest of the record (worker, times) follows.
        known.state = state;
        renderRows();
        refetch(id);
      } else if (!id.includes("-") && view.offset === 0 && (!view.state || view.state === state)) {
        refetch(id);
      }
    }),
    onEvent("status", ({ live }) => live && load()),
    pollUnlessLive(3000, load),
  ];
  renderChips();
  renderRows();
  load();
  document.title = "Jobs · GPUlayer";
  return () => stops.forEach((stop) => stop());
}

/** Queue a command with a name, GPUs, CPU slots and a timeout; `added(job)` on success. */
function submitForm(added) {
  const field = (label, input, cls = "") => h("label", { class: `field ${cls}` }, h("span", {}, label), input);
  const command = h("input", {
    name: "command",
    class: "mono",
    required: true,
    placeholder: "python train.py --epochs 3",
    autocomplete: "off",
    spellcheck: "false",
    testid: "submit-command",
  });
  const name = h("input", { name: "name", placeholder: "optional", autocomplete: "off", testid: "submit-name" });
  const gpus = h("input", { name: "gpus", type: "number", min: 0, max: 64, placeholder: "0", testid: "submit-gpus" });
  const cpus = h("input", { name: "cpus", type: "number", min: 0, placeholder: "1", testid: "submit-cpus" });
  const timeout = h("input", { name: "timeout", type: "number", min: 1, placeholder: "none", testid: "submit-timeout" });
  const button = h("button", { class: "btn primary", type: "submit", testid: "submit-button" }, "Submit");
  const error = h("p", { class: "form-error", testid: "submit-error", hidden: true });

  async function submit(event) {
    event.preventDefault();
    const body = { command: command.value.trim(), requirements: {} };
    if (name.value.trim()) body.name = name.value.trim();
    if (gpus.value) body.requirements.gpus = Number(gpus.value);
    if (cpus.value) body.requirements.cpus = Number(cpus.value);
    if (timeout.value) body.timeout = Number(timeout.value);
    button.disabled = true;
    error.hidden = true;
    try {
      const { id } = await api(`${V1}/jobs`, { method: "POST", body });
      toast(`Job ${id} queued`, "ok");
      added(await api(`${V1}/jobs/${id}`));
      command.select();
    } catch (problem) {
      error.textContent = problem.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
  }

  return h(
    "form",
    { class: "card submit", testid: "submit-form", onsubmit: submit },
    field("Command", command, "grow"),
    field("Name", name),
    field("GPUs", gpus, "narrow"),
    field("CPUs", cpus, "narrow"),
    field("Timeout (s)", timeout, "narrow"),
    button,
    error,
  );
}
