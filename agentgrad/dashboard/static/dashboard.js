"use strict";
// The agentgrad dashboard: reads the store through the server's /api/ endpoints and draws it
// with plain DOM and inline SVG. Store data (span attributes above all) is user data: it only
// ever enters the page as text nodes or attribute values, through h() and svg().
// Span attribute names ("agentgrad.*", "gen_ai.*") are defined in agentgrad/semconv.py; this file
// cannot import it, so tests/test_semconv.py checks that every name spelled here is defined there.

const POLL_MS = 3000;
const PAGE_SIZE = 50;
const TOKEN_KEY = "agentgrad.token";
const ROLLOUT_STATUSES = ["queuing", "running", "requeuing", "succeeded", "failed", "cancelled"];
const METRIC_GROUPS = ["train", "val", "perf", "apo"]; // shown first, in this order; others follow by name
const LLM_OPERATIONS = ["chat", "text_completion"];
const BASE_ADAPTER = "base"; // agentgrad.adapter.name of a call the base model served (semconv.BASE_ADAPTER)
const HIDDEN_ATTRIBUTES = ["agentgrad.rollout_id", "agentgrad.attempt_id"]; // the page already says which
const LONG_ARRAY = 16; // arrays longer than this (token ids, logprobs) are shown as a count

// ---------------------------------------------------------------- DOM helpers

function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : String(child)); // a string becomes a text node
  }
  return parent;
}

/** An element: props are attributes, `class`, or `on<event>` listeners; children are nodes or text. */
function h(tag, props, ...children) {
  return build(document.createElement(tag), props, children);
}

function svg(tag, props, ...children) {
  return build(document.createElementNS("http://www.w3.org/2000/svg", tag), props, children);
}

function build(el, props, children) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  return append(el, children);
}

/** Replaces an element's children; like replaceChildren, but takes nested arrays and text. */
function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- formatting

function fmtNumber(value) {
  if (value === null || value === undefined) return "–";
  if (!Number.isFinite(value)) return String(value);
  if (Number.isInteger(value)) return value.toLocaleString("en");
  const abs = Math.abs(value);
  if (abs >= 1000) return value.toLocaleString("en", { maximumFractionDigits: 1 });
  if (abs >= 1) return value.toFixed(3).replace(/\.?0+$/, "");
  return abs === 0 ? "0" : value.toPrecision(3);
}

function fmtSeconds(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const minutes = Math.floor(seconds / 60);
  return minutes < 60 ? `${minutes}m ${Math.round(seconds % 60)}s` : `${Math.floor(minutes / 60)}h ${minutes % 60}m`;
}

function duration(start, end) {
  if (start === null || start === undefined) return "–";
  const running = end === null || end === undefined;
  return fmtSeconds((running ? Date.now() / 1000 : end) - start) + (running ? " …" : "");
}

function ago(time) {
  const seconds = Math.max(0, Date.now() / 1000 - time);
  return seconds < 90 ? `${Math.round(seconds)}s ago` : `${fmtSeconds(seconds)} ago`;
}

function clock(time) {
  return time === null || time === undefined ? "–" : new Date(time * 1000).toLocaleString();
}

function short(value, width) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text.length <= width ? text : text.slice(0, width - 1) + "…";
}

/** JSON for people: long arrays (token ids, logprobs) become "[N numbers]". */
function pretty(value) {
  return JSON.stringify(value, (key, v) =>
    Array.isArray(v) && v.length > LONG_ARRAY ? `[${v.length} ${typeof v[0] === "number" ? "numbers" : "items"}]` : v, 2);
}

function badge(status) {
  return h("span", { class: `badge s-${status}` }, status);
}

function parseJson(value) {
  if (typeof value !== "string") return value;
  try { return JSON.parse(value); } catch { return value; }
}

// ---------------------------------------------------------------- API

class Unauthorized extends Error {}

/** Fills `{name}` placeholders with URL-encoded params: ("api/rollouts/{rollout_id}", {rollout_id}) → "api/rollouts/ro-1". */
function fill(template, params) {
  return template.replace(/\{(\w+)\}/g, (_, name) => {
    if (!(name in params)) throw new Error(`${template}: no value for {${name}}`);
    return encodeURIComponent(params[name]);
  });
}

/** One API call: method, path template, its params, the JSON body. Paths are relative, so the page works behind a prefix.
 * Write every call with literal method and path: tests/test_dashboard.py reads them out of this file. */
