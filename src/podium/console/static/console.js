// Podium console: reads the control API (same origin) and polls it; no dependencies.
"use strict";

const POLL_MS = 1500;
const KEY = "podium.adminKey";
const $ = (sel) => document.querySelector(sel);
let view = null;     // {name, arg, live(data) -> html}

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => (
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

class ApiError extends Error {}

async function api(path, options = {}) {
  const headers = {...(options.headers || {})};
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = "Bearer " + key;
  if (options.body) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {...options, headers});
  const text = await r.text();
  if (!r.ok) {
    let message = text;
    try { message = JSON.parse(text).error.message; } catch (_e) { /* not the API's shape */ }
    throw new ApiError(`${r.status}: ${message}`);
  }
  return (r.headers.get("content-type") || "").includes("json") ? JSON.parse(text) : text;
}

// `from`: "poll" (cleared by the next good poll) or "action" (stays until the next action)
function showError(message, from = "action") {
  const box = $("#error");
  box.textContent = message || "";
  box.hidden = !message;
  box.dataset.from = from;
}

function ask(text) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), {once: true});
    dialog.returnValue = "cancel";
    dialog.showModal();
  });
}

// an admin action: confirmed, then the API's own message on failure
async function act(question, path, options) {
  if (!(await ask(question))) return null;
  try {
    const answer = await api(path, options);
    showError("");
    await poll();
    return answer;
  } catch (e) {
    showError(e.message);
    return null;
  }
}

// --- routing and polling ---

function render(html) {
  // a keyboard user's focus on a link survives the re-render (same href, same place)
  const live = $("#live");
  const focused = live.contains(document.activeElement) && document.activeElement.getAttribute("href");
  live.innerHTML = html;
  if (focused) {
    const again = [...live.querySelectorAll("a[href]")].find((a) => a.getAttribute("href") === focused);
    if (again) again.focus();
  }
}

function route() {
  const [, name = "", arg = ""] = location.hash.split("/").map(decodeURIComponent);
  const kind = views[name] ? name : "overview";
  view = {name: kind, arg, ...views[kind]};
  document.querySelectorAll("[data-nav]").forEach((a) => {
    if (a.dataset.nav === kind) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  });
  $("#actions").innerHTML = view.actions ? view.actions(arg) : "";
  $("#live").innerHTML = `<p class="muted">loading…</p>`;
  lastHtml = "";
  wireActions(kind === "model" ? arg : null);
  document.title = `Podium console: ${kind}${arg ? " " + arg : ""}`;
  poll();
}

let polling = null;
let lastHtml = "";
async function poll() {
  if (polling) return polling;
  polling = (async () => {
    const current = view;
    try {
      const data = await current.fetch(current.arg);
      if (view !== current) return;
      const html = current.live(data);
      if (html !== lastHtml) render(html);
      lastHtml = html;
      $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
      $("#key-state").textContent = sessionStorage.getItem(KEY) ? "key set" : "";
      if (!window.podiumFirstRender) window.podiumFirstRender = performance.now();
      if ($("#error").dataset.from === "poll") showError("");
    } catch (e) {
      showError(e.message + (e.message.startsWith("401") ? " — type the admin key above" : ""), "poll");
    } finally {
      polling = null;
    }
  })();
  return polling;
}

function fillList(id, values) {
  const list = document.getElementById(id);
  const html = values.map((v) => `<option value="${esc(v)}">`).join("");
  if (list && list.innerHTML !== html) list.innerHTML = html;
}

function names() {
  // datalists for the forms, from what the overview knows
  if (document.getElementById("model-names")) return;
  for (const id of ["model-names", "version-names"]) {
    const list = document.createElement("datalist");
    list.id = id;
    document.body.append(list);
  }
}

$("#key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const value = $("#admin-key").value.trim();
  if (value) sessionStorage.setItem(KEY, value); else sessionStorage.removeItem(KEY);
  $("#admin-key").value = "";
  $("#key-state").textContent = value ? "key set" : "key cleared";
  poll();
});
window.addEventListener("hashchange", route);
names();
route();
setInterval(poll, POLL_MS);
