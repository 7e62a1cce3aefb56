// The dashboard shell: sign-in, hash routes, navigation state, the live indicator, keyboard
// shortcuts.

import { h } from "./dom.js";
import { api, ApiError, apiKey, onSignedOut, setIdentity, signIn, signOut, whoAmI } from "./api.js";
import { onHealth } from "./live.js";
import { readinessPanel } from "./ready.js";
import { agoSeconds } from "./format.js";
import { empty } from "./components.js";
import * as overview from "./pages/overview.js";
import * as workflows from "./pages/workflows.js";
import * as workflow from "./pages/workflow.js";
import * as workers from "./pages/workers.js";
import * as definitions from "./pages/definitions.js";
import * as data from "./pages/data.js";
import * as schedules from "./pages/schedules.js";
import * as webhooks from "./pages/webhooks.js";

const ROUTES = [
  { pattern: /^\/?$/, page: overview, nav: "overview" },
  { pattern: /^\/workflows\/?$/, page: workflows, nav: "workflows" },
  { pattern: /^\/workflows\/([0-9a-fA-F-]{36})\/?$/, page: workflow, nav: "workflows", names: ["id"] },
  { pattern: /^\/workers\/?$/, page: workers, nav: "workers" },
  { pattern: /^\/definitions\/?$/, page: definitions, nav: "definitions" },
  { pattern: /^\/data\/?$/, page: data, nav: "data" },
  { pattern: /^\/schedules\/?$/, page: schedules, nav: "schedules" },
  { pattern: /^\/webhooks\/?$/, page: webhooks, nav: "webhooks" },
];

const main = document.getElementById("main");
let unmount = null;
let firstRoute = true;
// The hash the mounted page stands for: the one it was mounted from, or last wrote itself.
let mountedHash = "";

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, search = ""] = raw.split("?");
  return { path, query: new URLSearchParams(search) };
}

/** Go to a route, e.g. navigate("/workflows", {status: "FAILED"}). */
export function navigate(path, params = {}) {
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== ""));
  const text = q.toString();
  location.hash = `#${path}${text ? `?${text}` : ""}`;
}

/** Rewrite the current route's query without a new history entry or a re-mount. */
export function replaceQuery(params) {
  // A navigation already changed the hash and its hashchange has not run yet (e.g. a page's
  // debounced search fires in between): overwriting the new hash would lose where it goes.
  if (location.hash !== mountedHash) return;
  const { path } = parseHash();
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== ""));
  const text = q.toString();
  history.replaceState(history.state, "", `#${path}${text ? `?${text}` : ""}`);
  mountedHash = location.hash;
}

function leavePage() {
  if (unmount) {
    try {
      unmount();
    } catch (err) {
      console.error("dashboard bug while leaving a page", err);
    }
    unmount = null;
  }
}

function route() {
  mountedHash = location.hash;
  const { path, query } = parseHash();
  leavePage();
  if (!apiKey()) return; // the sign-in dialog is open; nothing is asked of the API without a key
  const found = ROUTES.map((r) => ({ r, m: r.pattern.exec(path) })).find((x) => x.m);
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (found && link.dataset.nav === found.r.nav) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  main.replaceChildren();
  if (!found) {
    document.title = "Not found · cdiflow";
    main.append(
      h("div", { class: "page" }, h("h1", { tabindex: -1 }, "Page not found"), empty("Nothing lives at this address.", `#${path}`, h("a", { class: "btn", href: "#/" }, "Go to the overview"))),
    );
    return;
  }
  const params = {};
  (found.r.names || []).forEach((name, i) => (params[name] = found.m[i + 1]));
  unmount = found.r.page.mount(main, { params, query, navigate, replaceQuery, setTitle });
  if (!firstRoute) {
    // Move focus to the new page's heading, as a full page load would for a screen reader.
    const heading = main.querySelector("h1");
    if (heading) heading.focus({ preventScroll: true });
    window.scrollTo(0, 0);
  }
  firstRoute = false;
}

function setTitle(text) {
  document.title = text ? `${text} · cdiflow` : "cdiflow";
}