async function call(method, template, params = {}, body = undefined) {
  const path = fill(template, params);
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 401) throw new Unauthorized(token ? "the token was refused" : "this store server needs its token");
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${data && data.detail ? data.detail : response.statusText}`);
  return data;
}

// ---------------------------------------------------------------- header

const state = {
  view: "curves",
  rolloutId: null,
  attemptId: null,
  stats: null,
  statuses: new Set(),
  mode: "",
  newestFirst: true,
  offset: 0,
};

async function refreshHeader() {
  const health = $("health");
  try {
    const answer = await call("GET", "api/health");
    health.className = `health ${answer.status === "ok" ? "ok" : "bad"}`;
    health.textContent = `server ${answer.status}`;
  } catch (error) {
    health.className = "health bad";
    health.textContent = "server unreachable";
    throw error;
  }
  const stats = await call("GET", "api/stats");
  state.stats = stats;
  const total = (counts) => Object.values(counts).reduce((a, b) => a + b, 0);
  const rollouts = ROLLOUT_STATUSES.filter((s) => stats.rollouts[s]).map((s) => [badge(s), ` ${stats.rollouts[s]} `]);
  const attempts = Object.entries(stats.attempts).map(([s, n]) => `${s} ${n}`).join(", ");
  replace($("stats"),
    h("span", {}, h("b", {}, fmtNumber(total(stats.rollouts))), " rollouts ", rollouts),
    h("span", { title: attempts }, h("b", {}, fmtNumber(total(stats.attempts))), " attempts"),
    h("span", {}, h("b", {}, fmtNumber(stats.spans)), " spans"),
    h("span", {}, h("b", {}, fmtNumber(stats.workers)), " workers"),
    h("span", {}, h("b", {}, fmtNumber(stats.resources)), " resource versions"),
  );
  $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

// ---------------------------------------------------------------- training curves

const curves = { names: "", charts: new Map(), roles: null }; // name → {signature, element}; roles: the roles' chart
const ROLE_REWARD = /^train\/([^/]+)\/reward_mean$/;
const ROLE_REWARD_CHART = "train/{role}/reward_mean";

function groupOf(name) {
  return name.includes("/") ? name.slice(0, name.indexOf("/")) : "other";
}

function groupRank(group) {
  const i = METRIC_GROUPS.indexOf(group);
  return i < 0 ? METRIC_GROUPS.length : i;
}

async function refreshCurves() {
  const points = await call("GET", "api/metrics");
  const series = new Map();
  for (const p of points) {
    if (!series.has(p.name)) series.set(p.name, []);
    series.get(p.name).push(p);
  }
  const names = [...series.keys()].sort((a, b) => groupRank(groupOf(a)) - groupRank(groupOf(b)) || a.localeCompare(b));
  const roles = roleCurves(series);
  const view = $("view-curves");
  if (names.join("\n") !== curves.names) { // new curves: lay the groups out again
    curves.names = names.join("\n");
    curves.charts.clear();
    curves.roles = { signature: "", element: h("div") };
    const groups = new Map();
    for (const name of names) {
      const group = groupOf(name);
      if (!groups.has(group)) groups.set(group, h("div", { class: "charts" }));
      const slot = h("div");
      groups.get(group).append(slot);
      curves.charts.set(name, { signature: "", element: slot });
    }
    replace(view,
      names.length ? "" : h("p", { class: "empty" }, "No metrics yet. Algorithms write training curves here as they run."),
      roles.length ? [h("h2", {}, "roles"), curves.roles.element] : null,
      [...groups].map(([group, charts]) => [h("h2", {}, group === "other" ? "other" : `${group}/`), charts]),
    );
  }
  const rolesSignature = JSON.stringify(roles.map((s) => [s.label, s.points.length, s.points[s.points.length - 1].value]));
  if (roles.length && curves.roles.signature !== rolesSignature) {
    const element = compareChart(ROLE_REWARD_CHART, roles, "role");
    curves.roles.element.replaceWith(element);
    Object.assign(curves.roles, { signature: rolesSignature, element });
  }
  for (const name of names) { // redraw only the curves that moved
    const points = series.get(name);
    const last = points[points.length - 1];
    const signature = `${points.length}:${last.step}:${last.value}`;
    const chart = curves.charts.get(name);
    if (chart.signature === signature) continue;
    const element = lineChart(name, points);
    chart.element.replaceWith(element);
    Object.assign(chart, { signature, element });
  }
}

/** Each role's `train/<role>/reward_mean` (GRPO with `roles=`), a series per role in name order. */
function roleCurves(series) {
  const roles = [...series.keys()].map((name) => ROLE_REWARD.exec(name)).filter(Boolean).map((m) => m[1]).sort();
  return roles.map((role) => ({ label: role, color: roleColor(role), points: series.get(`train/${role}/reward_mean`) }));
}

/** An agent's (role's) colour, from its name: the same on the roles' curves and on its calls in any rollout. */
function roleColor(name) {
  let hash = 7;
  for (const c of name) hash = (hash * 31 + c.charCodeAt(0)) >>> 0;
  return RUN_COLORS[hash % RUN_COLORS.length];
}

/** A small SVG line chart of one metric; hovering shows the nearest point's step and value. */
function lineChart(name, points) {
  const W = 320, H = 150, L = 48, R = 10, T = 10, B = 22;
  const steps = points.map((p) => p.step), values = points.map((p) => p.value).filter(Number.isFinite);
  let [x0, x1] = [Math.min(...steps), Math.max(...steps)];
  let [y0, y1] = values.length ? [Math.min(...values), Math.max(...values)] : [0, 1];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
  const x = (step) => L + ((step - x0) / (x1 - x0)) * (W - L - R);
  const y = (value) => T + (1 - (value - y0) / (y1 - y0)) * (H - T - B);
  const drawn = points.filter((p) => Number.isFinite(p.value));
  const path = drawn.map((p, i) => `${i ? "L" : "M"}${x(p.step).toFixed(1)},${y(p.value).toFixed(1)}`).join("");
  const last = points[points.length - 1];
  const readout = h("span", { class: "readout" }, `${fmtNumber(last.value)} @ step ${last.step}`);
  const marker = svg("circle", { r: 3.5, class: "marker", visibility: "hidden" });
  const grid = [y0, (y0 + y1) / 2, y1].map((v) => [
    svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "gridline" }),
    svg("text", { x: L - 4, y: y(v) + 3, class: "tick", "text-anchor": "end" }, fmtNumber(v)),
  ]);
  const xTicks = [x0, x1].map((s, i) =>
    svg("text", { x: x(s), y: H - 6, class: "tick", "text-anchor": i ? "end" : "start" }, fmtNumber(s)));
  const hover = svg("rect", {
    x: L, y: T, width: W - L - R, height: H - T - B, class: "hover",
    onmousemove(event) {
      const box = hover.getBoundingClientRect();
      const step = x0 + ((event.clientX - box.left) / box.width) * (x1 - x0);
      let best = drawn[0];
      for (const p of drawn) if (Math.abs(p.step - step) < Math.abs(best.step - step)) best = p;
      if (!best) return;
      marker.setAttribute("cx", x(best.step));
      marker.setAttribute("cy", y(best.value));
      marker.setAttribute("visibility", "visible");
      readout.textContent = `${fmtNumber(best.value)} @ step ${best.step}`;
    },
    onmouseleave() {
      marker.setAttribute("visibility", "hidden");
      readout.textContent = `${fmtNumber(last.value)} @ step ${last.step}`;
    },
  });
  return h("figure", { class: "chart" },
    h("figcaption", {}, h("span", { class: "mono" }, name), readout),
    svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": name },
      grid, xTicks, svg("path", { d: path, class: "line" }),
      drawn.length === 1 ? svg("circle", { cx: x(drawn[0].step), cy: y(drawn[0].value), r: 3, class: "dot" }) : null,
      marker, hover));
}

// ---------------------------------------------------------------- rollouts

/** A page of rollouts. The API lists in enqueue order; newest first reads the page from the end. */
async function queryRollouts() {
  const status = state.statuses.size ? [...state.statuses] : null;
  const mode = state.mode || null;
  if (!state.newestFirst) {
    const rows = await call("POST", "api/rollouts/query", {}, { status, mode, limit: PAGE_SIZE, offset: state.offset });
    return { rows, total: null };
  }
  if (mode) { // no count by mode in the stats: read every match and cut the page here
    const all = await call("POST", "api/rollouts/query", {}, { status, mode, limit: null, offset: 0 });
    return { rows: all.reverse().slice(state.offset, state.offset + PAGE_SIZE), total: all.length };
  }
  const counts = state.stats.rollouts;
  const total = (status || ROLLOUT_STATUSES).reduce((sum, s) => sum + (counts[s] || 0), 0);
  const start = Math.max(0, total - state.offset - PAGE_SIZE), limit = total - state.offset - start;
  if (limit <= 0) return { rows: [], total };
  const rows = await call("POST", "api/rollouts/query", {}, { status, mode, limit, offset: start });
  return { rows: rows.reverse(), total };
}

function buildFilters() {
  replace($("status-filters"), ...ROLLOUT_STATUSES.map((status) => h("label", { class: "check" },
    h("input", { type: "checkbox", value: status }), badge(status))));
  $("rollout-filters").addEventListener("change", () => {
    state.statuses = new Set([...document.querySelectorAll("#status-filters input:checked")].map((i) => i.value));
    state.mode = $("mode-filter").value.trim();
    state.newestFirst = $("order").value === "newest";
    state.offset = 0;
    refresh();
  });
  $("rollout-filters").addEventListener("submit", (event) => event.preventDefault());
  $("page-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE_SIZE); refresh(); });
  $("page-next").addEventListener("click", () => { state.offset += PAGE_SIZE; refresh(); });
}

async function refreshRollouts() {
  const { rows, total } = await queryRollouts();
  const link = (id) => `#rollout/${encodeURIComponent(id)}`;
  replace($("rollout-rows"), ...rows.map((r) => h("tr", { class: "clickable", onclick: () => { location.hash = link(r.rollout_id); } },
    h("td", { class: "mono" }, h("a", { href: link(r.rollout_id) }, r.rollout_id)),
    h("td", {}, badge(r.status)),
    h("td", {}, r.mode || "–"),
    h("td", { class: "num" }, r.num_attempts),
    h("td", { class: "num" }, fmtNumber(r.reward)),
    h("td", { class: "num" }, duration(r.start_time, r.end_time)),
    h("td", { class: "muted" }, clock(r.enqueue_time)),
    h("td", { class: "mono input", title: short(r.input, 2000) }, short(r.input, 80)),
  )));
  if (!rows.length) $("rollout-rows").append(h("tr", {}, h("td", { colspan: 8, class: "empty" }, "No rollouts match.")));
  const first = rows.length ? state.offset + 1 : state.offset;
  $("page-info").textContent = `${first}–${state.offset + rows.length}${total === null ? "" : ` of ${total}`}`;
  $("page-prev").disabled = state.offset === 0;
  $("page-next").disabled = total === null ? rows.length < PAGE_SIZE : state.offset + PAGE_SIZE >= total;
}

