// Podium console: the pages (overview, model, rollout, events), their pieces and forms.
// Loaded before console.js; what it uses from there ($, esc, api, act, view) is read
// when a page renders, not at load.
"use strict";

// Where the views of related things plug in (related.js: adapters under their base model,
// pipelines with their steps): each list holds functions returning HTML, called with the model's
// name, its status entry and the page's data (`overview`: the status; `model`: what its fetch
// read), or the model, a version and its region (`version`).
const hooks = {overview: [], model: [], version: []};

// --- traffic figures per version (GET /v1/traffic: the gateways' reports, bucketed) ---

function points(traffic, version) {
  // complete buckets only: the last one is still filling
  const v = traffic && traffic.versions[version];
  if (!v) return [];
  const step = traffic.step_ms / 1000;
  return v.buckets.slice(0, -1).map((b) => ({t: b.start_ms, rate: b.num_requests / step,
    errors: b.num_requests ? b.num_errors / b.num_requests : null, p50: b.p50_ms, p99: b.p99_ms}));
}

function spark(points, field, label) {
  const values = points.map((p) => p[field]).filter((v) => v !== null);
  if (values.length < 2) return `<svg class="spark" role="img" aria-label="${esc(label)}: not enough samples yet"></svg>`;
  const max = Math.max(...values, 1e-9);
  const t0 = points[0].t;
  const span = Math.max(points[points.length - 1].t - t0, 1);
  const xy = points.filter((p) => p[field] !== null)
    .map((p) => `${(100 * (p.t - t0) / span).toFixed(1)},${(28 - 26 * p[field] / max).toFixed(1)}`);
  return `<svg class="spark" viewBox="0 0 100 30" preserveAspectRatio="none" role="img"
    aria-label="${esc(label)} over the last ${Math.round(span / 1000)} s, peak ${fmt(max)}">
    <polyline points="${xy.join(" ")}" /></svg>`;
}

// LLM figures per version (GET /v1/engines), kept between polls for their small charts
const engineHistory = {};  // "model\u0000version" -> [{t, tokens, ttft99, kv, waiting}]

function engineRows(model, version, figures) {
  if (!figures) return "";
  const id = model + "\u0000" + version;
  const kept = (engineHistory[id] ||= []);
  const now = Date.now();
  kept.push({t: now, tokens: figures.generated_per_s, ttft99: figures.ttft_p99_ms,
             kv: figures.kv_cache_usage, waiting: figures.waiting});
  while (kept.length > 2 && now - kept[0].t > 10 * 60 * 1000) kept.shift();
  const ms = (x) => (x === null || x === undefined ? "–" : fmt(x, 0) + " ms");
  return `<dl class="llm"><dt>tokens/s</dt><dd class="tokens">${fmt(figures.generated_per_s, 1)}</dd>${spark(kept, "tokens", "generated tokens per second")}
    <dt>TTFT p50 / p99</dt><dd class="ttft">${ms(figures.ttft_p50_ms)} / ${ms(figures.ttft_p99_ms)}</dd>${spark(kept, "ttft99", "time to first token p99")}
    <dt>KV cache</dt><dd class="kv">${figures.kv_cache_usage === null ? "–" : fmt(100 * figures.kv_cache_usage, 0) + "%"}</dd>${spark(kept, "kv", "KV-cache usage")}
    <dt>queue</dt><dd class="queue">${figures.waiting ?? "–"} waiting, ${figures.running ?? "–"} running</dd>${spark(kept, "waiting", "requests waiting")}
    </dl><p class="muted small">engines of ${figures.num_read}/${figures.num_ready} ready instance(s)</p>`;
}

function fmt(x, digits = 2) {
  return x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(digits);
}

// --- pieces ---

function splitBar(model, splits) {
  const entries = Object.entries(splits || {}).filter(([, w]) => w > 0)
    .sort(([a], [b]) => a.localeCompare(b, undefined, {numeric: true}));
  if (!entries.length) return `<p class="muted">no traffic split</p>`;
  const parts = entries.map(([version, weight], i) =>
    `<span class="seg c${i % 4}" style="width:${weight}%" data-version="${esc(version)}"
      title="${esc(version)}: ${weight}%">${esc(version)} ${weight}%</span>`);
  const text = entries.map(([v, w]) => `${v} ${w}%`).join(", ");
  return `<div class="split" role="img" aria-label="traffic split of ${esc(model)}: ${esc(text)}"
    data-split="${esc(text)}">${parts.join("")}</div>`;
}

