// The dashboard's shell: the login form, the top bar, the theme, and the hash routes
// #/jobs, #/jobs/<id>, #/workers and #/activity. Each page mounts into <main> and returns its cleanup.

import { mountActivity } from "./activity.js";
import { V1, api, setCsrf } from "./api.js";
import { h, icon, refreshTimes } from "./dom.js";
import { onEvent, startEvents, stopEvents } from "./events.js";
import { mountJob } from "./job.js";
import { mountJobs } from "./jobs.js";
import { mountWorkers } from "./workers.js";

const root = document.getElementById("app");
const THEME = "gpulayer.theme";
const dark = matchMedia("(prefers-color-scheme: dark)");
let session = null;
let dispose = null;

/** The saved theme wins; without one the page follows the system (the CSS does, via color-scheme). */
function applyTheme() {
  const saved = localStorage.getItem(THEME);
  if (saved) document.documentElement.dataset.theme = saved;
  else delete document.documentElement.dataset.theme;
}

function toggleTheme() {
  const current = document.documentElement.dataset.theme || (dark.matches ? "dark" : "light");
  localStorage.setItem(THEME, current === "dark" ? "light" : "dark");
  applyTheme();
}

function leavePage() {
  dispose?.();
  dispose = null;
}

function showLogin(message = "") {
  leavePage();
  stopEvents();
  session = null;
  setCsrf("");
  const input = h("input", {
    type: "password",
    name: "token",
    class: "mono",
    placeholder: "glt_…",
    autocomplete: "current-password",
    required: true,
    testid: "token-input",
    "aria-label": "API token",
  });
  const error = h("p", { class: "form-error", testid: "login-error", role: "alert", hidden: !message }, message);
  const button = h("button", { class: "btn primary", type: "submit", testid: "login-button" }, "Log in");

  async function logIn(event) {
    event.preventDefault();
    button.disabled = true;
    try {
      const answer = await api("/login", { method: "POST", body: { token: input.value.trim() } });
      if (answer.role === "metrics") {
        await api("/logout", { method: "POST" }).catch(() => {});
        throw new Error("A metrics token reads /metrics only; log in with a viewer, submitter or admin token.");
      }
      enter(answer);
    } catch (problem) {
      error.textContent = problem.message;
      error.hidden = false;
      button.disabled = false;
      input.select();
    }
  }

  root.replaceChildren(
    h(
      "main",
      { class: "login-page" },
      h(
        "form",
        { class: "card login", testid: "login-form", onsubmit: logIn },
        h("div", { class: "brand" }, h("img", { src: "/static/favicon.svg", alt: "" }), "GPUlayer"),
        h("label", { class: "field" }, h("span", {}, "API token"), input),
        button,
        error,
        h(
          "p",
          { class: "hint" },
          h("code", {}, "gpulayer up"),
          " prints an admin token the first time; make others with ",
          h("code", {}, "gpulayer token create --name you --role viewer"),
          ".",
        ),
      ),
    ),
  );
  document.title = "Log in · GPUlayer";
  input.focus();
}

function enter(who) {
  session = who;
  setCsrf(who.csrf_token);
  const live = h("span", { class: "live", testid: "live", title: "Connecting to live events…" }, h("i", { class: "dot" }), h("span", {}, "connecting"));
  const link = (page, label) => h("a", { href: `#/${page}`, dataset: { page }, testid: `nav-${page}` }, label);
  const themeButton = h("button", { class: "icon-btn", testid: "theme-toggle", title: "Light or dark", "aria-label": "Switch between light and dark", onclick: toggleTheme }, icon("moon"), icon("sun"));
  const logout = h("button", { class: "icon-btn", testid: "logout", title: "Log out", "aria-label": "Log out", onclick: logOut }, icon("out"));
  root.replaceChildren(
    h(
      "header",
      { class: "topbar", testid: "topbar" },
      h("a", { class: "brand", href: "#/jobs", "aria-label": "GPUlayer" }, h("img", { src: "/static/favicon.svg", alt: "" }), h("span", { class: "brand-name" }, "GPUlayer")),
      h("nav", {}, link("jobs", "Jobs"), link("workers", "Workers"), link("activity", "Activity")),
      h("span", { class: "spacer" }),
      live,
      h("span", { class: "who", testid: "whoami", title: `Logged in with the token ${who.name}` }, h("span", { class: "mono" }, who.name), h("span", { class: `role role-${who.role}`, testid: "role" }, who.role)),
      themeButton,
      logout,
    ),
    h("main", { id: "main" }),
  );
  startEvents();
  route();
}

async function logOut() {
  await api("/logout", { method: "POST" }).catch(() => {});
  showLogin();
}

/** The top bar says whether changes arrive live or by polling. */
function showLive({ live: on }) {
  const live = document.querySelector(".topbar .live");
  if (!live) return;
  live.classList.toggle("on", on);
  live.lastChild.textContent = on ? "live" : "polling";
  live.title = on ? "Changes arrive as they happen" : "Live events are unavailable; pages refresh every few seconds";
}

function route() {
  if (!session) return;
  leavePage();
  const [path, query = ""] = (location.hash.slice(1) || "/jobs").split("?");
  const main = h("main", { id: "main" });
  document.getElementById("main").replaceWith(main);
  const job = path.match(/^\/jobs\/([\w-]+)$/);
  let page = "jobs";
  if (job) {
    dispose = mountJob(main, { session, id: job[1] });
  } else if (path === "/workers") {
    page = "workers";
    dispose = mountWorkers(main, { session });
  } else if (path === "/activity") {
    page = "activity";
    dispose = mountActivity(main, { session });
  } else {
    if (path !== "/jobs") history.replaceState(null, "", "#/jobs");
    dispose = mountJobs(main, { session, query: new URLSearchParams(query) });
  }
  for (const link of document.querySelectorAll(".topbar nav a")) {
    link.classList.toggle("active", link.dataset.page === page);
  }
}

window.addEventListener("hashchange", route);
onEvent("status", showLive);
// Any request answered 401 means the session ended (logged out elsewhere, token revoked).
window.addEventListener("gpulayer:unauthorized", (event) => session && showLogin(event.detail));
dark.addEventListener("change", applyTheme);
setInterval(() => {
  const main = document.getElementById("main");
  if (main && !document.hidden) refreshTimes(main);
}, 1000);

applyTheme();
api(`${V1}/session`).then(enter, (problem) => showLogin(problem.status === 401 ? "" : problem.message));