// ---------------------------------------------------------------- rollout detail

// The spans last read, and under which key: attempt id and the store's span count (a new span anywhere changes it).
const detail = { signature: "", spansKey: "", spans: [] };

async function refreshRollout() {
  const rollout_id = state.rolloutId;
  const [rollout, attempts] = await Promise.all([
    call("GET", "api/rollouts/{rollout_id}", { rollout_id }),
    call("GET", "api/rollouts/{rollout_id}/attempts", { rollout_id }),
  ]);
  const attempt = attempts.find((a) => a.attempt_id === state.attemptId) || attempts[attempts.length - 1];
  const spansKey = attempt ? `${attempt.attempt_id}@${state.stats.spans}` : "";
  if (spansKey !== detail.spansKey) { // read spans (token ids and all) again only when the store has new ones
    detail.spans = attempt ? await call("GET", "api/spans?rollout_id={rollout_id}&attempt_id={attempt_id}",
      { rollout_id, attempt_id: attempt.attempt_id }) : [];
    detail.spansKey = spansKey;
  }
  const spans = detail.spans;
  const last = spans[spans.length - 1];
  const signature = JSON.stringify([rollout, attempts, attempt && attempt.attempt_id, spans.length, last && last.sequence_id]);
  if (signature === detail.signature) return; // nothing new: keep the reader's place and open details
  detail.signature = signature;
  replace($("view-rollout"), renderRollout(rollout, attempts, attempt, spans));
}

