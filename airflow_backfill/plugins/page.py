"""The plugin's page: one HTML document that polls the JSON routes and renders every job.

Plain HTML, CSS and a little JavaScript, served by the plugin's own app, so the page
needs no build step and no file outside the package. Values are inserted as text
(`textContent`), never as markup.
"""

from __future__ import annotations

import json

REFRESH_SECONDS = 2

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Backfill progress</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1rem 1.5rem; color: #1f2937; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.15rem; margin: 0; } h3 { font-size: 1rem; margin: 1rem 0 .3rem; }
.job { border: 1px solid #d1d5db; border-radius: 8px; padding: 1rem; margin-bottom: 1.2rem; }
.badges span { display: inline-block; border-radius: 4px; padding: 0 .4rem; margin-right: .4rem; background: #e5e7eb; }
.badges .paused { background: #fde68a; }
table { border-collapse: collapse; margin-top: .3rem; }
td, th { border: 1px solid #e5e7eb; padding: .15rem .5rem; text-align: left; font-variant-numeric: tabular-nums; }
.bar { width: 24rem; height: .8rem; background: #e5e7eb; border-radius: 4px; overflow: hidden; }
.bar div { height: 100%; background: #2563eb; }
.controls input { width: 7rem; } .controls button { margin-left: .3rem; }
.message { margin-top: .4rem; } .error { color: #b91c1c; }
</style>
</head>
<body>
<h1>Backfill progress</h1>
<p id="summary">Loading&hellip;</p>
<div id="jobs"></div>
<script>
const CONFIG = __CONFIG__;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const dash = (value) => (value === null || value === undefined ? "-" : value);
const rows = (pairs) => el("table", {}, ...pairs.map(([label, value, id]) =>
  el("tr", {}, el("th", {}, label), el("td", id ? {"data-testid": id} : {}, dash(value)))));

function rateText(rate) {
  if (rate === null || rate === undefined) return "none";
  return rate === 0 ? "0 (paused)" : rate + " rows/s";
}

function snapshotSection(name, snap) {
  if (!snap) return null;
  const fraction = snap.rows_total > 0 ? snap.rows_done / snap.rows_total : 1;
  const bytes = snap.bytes_total === null ? "-" : snap.bytes_done + " / " + snap.bytes_total;
  return el("div", {},
    el("h3", {}, "Snapshot at epoch " + snap.epoch),
    el("div", {class: "bar"}, el("div", {style: "width:" + (100 * fraction).toFixed(1) + "%"})),
    rows([
      ["chunks", snap.chunks_done + " / " + snap.chunks_total, "snapshot-chunks-" + name],
      ["input rows", snap.rows_done + " / " + snap.rows_total, "snapshot-rows-" + name],
      ["input bytes", bytes, "snapshot-bytes-" + name],
      ["rate", snap.rows_per_second === null ? null : snap.rows_per_second + " rows/s, " +
        dash(snap.bytes_per_second) + " bytes/s"],
      ["ETA", snap.eta_seconds === null ? null : snap.eta_seconds + " s"],
      ["chunk parallelism", snap.chunk_parallelism.join(", ")],
    ]));
}

function roundsChart(rounds) {
  const width = 360, height = 90, pad = 4;
  const max = Math.max(1, ...rounds.map((r) => r.pending_epochs));
  const step = (width - 2 * pad) / Math.max(1, rounds.length);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  svg.setAttribute("role", "img"); svg.setAttribute("aria-label", "pending epochs per catch-up round");
  rounds.forEach((round, index) => {
    const h = (height - 2 * pad) * round.pending_epochs / max;
    const bar = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    bar.setAttribute("x", pad + index * step + 1); bar.setAttribute("width", Math.max(1, step - 2));
    bar.setAttribute("y", height - pad - h); bar.setAttribute("height", h); bar.setAttribute("fill", "#2563eb");
    const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
    title.textContent = "round " + round.round + ": " + round.pending_epochs + " pending epochs, " +
      round.seconds_behind + " s behind, parallelism " + round.parallelism;
    bar.append(title); svg.append(bar);
  });
  return svg;
}

function roundsSection(rounds) {
  if (!rounds.length) return null;
  return el("div", {},
    el("h3", {}, "Catch-up rounds (lag when each started)"), roundsChart(rounds),
    el("table", {}, el("tr", {}, ...["round", "pending epochs", "s behind", "change rows", "seconds",
                                     "parallelism", "rate limit"].map((h) => el("th", {}, h))),
      ...rounds.map((r) => el("tr", {}, ...[r.round, r.pending_epochs, r.seconds_behind, r.change_rows,
                                            r.seconds, r.parallelism, rateText(r.rate_limit)]
        .map((v) => el("td", {}, dash(v)))))));
}

function commitsSection(name, commits) {
  if (!commits.length) return null;
  return el("div", {},
    el("h3", {}, "MV commits"),
    el("table", {"data-testid": "commits-" + name},
      el("tr", {}, ...["version", "phase", "epoch", "parallelism", "chunk parallelism", "rows"]
        .map((h) => el("th", {}, h))),
      ...commits.map((c) => el("tr", {}, ...[c.version, c.phase, c.epoch, c.parallelism,
                                             c.chunk_parallelism.join(", "), c.rows]
        .map((v) => el("td", {}, dash(v)))))));
}

const messages = {};  // the last answer to an alter, per job: kept across refreshes

async function alter(name, body) {
  messages[name] = {text: "sending\u2026", error: false}; render();
  try {
    const response = await fetch(CONFIG.api + "/" + encodeURIComponent(name) + "/alter", {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
    });
    const answer = await response.json();
    messages[name] = response.ok ? {text: answer.message, error: false} : {text: answer.detail, error: true};
  } catch (error) { messages[name] = {text: String(error), error: true}; }
  await refresh(true);
}

function controlsSection(name, control) {
  if (!control) return null;
  const last = messages[name];
  const message = el("div", {class: last && last.error ? "message error" : "message",
                             "data-testid": "message-" + name}, last ? last.text : null);
  const parallelism = el("input", {type: "number", min: "1", step: "1", "data-testid": "parallelism-input-" + name,
                                   value: control.backfill_parallelism});
  const rate = el("input", {type: "text", placeholder: "rows/s or none", "data-testid": "rate-input-" + name});
  const button = (label, testid, handler) => {
    const node = el("button", {type: "button", "data-testid": testid + "-" + name}, label);
    node.addEventListener("click", handler); return node;
  };
  const rateValue = () => (rate.value.trim().toLowerCase() === "none" ? null : Number(rate.value));
  return el("div", {class: "controls"},
    el("h3", {}, "Live control (applies at the next chunk or round)"),
    rows([
      ["backfill parallelism", control.backfill_parallelism + " (job: " + control.job_backfill_parallelism + ")",
       "parallelism-" + name],
      ["rate limit", rateText(control.rate_limit) + " (job: " + rateText(control.job_rate_limit) + ")",
       "rate-" + name],
      ["overridden", control.altered ? "yes" : "no"],
    ]),
    el("p", {}, "Backfill parallelism ", parallelism,
       button("Apply", "apply-parallelism", () => alter(name, {backfill_parallelism: Number(parallelism.value)})),
       " Rate limit ", rate,
       button("Apply", "apply-rate", () => alter(name, {rate_limit: rateValue()}))),
    el("p", {},
       button("Pause", "pause", () => alter(name, {rate_limit: 0})),
       button("Resume", "resume", () => alter(name, {rate_limit: control.job_rate_limit})),
       button("Reset to the job's values", "reset", () => alter(name, {reset: true}))),
    message);
}

function jobCard(view) {
  const name = view.name, status = view.status;
  if (!status) return el("div", {class: "job"}, el("h2", {}, name), el("p", {class: "error"}, view.error));
  const paused = status.control && status.control.paused;
  return el("div", {class: "job", id: "job-" + name},
    el("h2", {}, name),
    el("p", {}, "DAGs: " + view.dag_ids.join(", ") + " \u2014 " + status.source + " \u2192 " + status.target),
    el("p", {class: "badges"},
       el("span", {"data-testid": "phase-" + name}, dash(status.phase)),
       el("span", {"data-testid": "state-" + name}, status.state),
       paused ? el("span", {class: "paused", "data-testid": "paused-" + name}, "paused") : null),
    rows([
      ["MV watermark", status.watermark, "watermark-" + name],
      ["upstream latest version", status.upstream_version, "upstream-" + name],
      ["lag (epochs)", status.pending_epochs, "lag-epochs-" + name],
      ["lag (seconds)", status.lag_seconds, "lag-seconds-" + name],
      ["MV version", status.mv_version],
    ]),
    snapshotSection(name, status.snapshot),
    roundsSection(status.catch_up_rounds),
    commitsSection(name, status.commits),
    controlsSection(name, status.control));
}

let views = null, failure = null;

function render() {
  const summary = document.getElementById("summary");
  if (failure !== null) { summary.className = "error"; summary.textContent = failure; return; }
  if (views === null) return;
  summary.className = "";
  summary.textContent = views.length ? "Updated " + new Date().toLocaleTimeString() :
    "No DAG you can read declares a backfill job.";
  document.getElementById("jobs").replaceChildren(...views.map(jobCard));
}

async function refresh(force) {
  try {
    const url = CONFIG.job ? CONFIG.api + "/" + encodeURIComponent(CONFIG.job) : CONFIG.api;
    const response = await fetch(url, {credentials: "same-origin"});
    const answer = await response.json();
    if (!response.ok) { failure = answer.detail; render(); return; }
    failure = null;
    views = CONFIG.job ? [answer] : answer.jobs;
  } catch (error) { failure = String(error); }
  const typing = document.activeElement && document.activeElement.tagName === "INPUT";
  if (force || !typing) render();  // never replace a field the user is typing in
}
refresh();
setInterval(refresh, CONFIG.refresh_ms);
</script>
</body>
</html>
"""


def render_page(root_path: str, job_name: str | None) -> str:
    """The page for every readable job, or for `job_name` only (the extra link's target)."""
    config = {"api": f"{root_path}/api/jobs", "job": job_name, "refresh_ms": REFRESH_SECONDS * 1000}
    # `</` cannot close the script element from inside the JSON.
    return _PAGE.replace("__CONFIG__", json.dumps(config).replace("</", "<\\/"))