function instanceBadges(instances) {
  if (!instances.length) return `<span class="muted">none</span>`;
  return instances.map((i) => `<span class="badge ${esc(i.state)}"
    title="instance ${i.id}, pid ${i.pid ?? "–"}, port ${i.http_port ?? "–"}, restarts ${i.num_restarts}">
    ${esc(i.state)}</span>`).join(" ");
}

function regionTable(region, entry) {
  const rows = Object.entries(entry.versions).map(([version, d]) => `<tr>
    <td>${esc(version)}${entry.aliases.latest === version ? ` <span class="tag">latest</span>` : ""}</td>
    <td>${esc(d.state)}</td><td>${esc(d.strategy)}</td><td>${entry.splits[version] ?? 0}%</td>
    <td>${d.num_desired} <span class="muted">(${d.min_instances}..${d.max_instances})</span>
      ${d.num_desired === 0 ? `<span class="tag">scaled to zero</span>` : ""}</td>
    <td>${instanceBadges(d.instances)}</td></tr>`).join("");
  return `<table class="versions"><caption>region ${esc(region)}</caption><thead><tr><th>version</th><th>state</th>
    <th>strategy</th><th>traffic</th><th>instances wanted</th><th>instances</th></tr></thead>
    <tbody>${rows}</tbody></table>`;
}