function renderRollout(r, attempts, selected, spans) {
  const fields = [
    ["status", badge(r.status)], ["mode", r.mode || "–"], ["reward", fmtNumber(r.reward)],
    ["duration", duration(r.start_time, r.end_time)], ["enqueued", clock(r.enqueue_time)],
    ["resources", h("span", { class: "mono" }, r.resources_id || "latest")], ["attempts", r.num_attempts],
  ];
  const attemptLink = (a) => `#rollout/${encodeURIComponent(r.rollout_id)}/${encodeURIComponent(a.attempt_id)}`;
  return h("div", {},
    h("p", {}, h("a", { href: "#rollouts" }, "‹ rollouts")),
    h("h2", {}, "Rollout ", h("span", { class: "mono" }, r.rollout_id)),
    h("dl", { class: "fields" }, fields.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    h("h3", {}, "Input"), h("pre", { class: "json" }, pretty(r.input)),
    Object.keys(r.metadata).length ? [h("h3", {}, "Metadata"), h("pre", { class: "json" }, pretty(r.metadata))] : null,
    h("h3", {}, "Attempts"),
    h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, ["#", "attempt", "status", "worker", "started", "duration", "reward", "error"].map((c) => h("th", {}, c)))),
      h("tbody", {}, attempts.map((a) => h("tr", {
        class: `clickable${selected && a.attempt_id === selected.attempt_id ? " selected" : ""}`,
        onclick: () => { location.hash = attemptLink(a); },
      },
        h("td", {}, a.sequence),
        h("td", { class: "mono" }, h("a", { href: attemptLink(a) }, a.attempt_id)),
        h("td", {}, badge(a.status)),
        h("td", { class: "mono" }, a.worker_id || "–"),
        h("td", { class: "muted" }, clock(a.start_time)),
        h("td", { class: "num" }, duration(a.start_time, a.end_time)),
        h("td", { class: "num" }, fmtNumber(a.reward)),
        h("td", { class: "error-text" }, a.error ? short(a.error, 200) : ""),
      )))),
    selected ? [
      h("h3", {}, `Spans of attempt ${selected.sequence} (${spans.length})`),
      agentsLegend(spans),
      spans.length ? spanTree(spans) : h("p", { class: "empty" }, "No spans recorded."),
    ] : h("p", { class: "empty" }, "No attempt yet: the rollout is waiting in the queue."),
  );
}

/** The agents (roles) whose model calls this attempt holds: calls, the adapters that served them, weights versions. */
function agentsLegend(spans) {
  const agents = new Map();
  for (const s of spans) {
    const a = s.attributes;
    if (!LLM_OPERATIONS.includes(a["gen_ai.operation.name"]) || !a["agentgrad.agent.name"]) continue;
    const seen = agents.get(a["agentgrad.agent.name"]) || { calls: 0, adapters: new Set(), versions: new Set() };
    seen.calls += 1;
    if (a["agentgrad.adapter.name"]) seen.adapters.add(a["agentgrad.adapter.name"]);
    if (a["agentgrad.llm.weights_version"] !== undefined) seen.versions.add(a["agentgrad.llm.weights_version"]);
    agents.set(a["agentgrad.agent.name"], seen);
  }
  if (!agents.size) return null;
  return h("ul", { class: "legend agents" }, [...agents].map(([agent, seen]) => h("li", {},
    h("span", { class: "swatch", style: `background:${roleColor(agent)}` }), h("b", {}, agent),
    h("span", { class: "muted" }, ` ${seen.calls} call${seen.calls === 1 ? "" : "s"}`,
      seen.adapters.size ? `, adapter ${[...seen.adapters].join(", ")}` : "",
      seen.versions.size ? `, weights v${[...seen.versions].join(", v")}` : ""))));
}

/** A model call's label: its agent (role) in that agent's colour, the adapter that served it and the weights version. */
function roleTag(a) {
  const agent = a["agentgrad.agent.name"], adapter = a["agentgrad.adapter.name"], version = a["agentgrad.llm.weights_version"];
  if (!agent && !adapter) return null;
  const parts = [agent || "unnamed agent",
    adapter === undefined ? null : adapter === BASE_ADAPTER ? "base model (no adapter)" : `adapter ${adapter}`,
    version === undefined ? null : `v${version}`].filter(Boolean);
  return h("span", { class: "role-tag", style: `border-color:${roleColor(agent || adapter)}` }, parts.join(" · "));
}

