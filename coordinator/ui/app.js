// Sluice's web UI: the coordinator's REST API (/v1/...) rendered; no other source of
// data. Hash routes: #/ (jobs and workers), #/jobs/ID (a job: graph coloured by busy and
// back-pressured time, throughput and watermark lag, checkpoints, restarts).
"use strict";

const main = document.getElementById("main");
let timer = null;
// Samples of the job on view, for the charts: {t (ms), records_in, watermark}.
let history = [];
let historyJob = null;

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// A coordinator started with --auth-tokens wants a bearer token: the user pastes it
// once; it stays in this tab's session storage only.
const TOKEN_KEY = "sluice-token";

class NeedsToken extends Error {}

async function get(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const r = await fetch(path, token ? { headers: { Authorization: `Bearer ${token}` } } : {});
  if (r.status === 401) throw new NeedsToken((await r.json().catch(() => ({}))).error || "a token is needed");
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

function tokenForm(why) {
  if (document.getElementById("token-form")) return;
  if (timer) clearInterval(timer);
  main.innerHTML =
    `<form id="token-form"><p>This coordinator needs a token: ${esc(why)}</p>` +
    `<input id="token" type="password" autocomplete="off" placeholder="token (sluice token new)" size="70"> ` +
    `<button type="submit">Use it</button></form>`;
  document.getElementById("token-form").addEventListener("submit", ev => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    start();
  });
}