function liveIndicator() {
  const box = document.getElementById("live");
  const text = document.getElementById("live-text");
  let state = { ok: true, lastOk: null };
  const paint = () => {
    if (state.lastOk === null && state.ok) {
      box.dataset.state = "connecting";
      text.textContent = "Connecting…";
    } else if (state.ok) {
      box.dataset.state = "live";
      text.textContent = `Live · updated ${agoSeconds((Date.now() - state.lastOk) / 1000)}`;
    } else {
      box.dataset.state = "down";
      text.textContent = state.lastOk ? `API unreachable · last ${agoSeconds((Date.now() - state.lastOk) / 1000)}` : "API unreachable";
    }
  };
  onHealth((next) => {
    state = next;
    paint();
  });
  setInterval(paint, 1000);
}

function shortcuts() {
  const help = document.getElementById("help");
  document.getElementById("open-help").addEventListener("click", () => help.showModal());
  document.getElementById("skip").addEventListener("click", (event) => {
    event.preventDefault(); // "#main" is not a route
    main.focus();
  });
  const go = { o: "/", w: "/workflows", k: "/workers", d: "/definitions", c: "/data", s: "/schedules", h: "/webhooks" };
  let pendingG = 0;
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const target = event.target;
    if (target.closest("input, textarea, select, [contenteditable], dialog[open]")) return;
    if (pendingG && Date.now() - pendingG < 1500 && go[event.key]) {
      pendingG = 0;
      event.preventDefault();
      navigate(go[event.key]);
      return;
    }
    pendingG = event.key === "g" ? Date.now() : 0;
    if (event.key === "?") {
      event.preventDefault();
      help.showModal();
    } else if (event.key === "/") {
      event.preventDefault();
      const search = document.querySelector("[data-search]");
      if (search) search.focus();
      else navigate("/workflows", { focus: "search" });
    } else if (event.key === "n") {
      event.preventDefault();
      navigate("/workflows", { start: "1" });
    }
  });
}

// --- sign-in ---------------------------------------------------------------------------------

const signinDialog = document.getElementById("signin");
const signinKey = document.getElementById("signin-key");
const signinError = document.getElementById("signin-error");

function showWho() {
  const who = whoAmI();
  const box = document.getElementById("who");
  box.hidden = !who;
  if (!who) return;
  document.getElementById("who-name").textContent = who.name;
  document.getElementById("who-role").textContent = who.role;
  box.title = `Signed in with the API key "${who.name}" (role ${who.role})`;
}

function askForKey(message = "") {
  leavePage();
  showWho();
  main.replaceChildren(h("div", { class: "page" }, h("h1", { tabindex: -1 }, "Sign in"), empty("This cdiflow needs an API key", "Enter one to see its workflows.")));
  signinError.hidden = !message;
  signinError.textContent = message;
  signinKey.value = "";
  if (!signinDialog.open) signinDialog.showModal();
  signinKey.focus();
}

async function submitKey(event) {
  event.preventDefault();
  const key = signinKey.value.trim();
  if (!key) {
    signinError.hidden = false;
    signinError.textContent = "Enter an API key.";
    return;
  }
  const button = document.getElementById("signin-submit");
  button.disabled = true;
  try {
    signIn(key, await api.getWith("/api/whoami", key));
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    signinError.hidden = false;
    signinError.textContent = err.status === 401 ? "The API does not accept this key: it is mistyped or was revoked." : err.message;
    signinKey.focus();
    return;
  } finally {
    button.disabled = false;
  }
  signinDialog.close();
  showWho();
  route();
}

/** With a key kept from earlier in this tab: check it, then show the page. */
async function resume() {
  try {
    setIdentity(await api.get("/api/whoami"));
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    if (err.status === 401) return; // onSignedOut asks for a key
    setTimeout(resume, 3000); // the API is away: show the pages (they say so), ask again later
    if (!unmount) route();
    return;
  }
  showWho();
  route();
}

// No way around it: Esc is refused, and where the browser closes the dialog anyway it opens again.
signinDialog.addEventListener("cancel", (event) => event.preventDefault());
signinDialog.addEventListener("close", () => {
  if (!apiKey()) signinDialog.showModal();
});
document.getElementById("signin-form").addEventListener("submit", submitKey);
document.getElementById("sign-out").addEventListener("click", () => signOut());
onSignedOut((reason) => askForKey(reason));

window.addEventListener("hashchange", route);
liveIndicator();
readinessPanel();
shortcuts();
if (apiKey()) resume();
else askForKey();