/** Spans nested by parent id, siblings by sequence id; a span whose parent is not here is a root. */
function spanTree(spans) {
  const ids = new Set(spans.map((s) => s.span_id).filter(Boolean));
  const children = new Map();
  for (const s of [...spans].sort((a, b) => a.sequence_id - b.sequence_id)) {
    const parent = s.parent_id && ids.has(s.parent_id) ? s.parent_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(s);
  }
  const t0 = Math.min(...spans.map((s) => s.start_time));
  const branch = (parent, seen) => h("ul", { class: "tree" }, (children.get(parent) || []).map((s) =>
    h("li", {}, renderSpan(s, t0), s.span_id && !seen.has(s.span_id) ? branch(s.span_id, new Set([...seen, s.span_id])) : null)));
  return branch(null, new Set());
}

function exceptionOf(span) {
  const a = span.attributes;
  if (a["exception.type"] || a["exception.message"]) return a;
  const event = span.events.find((e) => e.name === "exception");
  return event ? event.attributes : null;
}

function renderSpan(span, t0) {
  const a = span.attributes;
  const isLlm = LLM_OPERATIONS.includes(a["gen_ai.operation.name"]);
  const isReward = "agentgrad.reward" in a;
  const isTool = a["gen_ai.operation.name"] === "execute_tool";
  const exception = exceptionOf(span);
  const kind = exception || span.status.code === "ERROR" ? "error" : isReward ? "reward" : isLlm ? "llm" : isTool ? "tool" : "";
  const shown = Object.keys(a).filter((k) => !HIDDEN_ATTRIBUTES.includes(k) && !k.startsWith("exception.") &&
    !(isReward && k.startsWith("agentgrad.reward")) && !(isLlm && (k.startsWith("gen_ai.") || k.startsWith("agentgrad.llm.") || k === "agentgrad.agent.name" ||
      k === "agentgrad.adapter.name")));
  const agent = isLlm && kind === "llm" ? a["agentgrad.agent.name"] : undefined;
  return h("div", { class: `span ${kind}`, style: agent ? `border-left-color:${roleColor(agent)}` : undefined },
    h("div", { class: "span-head" },
      h("b", {}, span.name), h("span", { class: "muted mono" }, ` #${span.sequence_id}`),
      isLlm ? roleTag(a) : null,
      h("span", { class: "muted" }, `+${fmtSeconds(span.start_time - t0)}`),
      h("span", {}, span.end_time ? fmtSeconds(span.end_time - span.start_time) : "open"),
      span.status.code === "ERROR" ? h("span", { class: "badge s-failed" }, "ERROR") : null,
      span.status.description ? h("span", { class: "error-text" }, span.status.description) : null),
    isReward ? renderReward(a) : null,
    isLlm ? renderLlmCall(a) : null,
    exception ? renderException(exception) : null,
    shown.length ? h("table", { class: "attrs" }, shown.map((k) => h("tr", {},
      h("th", { class: "mono" }, k), h("td", {}, attributeValue(a[k]))))) : null,
    span.events.length ? h("details", {}, h("summary", {}, `events (${span.events.length})`),
      h("pre", { class: "json" }, pretty(span.events))) : null,
    h("details", {}, h("summary", {}, `all attributes (${Object.keys(a).length})`), h("pre", { class: "json" }, pretty(a))),
  );
}

function attributeValue(value) {
  const parsed = parseJson(value);
  const text = typeof parsed === "string" ? parsed : pretty(parsed);
  if (text.length <= 300) return h("span", { class: typeof parsed === "string" ? "" : "mono" }, text);
  return h("details", {}, h("summary", {}, short(text.replace(/\s+/g, " "), 120)), h("pre", { class: "json" }, text));
}

function renderReward(a) {
  const dimensions = Object.keys(a).filter((k) => k.startsWith("agentgrad.reward.") && k !== "agentgrad.reward.primary");
  const agent = a["agentgrad.reward_agent"];
  return h("div", { class: "reward-value" }, "reward ", h("b", {}, fmtNumber(a["agentgrad.reward"])),
    agent ? h("span", { class: "role-tag", style: `border-color:${roleColor(agent)}` }, `for ${agent}`) : null,
    a["agentgrad.reward.primary"] ? h("span", { class: "muted" }, ` (primary: ${a["agentgrad.reward.primary"]})`) : null,
    dimensions.map((k) => h("span", { class: "chip" }, `${k.slice("agentgrad.reward.".length)} ${fmtNumber(a[k])}`)));
}

function renderException(e) {
  return h("div", { class: "exception" },
    h("b", {}, e["exception.type"] || "exception"), e["exception.message"] ? `: ${e["exception.message"]}` : "",
    e["exception.stacktrace"] ? h("details", {}, h("summary", {}, "stack trace"), h("pre", {}, e["exception.stacktrace"])) : null);
}

function renderLlmCall(a) {
  const count = (key) => {
    const value = parseJson(a[key]);
    return Array.isArray(value) ? value.length : null;
  };
  const facts = [
    ["model", a["gen_ai.response.model"] || a["gen_ai.request.model"]],
    ["weights version", a["agentgrad.llm.weights_version"]],
    ["agent", a["agentgrad.agent.name"]],
    ["adapter", a["agentgrad.adapter.name"]],
    ["input tokens", a["gen_ai.usage.input_tokens"]],
    ["output tokens", a["gen_ai.usage.output_tokens"]],
    ["latency", a["agentgrad.llm.latency_ms"] === undefined ? undefined : `${fmtNumber(a["agentgrad.llm.latency_ms"])} ms`],
    ["token ids", count("agentgrad.llm.prompt_token_ids") === null && count("agentgrad.llm.response_token_ids") === null ? undefined
      : `${count("agentgrad.llm.prompt_token_ids") ?? 0} prompt + ${count("agentgrad.llm.response_token_ids") ?? 0} response`],
    ["logprobs", count("agentgrad.llm.response_logprobs") ?? undefined],
    ["finish", a["gen_ai.response.finish_reasons"]],
  ].filter(([, v]) => v !== undefined && v !== null);
  const input = parseJson(a["gen_ai.input.messages"]);
  const output = parseJson(a["gen_ai.output.messages"]);
  return h("div", { class: "llm" },
    h("div", { class: "facts" }, facts.map(([k, v]) => h("span", { class: "chip" }, `${k} `, h("b", {}, Array.isArray(v) ? v.join(", ") : fmtValue(v))))),
    h("div", { class: "conversation" }, messages(input, "input"), messages(output, "output")));
}