function gatewayTable(gateways) {
  if (!gateways) return "";
  const rows = gateways.map((g) => `<tr><td>${esc(g.region ?? "")} ${esc(g.id)}</td><td>${esc(g.pid)}</td>
    <td>${esc(g.http)}</td><td><span class="badge ${g.live ? "ready" : "failed"}">${g.live ? "live" : "silent"}</span>
    <span class="badge ${g.in_sync ? "ready" : "starting"}">${g.in_sync ? "in sync" : "behind"}</span></td>
    <td>${g.seen_s_ago < 2 ? "just now" : Math.round(g.seen_s_ago) + " s ago"}</td><td>${esc(g.num_outcomes)}</td></tr>`).join("");
  return `<h2>Gateways <span class="muted">(${gateways.length})</span></h2>
    <table class="gateways"><thead><tr><th>gateway</th><th>pid</th><th>address</th><th>state</th>
    <th>last heard</th><th>outcomes reported</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function rolloutLink(r) {
  return `<a href="#/rollout/${r.id}">rollout ${r.id}</a>: ${esc(r.model)}
    ${esc(r.from_version ?? "–")} → ${esc(r.to_version)}, <span class="status ${esc(r.status)}">${esc(r.status)}</span>,
    stage ${esc(r.stage)}, phase ${esc(r.phase)}, new at ${r.weight_new}%`;
}

// --- views ---

const views = {
  overview: {
    fetch: async () => {
      const [status, gateways] = await Promise.all([
        api("/v1/status"), api("/v1/gateways").catch(() => null)]);  // none: no gateway routes
      return {...status, gateways};
    },
    live(status) {
      const models = Object.entries(status.models);
      fillList("model-names", models.map(([name]) => name));
      const running = status.rollouts.length
        ? `<ul class="plain">${status.rollouts.map((r) => `<li>${rolloutLink(r)}</li>`).join("")}</ul>`
        : `<p class="muted">no rollout running</p>`;
      // an adapter is shown under its base (it runs on the base's instances)
      const cards = models.filter(([, m]) => !(m.base && status.models[m.base])).map(([name, m]) => `<article class="card" data-model="${esc(name)}">
        <h3><a href="#/model/${esc(name)}">${esc(name)}</a>
          <span class="muted">latest: ${esc(m.aliases.latest ?? "–")}</span></h3>
        ${splitBar(name, m.splits)}
        ${Object.entries(m.regions).map(([region, entry]) => regionTable(region, entry)).join("")}
        ${hooks.overview.map((f) => f(name, m, status)).join("")}
      </article>`).join("");
      return `<h2>Running rollouts</h2>${running}${gatewayTable(status.gateways)}
        <h2>Models <span class="muted">(${models.length})</span></h2>
        ${cards || `<p class="muted">nothing deployed yet</p>`}`;
    },
  },

  model: {
    fetch: async (name) => {
      const [status, rollouts] = await Promise.all([
        api("/v1/status"), api("/v1/rollouts?model=" + encodeURIComponent(name))]);
      const regions = status.models[name] ? Object.keys(status.models[name].regions) : [];
      // each region's gateways report to their own routes (`/regions/NAME/...` once declared);
      // none there (a bare API): no figures, the rest of the page still shows
      const at = (r) => (r === "default" ? "" : "/regions/" + encodeURIComponent(r));
      const q = "?model=" + encodeURIComponent(name);
      const read = await Promise.all(regions.map((r) => Promise.all([
        api(`${at(r)}/v1/traffic${q}&span_s=600&step_s=10`).catch(() => null),
        api(`${at(r)}/v1/engines${q}`).catch(() => null)])));
      const figures = Object.fromEntries(regions.map((r, i) => [r, {traffic: read[i][0], engines: read[i][1]}]));
      // adapters' own figures (routed per adapter version), a pipeline's steps (none: not one)
      const adapters = (status.models[name] || {}).adapters || [];
      const [pipelines, ...adapterTraffic] = await Promise.all([
        api("/v1/pipelines" + q).catch(() => null),
        ...adapters.map((a) => {  // the adapter's first region (the overview's too)
          const region = status.models[a] ? Object.keys(status.models[a].regions)[0] : "default";
          return api(`${at(region)}/v1/traffic?model=${encodeURIComponent(a)}&span_s=60&step_s=10`).catch(() => null);
        })]);
      return {status, rollouts, figures, name, pipelines,
              adapterTraffic: Object.fromEntries(adapters.map((a, i) => [a, adapterTraffic[i]]))};
    },
    actions: (name) => deployForm(name) + scaleForm(name) + `<div class="panel">
      <h2>Roll back</h2><button type="button" id="rollback">Roll ${esc(name)} back</button></div>`,
    live(data) {
      const {status, rollouts, figures, name} = data;
      const m = status.models[name];
      if (!m) return `<h2>${esc(name)}</h2><p class="muted">not deployed</p>`;
      const versions = [...new Set(Object.values(m.regions).flatMap((e) => Object.keys(e.versions)))];
      fillList("version-names", versions);
      const ms = (x) => (x === null || x === undefined ? "–" : fmt(x, 1) + " ms");
      const several = Object.keys(m.regions).length > 1;
      const cols = Object.entries(m.regions).flatMap(([region, entry]) => Object.keys(entry.versions).map((v) => {
        const {traffic, engines} = figures[region] || {};
        const s = points(traffic, v);
        const recent = traffic && traffic.versions[v] ? traffic.versions[v].recent : null;
        const n = recent ? recent.num_requests : 0;
        const err = n ? recent.num_errors / n : null;
        return `<article class="card version" data-version="${esc(v)}" data-region="${esc(region)}">
          <h3>${esc(v)}${several ? ` <span class="tag">${esc(region)}</span>` : ""}
            <span class="muted">${entry.splits[v] ?? 0}% of traffic</span></h3>
          <p class="muted small">last minute; charts: 10 s buckets over 10 min</p>
          <dl><dt>requests/s</dt><dd class="rate">${fmt(recent ? n / 60 : null)}</dd>${spark(s, "rate", "requests per second")}
          <dt>error rate</dt><dd class="errors">${err === null ? "–" : fmt(100 * err, 1) + "%"}</dd>${spark(s, "errors", "error rate")}
          <dt>p50 latency</dt><dd class="p50">${ms(recent && recent.p50_ms)}</dd>${spark(s, "p50", "p50 latency")}
          <dt>p99 latency</dt><dd class="p99">${ms(recent && recent.p99_ms)}</dd>${spark(s, "p99", "p99 latency")}
          </dl>${engineRows(name + "\u0000" + region, v, engines && engines.versions[v])}
          ${hooks.version.map((f) => f(name, v, region)).join("")}</article>`;
      })).join("");
      return `<h2>${esc(name)} <span class="muted">latest: ${esc(m.aliases.latest ?? "–")}</span></h2>
        ${splitBar(name, m.splits)}
        <div class="grid">${cols}</div>
        ${Object.entries(m.regions).map(([region, entry]) => regionTable(region, entry)).join("")}
        ${hooks.model.map((f) => f(name, m, data)).join("")}
        <h2>Rollouts</h2><ul class="plain">${rollouts.map((r) => `<li>${rolloutLink(r)}</li>`).join("")}</ul>`;
    },
  },

  rollout: {
    fetch: async (id) => {
      const [r, status] = await Promise.all([
        api("/v1/rollouts/" + encodeURIComponent(id)), api("/v1/status")]);
      const model = status.models[r.model];
      const entry = model && ((r.region && model.regions[r.region]) || model);
      return {...r, splits: entry ? entry.splits : {}};
    },
    actions: () => `<div class="panel"><h2>Steer</h2><div class="row">
      <button type="button" id="pause" disabled>Pause</button>
      <button type="button" id="resume" disabled>Resume</button>
      <button type="button" id="rollback">Roll this model back</button></div></div>`,
    live(r) {
      view.model = r.model;
      view.rollout = r;
      const rollingBack = ["roll_back", "unwind"].includes(r.phase);
      $("#pause").disabled = r.status !== "running" || r.phase === "paused" || rollingBack;
      $("#resume").disabled = r.status !== "running" || r.phase !== "paused";
      $("#rollback").textContent = r.status === "running" ? "Abort: roll back now" : "Roll this model back";
      const stages = r.config.stages || [100];
      const current = Number(String(r.stage).split("/")[0]) - 1;
      const done = r.status !== "running";
      const track = stages.map((pct, i) => {
        const state = done ? (r.status === "succeeded" ? "passed" : (i <= current ? "failed" : "skipped"))
          : (i < current ? "passed" : (i === current ? "current" : "pending"));
        return `<li class="stage ${state}" data-stage="${i + 1}"${state === "current" ? ` aria-current="step"` : ""}>
          <strong>${pct}%</strong> <span>${state}</span></li>`;
      }).join("");
      const steps = r.steps.map((s) => `<li class="step ${/analysis (passed|failed)/.test(s.note) ? "verdict" : ""}">
        <span class="muted">#${s.seq} +${((s.at_ms - r.steps[0].at_ms) / 1000).toFixed(1)} s</span>
        <strong>${esc(s.phase)}</strong> ${esc(s.note)}</li>`).join("");
      const paused = r.paused_since_ms !== null && r.paused_since_ms !== undefined
        ? `<p class="reason" id="paused"><strong>paused</strong> since ${esc(new Date(r.paused_since_ms).toLocaleTimeString())}:
          it holds this stage (no step, no analysis) until resumed</p>` : "";
      const reason = r.reason ? `<p class="reason" data-reason><strong>${
        r.status === "succeeded" ? "note" : "rollback reason"}:</strong> ${esc(r.reason)}</p>` : "";
      return `<h2 id="rollout-title">Rollout ${r.id}: <a href="#/model/${esc(r.model)}">${esc(r.model)}</a>
          ${esc(r.from_version ?? "–")} → ${esc(r.to_version)}</h2>
        <p><span class="status ${esc(r.status)}" id="rollout-status">${esc(r.status)}</span>
          ${esc(r.strategy)}, stage <span id="rollout-stage">${esc(r.stage)}</span>,
          phase ${esc(r.phase)}, new version at ${r.weight_new}%${r.region ? `, region ${esc(r.region)}` : ""}</p>
        ${paused}${reason}
        <h3>Traffic now</h3>${splitBar(r.model, r.splits)}
        <ol class="timeline" aria-label="stages">${track}</ol>
        <h3>Steps and analysis verdicts</h3><ol class="steps">${steps}</ol>`;
    },
  },

  events: {
    fetch: async () => {
      const model = ($("#event-model") || {}).value || "";
      return api("/v1/events?limit=200" + (model ? "&model=" + encodeURIComponent(model) : ""));
    },
    actions: () => `<form class="panel row" id="event-filter" onsubmit="return false">
      <label for="event-model">Model</label>
      <input id="event-model" list="model-names" placeholder="all models"></form>`,
    live: (events) => `<h2>Events</h2><table class="events"><thead><tr><th>time</th><th>kind</th>
      <th>model</th><th>message</th></tr></thead><tbody>${events.map((e) => `<tr>
      <td>${esc(e.at.replace("T", " ").slice(0, 19))}</td><td>${esc(e.kind)}</td>
      <td>${e.model ? `<a href="#/model/${esc(e.model)}">${esc(e.model)}</a>` : ""}</td>
      <td>${esc(e.message)}</td></tr>`).join("")}</tbody></table>`,
  },
};

function deployForm(name) {
  return `<form class="panel" id="deploy"><h2>Deploy</h2><div class="row">
    <label>Version <input name="version" required list="version-names"></label>
    <label>Strategy <select name="strategy"><option value="red-black">red-black</option>
      <option value="versioned">versioned</option></select></label>
    <label>Stages (%) <input name="stages" placeholder="10,50,100"></label>
    <label>Instances <input name="num_instances" type="number" min="1" max="64"></label>
    <button type="submit" class="primary">Deploy ${esc(name)}</button></div>
    <details><summary>Analysis settings (blank: the plane's defaults)</summary><div class="row">
    <label>Analysis window (ms) <input name="analysis_window_ms" type="number" min="0"></label>
    <label>Min requests <input name="min_requests" type="number" min="0"></label>
    <label>Warm delay (ms) <input name="warm_delay_ms" type="number" min="0"></label>
    <label>Ready timeout (ms) <input name="ready_timeout_ms" type="number" min="0"></label>
    <label>Max error rate increase <input name="max_error_rate_increase" type="number" min="0" step="any"></label>
    <label>Max p99 ratio <input name="max_p99_ratio" type="number" min="0" step="any"></label>
    <label>p99 slack (ms) <input name="p99_slack_ms" type="number" min="0" step="any"></label>
    </div></details></form>`;
}

function scaleForm(name) {
  return `<form class="panel" id="scale"><h2>Scale</h2><div class="row">
    <label>Version <input name="version" required list="version-names"></label>
    <label>Min <input name="min_instances" type="number" min="0" max="64" required></label>
    <label>Max <input name="max_instances" type="number" min="0" max="64" required></label>
    <button type="submit">Scale ${esc(name)}</button></div></form>`;
}

function wireActions(name) {
  const deploy = $("#deploy");
  if (deploy) deploy.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(deploy);
    const body = {model: name, version: f.get("version"), strategy: f.get("strategy")};
    if (f.get("stages")) body.stages = f.get("stages").split(",").map((s) => Number(s.trim()));
    for (const field of ["num_instances", "analysis_window_ms", "min_requests", "warm_delay_ms",
      "ready_timeout_ms", "max_error_rate_increase", "max_p99_ratio", "p99_slack_ms"]) {
      if (f.get(field)) body[field] = Number(f.get(field));
    }
    const r = await act(`Deploy ${name}@${body.version} (${body.strategy}${body.stages ? ", stages " + body.stages.join("/") + "%" : ""})?`,
      "/v1/rollouts", {method: "POST", body: JSON.stringify(body)});
    if (r) location.hash = "#/rollout/" + r.id;
  });
  const scale = $("#scale");
  if (scale) scale.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(scale);
    const body = {min_instances: Number(f.get("min_instances")), max_instances: Number(f.get("max_instances"))};
    await act(`Scale ${name}@${f.get("version")} to ${body.min_instances}..${body.max_instances} instances?`,
      `/v1/deployments/${encodeURIComponent(name)}/${encodeURIComponent(f.get("version"))}/scaling`,
      {method: "PUT", body: JSON.stringify(body)});
  });
  const rollback = $("#rollback");
  if (rollback) rollback.addEventListener("click", async () => {
    const model = name || view.model;
    const running = view.name === "rollout" && view.rollout && view.rollout.status === "running";
    const r = await act(running ? `Abort rollout ${view.rollout.id} of ${model} and roll back to ${view.rollout.from_version ?? "nothing"}?`
      : `Roll ${model} back to its previous version?`,
      `/v1/models/${encodeURIComponent(model)}/rollback`, {method: "POST"});
    if (r) location.hash = "#/rollout/" + r.id;
  });
  for (const action of ["pause", "resume"]) {
    const button = $("#" + action);
    if (button) button.addEventListener("click", async () => {
      const r = view.rollout;
      if (!r) return;
      await act(`${action === "pause" ? "Pause" : "Resume"} rollout ${r.id} of ${r.model} (${r.from_version ?? "–"} → ${r.to_version}) at stage ${r.stage}?`,
        `/v1/rollouts/${encodeURIComponent(r.id)}/${action}`, {method: "POST"});
    });
  }
  const filter = $("#event-model");
  if (filter) filter.addEventListener("input", () => poll());
}