function table(header, rows) {
  const head = header.map(h => `<th>${esc(h)}</th>`).join("");
  const body = rows.map(r => `<tr>${r.map(c => `<td>${c}</td>`).join("")}</tr>`).join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

// A task's busy share as Flink counts it: the time it was neither idle nor
// back-pressured (a sink in a slow call is busy), or what it reported, if more.
function busyShare(t) {
  return Math.max(t.busy_ms_per_s, 1000 - t.idle_ms_per_s - t.backpressured_ms_per_s) / 1000;
}

// A task's state as Flink's back-pressure view shows it: back-pressured (waiting for
// room downstream), busy (handling records) or idle (waiting for input).
function taskState(t) {
  const busy = busyShare(t), bp = t.backpressured_ms_per_s / 1000;
  if (bp >= 0.5) return "backpressured";
  if (busy >= 0.5) return "busy";
  return "idle";
}

function taskColour(t) {
  const busy = busyShare(t), bp = t.backpressured_ms_per_s / 1000;
  if (bp >= 0.5) return `hsl(0, 0%, ${Math.round(45 - 25 * bp)}%)`;
  // Blue (idle) through red (busy).
  return `hsl(${Math.round(220 - 220 * busy)}, 70%, 45%)`;
}

async function overview() {
  const [jobs, workers] = await Promise.all([get("/v1/jobs"), get("/v1/workers")]);
  main.innerHTML =
    `<h2>Jobs</h2>` +
    table(["Job", "Name", "State", "Parallelism", "Records in", "Records out", "Restarts", "Last checkpoint"],
      jobs.map(j => [`<a class="job" href="#/jobs/${encodeURIComponent(j.id)}">${esc(j.id)}</a>`, esc(j.name),
        `<span class="state-${esc(j.state)}">${esc(j.state)}</span>`, j.parallelism, j.records_in, j.records_out,
        j.restarts, esc(j.last_checkpoint ?? "-")])) +
    `<h2>Workers</h2>` +
    table(["Worker", "Host", "Slots", "Jobs", "Memory (MiB)"],
      workers.map(w => [esc(w.id), esc(w.host), w.slots, esc(w.jobs.join(", ")), (w.rss_bytes / 1048576).toFixed(0)])) +
    `<p>State nodes do not register with the coordinator yet: see their own /metrics.</p>`;
}

// An inline SVG line of `values` (numbers), `w` by `h` pixels.
function sparkline(cls, values, w = 480, h = 80) {
  if (values.length < 2) return `<svg class="${cls}" width="${w}" height="${h}"></svg>`;
  const max = Math.max(...values, 1), step = w / (values.length - 1);
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(h - (v / max) * (h - 4) - 2).toFixed(1)}`).join(" ");
  return `<svg class="${cls}" width="${w}" height="${h}"><polyline fill="none" stroke="#1d3557" stroke-width="1.5" points="${points}"/></svg>`;
}

async function jobPage(id) {
  const job = await get(`/v1/jobs/${encodeURIComponent(id)}`);
  if (historyJob !== id) { history = []; historyJob = id; }
  const now = Date.now();
  history.push({ t: now, records_in: job.records_in, watermark: job.watermark });
  history = history.filter(s => now - s.t <= 5 * 60 * 1000);
  const rates = history.slice(1).map((s, i) => Math.max(0, (s.records_in - history[i].records_in) / ((s.t - history[i].t) / 1000)));
  const lags = history.filter(s => s.watermark != null).map(s => Math.max(0, (s.t - s.watermark) / 1000));

  const nodes = (job.nodes || []).filter(n => job.tasks.some(t => t.task.startsWith(n + "[")));
  for (const t of job.tasks) {
    const n = t.task.split("[")[0];
    if (!nodes.includes(n)) nodes.push(n);
  }
  const graph = nodes.map(n => {
    const tasks = job.tasks.filter(t => t.task.startsWith(n + "["));
    const cells = tasks.map(t =>
      `<div class="task" data-task="${esc(t.task)}" data-state="${taskState(t)}" style="background:${taskColour(t)}"` +
      ` title="busy ${t.busy_ms_per_s / 10}%, back-pressured ${t.backpressured_ms_per_s / 10}%, idle ${t.idle_ms_per_s / 10}%">` +
      `${esc(t.task)} · ${taskState(t)} ${Math.round(({ backpressured: t.backpressured_ms_per_s, busy: busyShare(t) * 1000, idle: t.idle_ms_per_s })[taskState(t)] / 10)}%` +
      `${t.watermark_held_by ? ` · watermark held by ${esc(t.watermark_held_by)}` : ""}</div>`).join("");
    return `<div class="node" data-node="${esc(n)}"><h3>${esc(n)}</h3>${cells}</div>`;
  }).join(`<div class="arrow">→</div>`);

  const checkpoints = job.checkpoints.slice().reverse().map(c => [
    `<span class="checkpoint">${c.id}</span>`, esc(c.savepoint ?? ""), c.duration_ms, (c.max_alignment_micros / 1000).toFixed(1),
    (c.max_sync_micros / 1000).toFixed(1), c.tasks]);

  main.innerHTML =
    `<h2>${esc(job.name)} <small>${esc(job.id)}</small></h2>` +
    `<p>State: <b class="state-${esc(job.state)}" id="job-state">${esc(job.state)}</b> · attempt ${job.attempt}` +
    ` · parallelism ${job.parallelism} · restarts <b id="restarts">${job.restarts}</b>` +
    ` · records in ${job.records_in}, out ${job.records_out}</p>` +
    (job.failure ? `<p class="failure">Last failure: ${esc(job.failure)}</p>` : "") +
    (job.failures.length ? `<details><summary>Failures (${job.failures.length})</summary><ul>` +
      job.failures.slice().reverse().map(f => `<li>attempt ${f.attempt}, ${new Date(f.at_ms).toLocaleTimeString()}` +
        `${f.unavailable ? " (waited for)" : ""}: ${esc(f.reason)}</li>`).join("") + `</ul></details>` : "") +
    (job.waiting_for ? `<p>Waiting for ${esc(job.waiting_for)}</p>` : "") +
    `<h2>Graph</h2><p class="legend"><span style="background:hsl(220,70%,45%)">idle</span>` +
    `<span style="background:hsl(0,70%,45%)">busy</span><span style="background:hsl(0,0%,25%)">back-pressured</span></p>` +
    `<div class="graph" id="graph">${graph || "No task has reported yet."}</div>` +
    `<h2>Throughput (records/s, last ${Math.round((now - history[0].t) / 1000)} s)</h2>${sparkline("throughput", rates)}` +
    ` <span id="rate">${rates.length ? Math.round(rates[rates.length - 1]) : "-"}</span> records/s` +
    `<h2>Watermark lag (s)</h2>${sparkline("lag", lags)} <span>${lags.length ? lags[lags.length - 1].toFixed(1) : "no watermark"}</span>` +
    `<h2>Checkpoints</h2><div id="checkpoints">` +
    (checkpoints.length ? table(["Id", "Savepoint", "Duration (ms)", "Alignment (ms)", "Sync (ms)", "Tasks"], checkpoints) : "None completed yet.") +
    `</div><p>Aborted: ${job.checkpoints_aborted}</p>`;
}

async function render() {
  const hash = location.hash || "#/";
  const m = hash.match(/^#\/jobs\/(.+)$/);
  try {
    if (m) await jobPage(decodeURIComponent(m[1])); else await overview();
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    if (e instanceof NeedsToken) tokenForm(e.message);
    else main.innerHTML = `<p class="failure">${esc(e.message)}</p>`;
  }
}

function start() {
  if (timer) clearInterval(timer);
  render();
  timer = setInterval(render, 1000);
}

window.addEventListener("hashchange", start);
start();