function fmtValue(value) {
  return typeof value === "number" ? fmtNumber(value) : String(value);
}

/** OpenAI-shaped messages ({role, content, tool_calls}) or OpenTelemetry GenAI ones ({role, parts}). */
function messages(list, side) {
  if (list === undefined || list === null) return null;
  if (!Array.isArray(list)) return h("div", { class: `message ${side}` }, h("div", { class: "role" }, side), h("pre", {}, String(list)));
  return list.map((m) => {
    if (typeof m !== "object" || m === null) return h("div", { class: `message ${side}` }, h("pre", {}, String(m)));
    const parts = [];
    const content = m.content ?? m.text;
    if (typeof content === "string") parts.push(content);
    else if (Array.isArray(content)) for (const c of content) parts.push(typeof c === "string" ? c : c.text ?? pretty(c));
    else if (content !== undefined && content !== null) parts.push(pretty(content));
    for (const p of m.parts || []) parts.push(p.type === "text" ? p.content ?? "" : pretty(p));
    for (const call of m.tool_calls || []) {
      const f = call.function || {};
      parts.push(`→ ${f.name || "tool"}(${f.arguments || ""})`);
    }
    const role = m.role || side;
    return h("div", { class: `message ${side} role-${role.replace(/\W/g, "")}` },
      h("div", { class: "role" }, role, m.finish_reason ? h("span", { class: "muted" }, ` · ${m.finish_reason}`) : null),
      h("pre", {}, parts.join("\n")));
  });
}

// ---------------------------------------------------------------- resources

const resources = { signature: "" };

async function refreshResources() {
  const snapshots = await call("GET", "api/resources");
  const signature = JSON.stringify(snapshots);
  if (signature === resources.signature) return;
  resources.signature = signature;
  const latest = snapshots.length ? snapshots[snapshots.length - 1].resources_id : null;
  replace($("view-resources"),
    snapshots.length ? "" : h("p", { class: "empty" }, "No resources yet."),
    [...snapshots].reverse().map((s) => h("div", { class: "card" },
      h("div", { class: "card-head" },
        h("b", {}, `v${s.version}`), h("span", { class: "mono" }, s.resources_id),
        s.resources_id === latest ? h("span", { class: "badge s-running" }, "latest") : null,
        h("span", { class: "muted" }, clock(s.create_time)),
        Object.entries(s.metadata).map(([k, v]) => h("span", { class: "chip" }, `${k} `,
          h("b", { class: k === "parent" ? "mono" : "" }, typeof v === "object" ? JSON.stringify(v) : fmtValue(v))))),
      Object.entries(s.resources).map(([name, r]) => renderResource(name, r)))),
  );
}

function renderResource(name, r) {
  const head = h("div", {}, h("b", { class: "mono" }, name), h("span", { class: "muted" }, ` ${r.resource_type}`));
  if (r.resource_type === "prompt_template") {
    return h("div", { class: "resource" }, head, h("span", { class: "muted" }, `engine ${r.engine}`), h("pre", { class: "prompt" }, r.template));
  }
  if (r.resource_type === "llm") { // api_key stays out of the page
    return h("div", { class: "resource" }, head, h("dl", { class: "fields" },
      h("dt", {}, "model"), h("dd", { class: "mono" }, r.model),
      h("dt", {}, "base_url"), h("dd", { class: "mono" }, r.base_url),
      h("dt", {}, "proxied"), h("dd", {}, r.proxied ? "yes (gateway)" : "no"),
      Object.keys(r.sampling_parameters || {}).length
        ? [h("dt", {}, "sampling"), h("dd", { class: "mono" }, JSON.stringify(r.sampling_parameters))] : null));
  }
  const { api_key, ...rest } = r; // an unknown kind of resource: everything but a key
  return h("div", { class: "resource" }, head, h("pre", { class: "json" }, pretty(rest)));
}

// ---------------------------------------------------------------- workers

