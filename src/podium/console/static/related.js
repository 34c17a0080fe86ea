// Podium console: what hangs off a model. LoRA adapters under their base model (overview and
// the base's page, with each adapter version's figures from /v1/traffic: they are routed per
// adapter version), and a pipeline's steps with their latency, outcomes and variant split
// (GET /v1/pipelines). Loaded after views.js: it plugs into its `hooks`.
"use strict";

function adapterSection(base, m, status, traffic) {
  const names = (m.adapters || []).filter((a) => status.models[a]);
  if (!names.length) return "";
  const ms = (x) => (x === null || x === undefined ? "–" : fmt(x, 1) + " ms");
  const withFigures = traffic !== null;
  const sections = names.map((name) => {
    const a = status.models[name];
    const t = withFigures ? traffic[name] : null;
    const rows = Object.entries(a.versions).map(([v, d]) => {
      const recent = t && t.versions[v] ? t.versions[v].recent : null;
      const n = recent ? recent.num_requests : 0;
      const figures = withFigures ? `<td class="rate">${fmt(recent ? n / 60 : null)}</td>
        <td class="errors">${n ? fmt(100 * recent.num_errors / n, 1) + "%" : "–"}</td>
        <td class="p50">${ms(recent && recent.p50_ms)}</td><td class="p99">${ms(recent && recent.p99_ms)}</td>` : "";
      return `<tr data-version="${esc(v)}"><td>${esc(v)}${a.aliases.latest === v ? ` <span class="tag">latest</span>` : ""}</td>
        <td>${esc(d.state)}</td><td class="share">${a.splits[v] ?? 0}%</td>
        <td>${instanceBadges(d.instances)}</td>${figures}</tr>`;
    }).join("");
    return `<section class="adapter" data-adapter="${esc(name)}">
      <h4><a href="#/model/${esc(name)}">${esc(name)}</a>
        <span class="muted">LoRA adapter, latest: ${esc(a.aliases.latest ?? "–")}</span></h4>
      ${splitBar(name, a.splits)}
      <table class="versions"><thead><tr><th>version</th><th>state</th><th>traffic</th><th>on instances</th>
      ${withFigures ? "<th>requests/s</th><th>error rate</th><th>p50</th><th>p99</th>" : ""}</tr></thead>
      <tbody>${rows}</tbody></table></section>`;
  }).join("");
  return `<div class="adapters"><h3>Adapters of ${esc(base)} <span class="muted">(${names.length}; they run on its instances${
    withFigures ? "; figures: last minute" : ""})</span></h3>${sections}</div>`;
}

function adapterOf(name, m) {
  return m.base ? `<p class="adapter-of">LoRA adapter of <a href="#/model/${esc(m.base)}">${esc(m.base)}</a>:
    it runs on that model's instances (scale ${esc(m.base)} to scale it)</p>` : "";
}

function variantBar(version, variants) {
  const entries = Object.entries(variants).filter(([, n]) => n > 0);
  const total = entries.reduce((sum, [, n]) => sum + n, 0);
  if (!total) return `<p class="muted">no request yet</p>`;
  const pct = (n) => fmt(100 * n / total, 1);
  const text = entries.map(([v, n]) => `${v} ${pct(n)}% (${n})`).join(", ");
  return `<div class="split variants" role="img" aria-label="variant split of version ${esc(version)}: ${esc(text)}"
    data-split="${esc(text)}">${entries.map(([v, n], i) => `<span class="seg c${i % 4}" style="width:${pct(n)}%"
    data-variant="${esc(v)}" title="${esc(v)}: ${n} requests">${esc(v)} ${pct(n)}%</span>`).join("")}</div>`;
}

function pipelineSection(pipelines) {
  if (!pipelines) return "";
  const ms = (x) => (x === null || x === undefined ? "–" : fmt(x, 1) + " ms");
  return Object.entries(pipelines.versions).map(([v, p]) => {
    const rows = p.steps.map((s) => `<tr data-step="${esc(s.step)}"><td>${esc(s.step)}</td>
      <td class="requests">${s.num_requests}</td><td class="mean">${ms(s.mean_ms)}</td>
      <td class="p50">${ms(s.p50_ms)}</td><td class="p99">${ms(s.p99_ms)}</td>
      <td class="outcomes">${Object.entries(s.outcomes).filter(([, n]) => n > 0)
        .map(([o, n]) => `<span class="badge ${o === "ok" ? "ready" : o === "not_run" ? "starting" : "failed"}">${esc(o)} ${n}</span>`).join(" ")}</td>
      <td class="by-variant">${Object.entries(s.variants).map(([x, n]) => `${esc(x)} ${n}`).join(", ")}</td></tr>`).join("");
    return `<section class="card pipeline" data-version="${esc(v)}">
      <h3>Pipeline ${esc(v)}: steps <span class="muted">since its instances started; ${p.num_read}/${p.num_ready} ready instance(s) read</span></h3>
      <h4>Variant split</h4>${variantBar(v, p.variants)}
      <table class="pipeline-steps"><thead><tr><th>step</th><th>requests</th><th>mean</th><th>p50</th>
      <th>p99</th><th>outcomes</th><th>per variant</th></tr></thead>
      <tbody>${rows || `<tr><td colspan="7" class="muted">no step run yet</td></tr>`}</tbody></table></section>`;
  }).join("");
}

hooks.overview.push((name, m, status) => adapterSection(name, m, status, null));
hooks.model.push((name, m) => adapterOf(name, m));
hooks.model.push((name, m, data) => adapterSection(name, m, data.status, data.adapterTraffic || {}));
hooks.model.push((name, m, data) => pipelineSection(data.pipelines));