async function refreshWorkers() {
  const workers = await call("GET", "api/workers");
  replace($("view-workers"), workers.length ? h("table", { class: "grid" },
    h("thead", {}, h("tr", {}, ["worker", "status", "last heartbeat", "active attempts", "info"].map((c) => h("th", {}, c)))),
    h("tbody", {}, workers.map((w) => h("tr", {},
      h("td", { class: "mono" }, w.worker_id),
      h("td", {}, badge(w.status)),
      h("td", { title: clock(w.last_heartbeat_time) }, ago(w.last_heartbeat_time)),
      h("td", { class: "mono" }, w.active_attempts.length ? w.active_attempts.join(", ") : "–"),
      h("td", { class: "mono" }, Object.entries(w.info).map(([k, v]) => h("span", { class: "chip" }, `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)))))),
  ) : h("p", { class: "empty" }, "No worker has sent a heartbeat yet."));
}

// ---------------------------------------------------------------- runs

const RUN_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const runsView = { metric: null, hidden: new Set(), signature: "" };
/** The per-step figures a run's timeline shows (as `agentgrad runs show`: `cli/run_views.py` TIMELINE_FIGURES). */
const TIMELINE_FIGURES = ["train/model_version", "prompt/version", "val/accuracy", "prompt/kept", "prompt/score",
  "prompt/candidate_best", "train/rollback", "train/rollback_to_step"];

/** Every run the store recorded, and one chart with the chosen metric of each checked run, a line per run. */
async function refreshRuns() {
  const runs = await call("GET", "api/runs");
  const curves = new Map();
  for (const run of runs) curves.set(run.run_id, await call("GET", "api/metrics?run_id={run_id}", { run_id: run.run_id }));
  const names = [...new Set([...curves.values()].flat().map((p) => p.name))]
    .sort((a, b) => groupRank(groupOf(a)) - groupRank(groupOf(b)) || a.localeCompare(b));
  if (!names.includes(runsView.metric)) runsView.metric = names.includes("val/accuracy") ? "val/accuracy" : names[0] || null;
  const signature = JSON.stringify([runsView.metric, [...runsView.hidden], runs.map((r) => [r.run_id, r.status, r.end_time]),
    [...curves.values()].map((c) => c.length)]);
  if (signature === runsView.signature) return;
  runsView.signature = signature;
  const color = (i) => RUN_COLORS[i % RUN_COLORS.length];
  const series = runs.map((run, i) => ({
    label: `${run.name} (${run.run_id})`, color: color(i), hidden: runsView.hidden.has(run.run_id),
    points: curves.get(run.run_id).filter((p) => p.name === runsView.metric),
  })).filter((s) => !s.hidden && s.points.length);
  const toggle = (runId) => () => {
    if (runsView.hidden.has(runId)) runsView.hidden.delete(runId); else runsView.hidden.add(runId);
    refresh();
  };
  const best = (run) => {
    const entry = Object.entries(run.best).find(([k]) => k !== "step");
    return entry ? `${entry[0]} ${fmtNumber(entry[1])} @ step ${fmtNumber(run.best.step)}` : "–";
  };
  const bestCheckpoint = (run) => {
    if (!run.best_checkpoint) return run.checkpoints.length ? "none validated" : "–";
    const entry = Object.entries(run.best_checkpoint_validation || {}).find(([k]) => k !== "step");
    const at = entry ? ` (${entry[0]} ${fmtNumber(entry[1])} @ step ${fmtNumber(run.best_checkpoint_validation.step)})` : "";
    return run.best_checkpoint + at;
  };
  replace($("view-runs"), runs.length ? [
    h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, ["", "run", "name", "algorithm", "status", "started", "took", "best", "best checkpoint"]
        .map((c) => h("th", {}, c)))),
      h("tbody", {}, runs.map((run, i) => h("tr", {},
        h("td", {}, h("input", { type: "checkbox", checked: !runsView.hidden.has(run.run_id), onchange: toggle(run.run_id),
          "aria-label": `compare ${run.name}` }), h("span", { class: "swatch", style: `background:${color(i)}` })),
        h("td", { class: "mono" }, run.run_id),
        h("td", {}, run.name),
        h("td", {}, run.algorithm),
        h("td", {}, badge(run.status)),
        h("td", {}, clock(run.start_time)),
        h("td", {}, duration(run.start_time, run.end_time)),
        h("td", {}, best(run)),
        h("td", { class: "mono" }, bestCheckpoint(run)))))),
    h("h2", {}, "Compared: ", h("select", { id: "run-metric", onchange(event) { runsView.metric = event.target.value; refresh(); } },
      names.map((n) => h("option", { value: n, selected: n === runsView.metric }, n)))),
    compareChart(runsView.metric, series),
    runs.filter((run) => !runsView.hidden.has(run.run_id)).map((run) => timelineTable(run, curves.get(run.run_id))),
  ] : h("p", { class: "empty" }, "No runs yet. Every Trainer.fit records one here."));
}

/** A run's weights versions beside its prompt versions (Joint), step by step, with validation and what changed:
 * the same table as `agentgrad runs show`; nothing for a run that trained neither. */
function timelineTable(run, points) {
  const steps = new Map();
  for (const p of points) {
    if (!TIMELINE_FIGURES.includes(p.name)) continue;
    if (!steps.has(p.step)) steps.set(p.step, {});
    steps.get(p.step)[p.name] = p.value;
  }
  const all = [...steps.values()];
  if (!all.some((f) => "train/model_version" in f || "prompt/version" in f)) return [];
  const prompts = all.some((f) => "prompt/version" in f);
  let weights = 0, prompt = 0;
  const rows = [...steps.entries()].sort((a, b) => a[0] - b[0]).map(([step, f]) => {
    weights = f["train/model_version"] ?? weights;
    prompt = f["prompt/version"] ?? prompt;
    const events = [];
    if ("prompt/kept" in f) {
      const best = fmtNumber(f["prompt/candidate_best"] ?? 0), current = fmtNumber(f["prompt/score"] ?? 0);
      const kept = f["prompt/kept"] >= 1;  // kept only past chance: a higher score within chance is refused
      const chance = !kept && (f["prompt/candidate_best"] ?? 0) > (f["prompt/score"] ?? 0) ? ", within chance" : "";
      events.push(`prompt rewrite ${kept ? "kept" : "refused"} (${best} vs ${current}${chance})`);
    }
    if (f["train/rollback"]) events.push(`weights rolled back to step ${fmtNumber(f["train/rollback_to_step"] ?? 0)}`);
    return h("tr", {}, h("td", {}, String(step)), h("td", { class: "mono" }, `v${weights}`),
      h("td", { class: "mono" }, prompts ? `v${prompt}` : "–"),
      h("td", {}, "val/accuracy" in f ? fmtNumber(f["val/accuracy"]) : "–"), h("td", {}, events.join("; ")));
  });
  return [h("h2", {}, `Timeline of ${run.name}: weights and prompt versions`),
    h("table", { class: "grid timeline", "data-run": run.run_id },
      h("thead", {}, h("tr", {}, ["step", "weights", "prompt", "val acc", "event"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows))];
}

/** One SVG chart of a metric for several runs (or roles: `noun`): a coloured line each, a legend below. */
function compareChart(name, series, noun = "run") {
  const W = 720, H = 300, L = 52, R = 12, T = 12, B = 24;
  const all = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p.value));
  if (!all.length) return h("p", { class: "empty" }, `No checked ${noun} has this metric.`);
  let [x0, x1] = [Math.min(...all.map((p) => p.step)), Math.max(...all.map((p) => p.step))];
  let [y0, y1] = [Math.min(...all.map((p) => p.value)), Math.max(...all.map((p) => p.value))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
  const x = (step) => L + ((step - x0) / (x1 - x0)) * (W - L - R);
  const y = (value) => T + (1 - (value - y0) / (y1 - y0)) * (H - T - B);
  const grid = [y0, (y0 + y1) / 2, y1].map((v) => [
    svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "gridline" }),
    svg("text", { x: L - 4, y: y(v) + 3, class: "tick", "text-anchor": "end" }, fmtNumber(v)),
  ]);
  const xTicks = [x0, x1].map((s, i) =>
    svg("text", { x: x(s), y: H - 6, class: "tick", "text-anchor": i ? "end" : "start" }, `step ${fmtNumber(s)}`));
  const lines = series.map((s) => {
    const drawn = s.points.filter((p) => Number.isFinite(p.value));
    const d = drawn.map((p, i) => `${i ? "L" : "M"}${x(p.step).toFixed(1)},${y(p.value).toFixed(1)}`).join("");
    return [svg("path", { d, class: "run-line", stroke: s.color }),
      drawn.map((p) => svg("circle", { cx: x(p.step), cy: y(p.value), r: 2.5, fill: s.color }))];
  });
  return h("figure", { class: "chart compare" },
    h("figcaption", {}, h("span", { class: "mono" }, name), h("span", { class: "muted" }, ` ${series.length} ${noun}s`)),
    svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": `${name} by ${noun}` }, grid, xTicks, lines),
    h("ul", { class: "legend" }, series.map((s) => h("li", {}, h("span", { class: "swatch", style: `background:${s.color}` }), s.label,
      h("span", { class: "muted" }, ` last ${fmtNumber(s.points[s.points.length - 1].value)}`)))));
}

// ---------------------------------------------------------------- views, polling, token

const VIEWS = {
  curves: refreshCurves,
  rollouts: refreshRollouts,
  rollout: refreshRollout,
  resources: refreshResources,
  workers: refreshWorkers,
  runs: refreshRuns,
};

/** `#rollout/<id>[/<attempt id>]`, `#rollouts`, `#resources`, ...; anything else shows the curves. */
function route() {
  const [view, rolloutId, attemptId] = location.hash.slice(1).split("/").map(decodeURIComponent);
  state.view = view in VIEWS ? view : "curves";
  if (state.view === "rollout" && rolloutId !== state.rolloutId) detail.signature = "";
  if (state.view === "rollout" && attemptId !== state.attemptId) detail.signature = "";
  state.rolloutId = rolloutId || null;
  state.attemptId = attemptId || null;
  for (const name of Object.keys(VIEWS)) $(`view-${name}`).hidden = name !== state.view;
  for (const tab of document.querySelectorAll("#tabs a")) {
    tab.classList.toggle("active", tab.dataset.view === state.view || (state.view === "rollout" && tab.dataset.view === "rollouts"));
  }
  refresh();
}

let busy = false, again = false;

/** Header and the visible view; a call made while one runs is folded into one more run after it. */
async function refresh() {
  if (busy) { again = true; return; }
  busy = true;
  try {
    await refreshHeader();
    await VIEWS[state.view]();
    showError(null);
  } catch (error) {
    if (error instanceof Unauthorized) askForToken(error.message);
    else showError(error.message || String(error));
  } finally {
    busy = false;
    if (again) { again = false; refresh(); }
  }
}

function showError(message) {
  $("error-bar").hidden = !message;
  $("error-bar").textContent = message || "";
}

function askForToken(message) {
  $("token-message").textContent = `${message[0].toUpperCase()}${message.slice(1)}: paste it to see this store.`;
  $("token-bar").hidden = false;
}

function setupToken() {
  $("token-bar").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token-input").value = "";
    $("token-bar").hidden = true;
    refresh();
  });
}

function start() {
  buildFilters();
  setupToken();
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") refresh(); });
  setInterval(() => {
    if (document.visibilityState === "visible" && $("token-bar").hidden) refresh();
  }, POLL_MS);
  route();
}

start();
