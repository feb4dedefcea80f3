// Backfill progress: a React app plugin of the Airflow 3 UI (see airflow_backfill/plugins/page.py).
//
// Airflow's UI imports this module and renders `globalThis.AirflowPlugin` inside its own
// frame, sharing React, React Router and Chakra UI (with Airflow's theme, light and dark)
// through `globalThis`. So this is plain JavaScript with `React.createElement`: no build
// step. It polls the plugin's JSON routes; every value is rendered as text.

const React = globalThis.React;
const Chakra = globalThis.ChakraUI;
const Router = globalThis.ReactRouterDOM;
const { useCallback, useEffect, useRef, useState } = React;
const h = React.createElement;

const REFRESH_MS = 2000;
const API = new URL("airflow-backfill/api/jobs", document.baseURI).pathname;
const MAX_PARALLELISM = 1024;
const MAX_RATE_LIMIT = 10 ** 12;
const TASK_ORDER = ["PinEpochOperator", "SnapshotBackfillOperator", "LogStoreCatchUpOperator", "MaintainMvOperator",
  "CaughtUpSensor", "VerifyOperator", "ForwardOperator"];
const PHASES = [
  { key: "snapshot", label: "Snapshot", task: "SnapshotBackfillOperator" },
  { key: "catch_up", label: "Catch-up", task: "LogStoreCatchUpOperator" },
  { key: "forward", label: "Forward", task: "ForwardOperator" },
];

// ---- numbers for people ----------------------------------------------------------------

const INTEGER = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const DECIMAL = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
const missing = (value) => value === null || value === undefined;

function count(value) {
  return missing(value) ? "–" : INTEGER.format(value);
}

function bytes(value) {
  if (missing(value)) return "–";
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let scaled = value;
  let unit = 0;
  while (scaled >= 1024 && unit < units.length - 1) {
    scaled /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${INTEGER.format(scaled)} bytes` : `${DECIMAL.format(scaled)} ${units[unit]}`;
}

function duration(seconds) {
  if (missing(seconds)) return "–";
  if (seconds < 10) return `${DECIMAL.format(seconds)} s`;
  let rest = Math.round(seconds);
  const parts = [];
  for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]]) {
    if (rest >= size || (size === 1 && parts.length === 0)) {
      parts.push(`${Math.floor(rest / size)} ${unit}`);
      rest %= size;
    }
  }
  return parts.slice(0, 2).join(" ");
}

function plural(value, unit) {
  return `${count(value)} ${unit}${value === 1 ? "" : "s"}`;
}

function rowsPerSecond(value) {
  if (value === 0) return "0, paused";
  return missing(value) ? "no limit" : `${INTEGER.format(value)} rows/s`;
}

function clockTime(milliseconds) {
  if (missing(milliseconds)) return "–";
  const date = new Date(milliseconds);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

function ago(milliseconds) {
  return missing(milliseconds) ? "" : `${duration(Math.max(0, (Date.now() - milliseconds) / 1000))} ago`;
}

// ---- what a person may type ------------------------------------------------------------

// A whole number typed in a field, or an error that says what to type instead. Nothing is
// sent unless this accepts the text.
function parseSetting(text, { label, min, max, none }) {
  const typed = text.trim();
  if (typed === "") return { error: `Enter the ${label} first.` };
  if (none && typed.toLowerCase() === "none") return { value: null };
  if (!/^\d+$/.test(typed)) {
    const hint = none ? ` or "none"` : "";
    return { error: `"${typed}" is not a whole number: type digits only, without separators, signs or ` +
      `units (for example ${min === 1 ? "4" : "1000"})${hint}.` };
  }
  const value = Number(typed);
  if (value < min || value > max) {
    return { error: `The ${label} must be from ${count(min)} to ${count(max)}, got ${count(value)}.` };
  }
  return { value };
}

// ---- the plugin's routes ---------------------------------------------------------------

function toLogin() {
  const login = new URL("api/v2/auth/login", document.baseURI);
  login.searchParams.set("next", globalThis.location.href);
  globalThis.location.replace(login.toString());
}

async function request(path, options) {
  const response = await fetch(`${API}${path}`, { credentials: "same-origin", ...options });
  if (response.status === 401) {
    toLogin();
    throw new Error("Signed out: opening the login page.");
  }
  let answer = null;
  try {
    answer = await response.json();
  } catch {
    throw new Error(`The server answered ${response.status} without JSON.`);
  }
  if (!response.ok) throw new Error(answer.detail || `The server answered ${response.status}.`);
  return answer;
}

// ---- small pieces ----------------------------------------------------------------------

// A link inside Airflow's UI: React Router resolves it under the UI's base URL.
function RouterLink({ to, children, testId }) {
  return h(Chakra.Link, { asChild: true, color: "fg.info", "data-testid": testId },
    h(Router.Link, { to }, children));
}

function Stat({ label, value, help, testId }) {
  return h(Chakra.StatRoot, { size: "sm", borderWidth: "1px", borderRadius: "md", p: 3 },
    h(Chakra.StatLabel, null, label),
    h(Chakra.StatValueText, { "data-testid": testId, fontSize: "lg" }, value),
    help ? h(Chakra.StatHelpText, null, help) : null);
}

function Section({ title, children }) {
  return h(Chakra.Box, { mt: 5 },
    h(Chakra.Heading, { as: "h3", size: "sm", mb: 2 }, title),
    children);
}

function DataTable({ columns, rows, testId }) {
  return h(Chakra.TableScrollArea, { borderWidth: "1px", borderRadius: "md" },
    h(Chakra.TableRoot, { size: "sm", striped: true, "data-testid": testId },
      h(Chakra.TableHeader, null,
        h(Chakra.TableRow, null, ...columns.map((column) =>
          h(Chakra.TableColumnHeader, { key: column.label, textAlign: column.numeric ? "end" : "start" },
            column.label)))),
      h(Chakra.TableBody, null, ...rows.map((row, index) =>
        h(Chakra.TableRow, { key: index }, ...columns.map((column) =>
          h(Chakra.TableCell, { key: column.label, textAlign: column.numeric ? "end" : "start" },
            column.render(row))))))));
}

// ---- where the job is ------------------------------------------------------------------

// Which phase is running, which are done, and the next step, in words.
function phaseSteps(view) {
  const status = view.status;
  const settings = view.settings || {};
  const watermark = status.watermark;
  let current = null;
  let done = 0;
  let next;
  if (!status.phase) {
    next = "Next: the snapshot, when the DAG runs (pin_epoch pins the upstream epoch to start from).";
  } else if (status.phase === "snapshot" && missing(watermark)) {
    current = 0;
    next = "Next: catch-up, which applies the epochs the upstream committed after the snapshot's epoch.";
  } else if (status.phase === "snapshot") {
    done = 1;
    next = `Next: catch-up, from the snapshot's epoch ${count(watermark)} ` +
      `(${plural(status.pending_epochs, "epoch")} pending).`;
  } else if (status.phase === "forward") {
    done = 2;
    current = 2;
    next = `Forward applies each new upstream epoch at parallelism ${count(settings.parallelism)} ` +
      "until its task stops.";
  } else if (status.state === "created") {
    done = 2;
    next = `Next: forward, at parallelism ${count(settings.parallelism)} (catch-up has handed over).`;
  } else {
    done = 1;
    current = 1;
    next = `Next: forward, once the lag is at most ${plural(settings.lag_threshold, "epoch")} ` +
      `(now ${count(status.pending_epochs)}).`;
  }
  const steps = PHASES.map((phase, index) => ({
    ...phase,
    state: index === current ? "current" : index < done ? "done" : "upcoming",
  }));
  return { steps, next };
}

function PhaseStrip({ view }) {
  const { steps, next } = phaseSteps(view);
  const palette = { current: "running", done: "success", upcoming: "gray" };
  const marker = { current: "●", done: "✓", upcoming: "○" };
  const items = [];
  steps.forEach((step, index) => {
    if (index > 0) items.push(h(Chakra.Text, { key: `arrow-${index}`, color: "fg.muted", "aria-hidden": true }, "→"));
    items.push(h(Chakra.Badge, {
      key: step.key, size: "lg", variant: step.state === "upcoming" ? "outline" : "solid",
      colorPalette: palette[step.state], "data-testid": `phase-step-${view.name}-${step.key}`, "data-state": step.state,
      "aria-current": step.state === "current" ? "step" : undefined,
    }, `${marker[step.state]} ${step.label}`, step.state === "current" ? " · now" : ""));
  });
  return h(Chakra.Box, { mt: 4 },
    h(Chakra.HStack, { gap: 2, wrap: "wrap" }, ...items),
    h(Chakra.Text, { mt: 2, color: "fg.muted", "data-testid": `next-step-${view.name}` }, next));
}

function ProgressBar({ label, percent, detail, caption, finished, testId, done }) {
  const shown = Math.max(0, Math.min(100, percent));
  return h(Chakra.ProgressRoot, {
    value: shown, max: 100, size: "lg", colorPalette: finished ? "success" : "running", "data-testid": testId,
    "data-done": done,
  },
  h(Chakra.HStack, { justify: "space-between", mb: 1 },
    h(Chakra.ProgressLabel, { fontWeight: "semibold" }, label),
    h(Chakra.Text, { fontSize: "sm", "data-testid": `${testId}-label` },
      `${DECIMAL.format(shown)} % · ${finished ? "done" : caption}`)),
  h(Chakra.ProgressTrack, { borderRadius: "full" }, h(Chakra.ProgressRange)),
  detail ? h(Chakra.Text, { mt: 1, fontSize: "sm", color: "fg.muted" }, detail) : null);
}

function SnapshotProgress({ name, status }) {
  const snap = status.snapshot;
  if (!snap) return null;
  const finished = !missing(status.watermark) || snap.chunks_done >= snap.chunks_total;
  const percent = snap.rows_total > 0 ? (100 * snap.rows_done) / snap.rows_total : finished ? 100 : 0;
  const parts = [
    `${count(snap.rows_done)} of ${count(snap.rows_total)} input rows`,
    missing(snap.bytes_total) ? null : `${bytes(snap.bytes_done)} of ${bytes(snap.bytes_total)}`,
    `chunk ${count(snap.chunks_done)} of ${count(snap.chunks_total)}`,
    missing(snap.rows_per_second) ? null
      : `${rowsPerSecond(snap.rows_per_second)}${missing(snap.bytes_per_second) ? "" : `, ${bytes(snap.bytes_per_second)}/s`}`,
  ].filter(Boolean);
  return h(Chakra.Box, { mt: 5 },
    h(ProgressBar, {
      label: `Snapshot at epoch ${count(snap.epoch)}`, percent, finished,
      caption: missing(snap.eta_seconds) ? "ETA after the first chunk" : `ETA ${duration(snap.eta_seconds)}`,
      detail: parts.join(" · "), testId: `snapshot-progress-${name}`, done: snap.rows_done,
    }));
}

function CatchUpProgress({ name, status }) {
  const rounds = status.catch_up_rounds || [];
  if (!rounds.length || missing(status.watermark)) return null;
  const start = status.snapshot ? status.snapshot.epoch : rounds[0].pending_epochs;
  const finished = status.state === "created" || status.phase === "forward";
  const span = Math.max(1, (status.upstream_version || 0) - start);
  const percent = finished ? 100 : (100 * Math.max(0, status.watermark - start)) / span;
  const last = rounds[rounds.length - 1];
  return h(Chakra.Box, { mt: 5 },
    h(ProgressBar, {
      label: `Catch-up: ${plural(rounds.length, "round")}`, percent, finished,
      caption: `${plural(status.pending_epochs, "epoch")} pending`,
      detail: `watermark ${count(status.watermark)} of upstream epoch ${count(status.upstream_version)} · last ` +
        `round: ${plural(last.pending_epochs, "epoch")} pending at its start, ${plural(last.change_rows, "change row")} ` +
        `in ${duration(last.seconds)}`,
      testId: `catch-up-progress-${name}`,
    }));
}

// ---- lag over time ---------------------------------------------------------------------

function LagChart({ view }) {
  const points = [...(view.lag_history || [])];
  const status = view.status;
  if (!missing(status.pending_epochs)) {
    points.push({ at: Date.now() / 1000, epochs: status.pending_epochs, seconds: status.lag_seconds || 0, now: true });
  }
  if (points.length < 2) return null;
  const width = 720;
  const height = 180;
  const first = points[0].at;
  const last = points[points.length - 1].at;
  const span = Math.max(1, last - first);
  const maxEpochs = Math.max(1, ...points.map((point) => point.epochs));
  const maxSeconds = Math.max(1, ...points.map((point) => point.seconds));
  const secondsLabel = duration(maxSeconds);
  // The right axis' labels end at the chart's edge; the plot leaves them room for their
  // width ("1 min 21 s"), about 6.6 px a character at 11 px, so none is cut off.
  const labelWidth = (label) => Math.ceil(label.length * 6.6);
  const pad = { left: 48, right: Math.max(56, labelWidth(secondsLabel) + 12), top: 12, bottom: 28 };
  const x = (at) => pad.left + ((at - first) / span) * (width - pad.left - pad.right);
  const yEpochs = (value) => height - pad.bottom - (value / maxEpochs) * (height - pad.top - pad.bottom);
  const ySeconds = (value) => height - pad.bottom - (value / maxSeconds) * (height - pad.top - pad.bottom);
  const svg = (tag, attributes, ...children) => h(tag, attributes, ...children);
  const line = (y, key, color) => svg("polyline", {
    points: points.map((point) => `${x(point.at).toFixed(1)},${y(point[key]).toFixed(1)}`).join(" "),
    fill: "none", stroke: color, strokeWidth: 2,
  });
  const epochsColor = "var(--chakra-colors-running-solid)";
  const secondsColor = "var(--chakra-colors-deferred-solid)";
  const text = (props, value) => svg("text", { fontSize: 11, fill: "var(--chakra-colors-fg-muted)", ...props }, value);
  return h(Section, { title: "Lag over time" },
    h(Chakra.HStack, { gap: 4, fontSize: "sm", mb: 1 },
      h(Chakra.Text, { color: epochsColor }, "— pending epochs (left)"),
      h(Chakra.Text, { color: secondsColor }, "— seconds behind (right)")),
    h(Chakra.Box, { overflowX: "auto" },
      svg("svg", {
        width, height, role: "img", "data-testid": `lag-chart-${view.name}`,
        "aria-label": `lag after each MV commit: from ${count(points[0].epochs)} to ` +
          `${count(points[points.length - 1].epochs)} pending epochs`,
      },
      svg("line", { x1: pad.left, x2: width - pad.right, y1: height - pad.bottom, y2: height - pad.bottom,
        stroke: "var(--chakra-colors-border)" }),
      text({ x: pad.left - 6, y: pad.top + 8, textAnchor: "end" }, count(maxEpochs)),
      text({ x: pad.left - 6, y: height - pad.bottom, textAnchor: "end" }, "0"),
      text({ x: width - 2, y: pad.top + 8, textAnchor: "end", "data-testid": `lag-chart-seconds-${view.name}` },
        secondsLabel),
      text({ x: width - 2, y: height - pad.bottom, textAnchor: "end" }, "0 s"),
      text({ x: pad.left, y: height - 8 }, clockTime(first * 1000)),
      text({ x: width - pad.right, y: height - 8, textAnchor: "end" }, points[points.length - 1].now ? "now" : clockTime(last * 1000)),
      line(ySeconds, "seconds", secondsColor),
      line(yEpochs, "epochs", epochsColor),
      ...points.map((point, index) => svg("circle", {
        key: index, cx: x(point.at), cy: yEpochs(point.epochs), r: 3.5, fill: epochsColor,
      }, svg("title", null, `${point.now ? "now" : `${clockTime(point.at * 1000)}, ${point.phase} commit (MV version ` +
        `${point.mv_version})`}: ${count(point.epochs)} pending epochs, ${duration(point.seconds)} behind`))))));
}

// ---- rounds and commits ----------------------------------------------------------------

function RoundsTable({ name, rounds }) {
  if (!rounds || !rounds.length) return null;
  return h(Section, { title: "Catch-up rounds" }, h(DataTable, {
    rows: rounds, testId: `rounds-${name}`,
    columns: [
      { label: "Round", numeric: true, render: (r) => count(r.round) },
      { label: "Pending epochs at start", numeric: true, render: (r) => count(r.pending_epochs) },
      { label: "Behind after", numeric: true, render: (r) => duration(r.seconds_behind) },
      { label: "Change rows", numeric: true, render: (r) => count(r.change_rows) },
      { label: "Took", numeric: true, render: (r) => duration(r.seconds) },
      { label: "Parallelism", numeric: true, render: (r) => count(r.parallelism) },
      { label: "Rate limit", numeric: true, render: (r) => rowsPerSecond(r.rate_limit) },
      { label: "Plan", render: (r) => r.plan || "\u2014" },
    ],
  }));
}

function CommitsTable({ name, commits }) {
  const [all, setAll] = useState(false);
  if (!commits || !commits.length) return null;
  const shown = all ? commits : commits.slice(0, 8);
  return h(Section, { title: `MV commits (${count(commits.length)}, newest first)` },
    h(DataTable, {
      rows: shown, testId: `commits-${name}`,
      columns: [
        { label: "Version", numeric: true, render: (c) => count(c.version) },
        { label: "Committed", render: (c) => h(Chakra.Span, { title: ago(c.timestamp) }, clockTime(c.timestamp)) },
        { label: "Phase", render: (c) => c.phase || (missing(c.chunk) ? "–" : `snapshot chunk ${count(c.chunk + 1)}`) },
        { label: "Epoch", numeric: true, render: (c) => count(c.epoch) },
        { label: "Rows", numeric: true, render: (c) => count(c.rows) },
        { label: "Parallelism", numeric: true, render: (c) => count(c.parallelism) },
        { label: "Per chunk", render: (c) => (c.chunk_parallelism.length ? c.chunk_parallelism.join(", ") : "–") },
      ],
    }),
    commits.length > shown.length || all
      ? h(Chakra.Button, { size: "xs", variant: "ghost", mt: 1, onClick: () => setAll(!all) },
        all ? "Show the newest only" : `Show all ${count(commits.length)}`)
      : null);
}

// ---- live control ----------------------------------------------------------------------

function stored(answer) {
  const after = answer.after;
  const overridden = answer.stored || {};
  const source = (key) => (key in overridden ? "override" : "the job's");
  return `Stored: backfill parallelism ${count(after.backfill_parallelism)} (${source("backfill_parallelism")}), ` +
    `rate limit ${rowsPerSecond(after.rate_limit)} (${source("rate_limit")}).`;
}

function capitalized(text) {
  return text ? text[0].toUpperCase() + text.slice(1) : text;
}

function SettingField({ name, id, label, placeholder, helper, parse, onApply, busy }) {
  const [text, setText] = useState("");
  const [error, setError] = useState(null);
  const apply = () => {
    const parsed = parse(text);
    if (parsed.error) {
      setError(parsed.error);
      return;
    }
    setError(null);
    onApply(parsed.value).then((ok) => ok && setText(""));
  };
  return h(Chakra.FieldRoot, { invalid: Boolean(error), maxW: "22rem" },
    h(Chakra.FieldLabel, null, label),
    h(Chakra.HStack, { gap: 2, width: "full" },
      h(Chakra.Input, {
        size: "sm", value: text, placeholder, inputMode: "numeric", "data-testid": `${id}-input-${name}`,
        onChange: (event) => { setText(event.target.value); setError(null); },
        onKeyDown: (event) => { if (event.key === "Enter") apply(); },
      }),
      h(Chakra.Button, { size: "sm", onClick: apply, disabled: busy, "data-testid": `apply-${id}-${name}` }, "Apply")),
    error ? h(Chakra.FieldErrorText, { "data-testid": `${id}-error-${name}` }, error)
      : h(Chakra.FieldHelperText, null, helper));
}

function Controls({ view, onChanged }) {
  const name = view.name;
  const control = view.status.control;
  const [answer, setAnswer] = useState(null);
  const [busy, setBusy] = useState(false);
  if (!control) return null;
  if (!view.can_edit) {
    return h(Section, { title: "Live control" },
      h(Chakra.Text, { color: "fg.muted", "data-testid": `read-only-${name}` },
        `Read-only: changing the parallelism or the rate limit needs edit permission on ` +
        `${view.dag_ids.length === 1 ? "DAG" : "DAGs"} ${view.dag_ids.join(", ")}.`));
  }
  const send = async (body) => {
    setBusy(true);
    try {
      const reply = await request(`/${encodeURIComponent(name)}/alter`, {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
      setAnswer({ ok: true, title: stored(reply), text: `${capitalized(reply.message)}.` });
      onChanged();
      return true;
    } catch (error) {
      setAnswer({ ok: false, title: "Nothing was changed", text: String(error.message || error) });
      return false;
    } finally {
      setBusy(false);
    }
  };
  const overridden = (key, current, own, format) =>
    control.altered && current !== own ? `${format(current)} (override; the job's: ${format(own)})` : format(current);
  return h(Section, { title: "Live control" },
    h(Chakra.Text, { fontSize: "sm", color: "fg.muted", mb: 3 },
      "Changes apply at the next snapshot chunk or catch-up round; forward always runs at the job's parallelism."),
    h(Chakra.SimpleGrid, { columns: { base: 1, md: 2 }, gap: 3, mb: 3 },
      h(Stat, {
        label: "Backfill parallelism", testId: `parallelism-${name}`,
        value: overridden("backfill_parallelism", control.backfill_parallelism, control.job_backfill_parallelism, count),
      }),
      h(Stat, {
        label: "Rate limit", testId: `rate-${name}`,
        value: overridden("rate_limit", control.rate_limit, control.job_rate_limit, rowsPerSecond),
      })),
    h(Chakra.Flex, { gap: 6, wrap: "wrap", align: "flex-start" },
      h(SettingField, {
        name, id: "parallelism", label: "Backfill parallelism", busy,
        placeholder: `now ${control.backfill_parallelism}`, helper: `A whole number from 1 to ${count(MAX_PARALLELISM)}.`,
        parse: (text) => parseSetting(text, { label: "backfill parallelism", min: 1, max: MAX_PARALLELISM }),
        onApply: (value) => send({ backfill_parallelism: value }),
      }),
      h(SettingField, {
        name, id: "rate", label: "Rate limit (rows per second)", busy,
        placeholder: `now ${rowsPerSecond(control.rate_limit)}`, helper: `1 or more, or "none" to lift the cap.`,
        parse: (text) => parseSetting(text, { label: "rate limit", min: 1, max: MAX_RATE_LIMIT, none: true }),
        onApply: (value) => send({ rate_limit: value }),
      })),
    h(Chakra.HStack, { gap: 2, mt: 4, wrap: "wrap" },
      control.paused
        ? h(Chakra.Button, { size: "sm", colorPalette: "success", disabled: busy, "data-testid": `resume-${name}`,
          onClick: () => send({ resume: true }) }, "Resume")
        : h(Chakra.Button, { size: "sm", colorPalette: "warning", disabled: busy, "data-testid": `pause-${name}`,
          onClick: () => send({ rate_limit: 0 }) }, "Pause"),
      h(Chakra.Button, { size: "sm", variant: "outline", disabled: busy || !control.altered, "data-testid": `reset-${name}`,
        onClick: () => send({ reset: true }) }, "Reset to the job's values")),
    answer ? h(Chakra.AlertRoot, { status: answer.ok ? "success" : "error", mt: 3, "data-testid": `message-${name}` },
      h(Chakra.AlertIndicator),
      h(Chakra.AlertContent, null,
        h(Chakra.AlertTitle, null, answer.title),
        h(Chakra.AlertDescription, null, answer.text))) : null);
}

// ---- one job ---------------------------------------------------------------------------

function Links({ view }) {
  const byDag = {};
  const tasks = [...(view.tasks || [])].sort((a, b) => TASK_ORDER.indexOf(a.task_type) - TASK_ORDER.indexOf(b.task_type));
  for (const task of tasks) (byDag[task.dag_id] = byDag[task.dag_id] || []).push(task);
  return h(Chakra.Stack, { gap: 1, fontSize: "sm" }, ...view.dag_ids.map((dagId) =>
    h(Chakra.HStack, { key: dagId, gap: 2, wrap: "wrap" },
      h(Chakra.Text, { color: "fg.muted" }, "DAG"),
      h(RouterLink, { to: `/dags/${encodeURIComponent(dagId)}`, testId: `dag-link-${view.name}-${dagId}` }, dagId),
      h(Chakra.Text, { color: "fg.muted" }, "· tasks"),
      ...(byDag[dagId] || []).map((task) => h(RouterLink, {
        key: task.task_id, to: `/dags/${encodeURIComponent(dagId)}/tasks/${encodeURIComponent(task.task_id)}`,
      }, task.task_id.split(".").pop())))));
}

function Header({ view }) {
  const status = view.status;
  const paused = status && status.control && status.control.paused;
  return h(Chakra.Flex, { justify: "space-between", align: "flex-start", gap: 4, wrap: "wrap" },
    h(Chakra.Box, null,
      h(Chakra.HStack, { gap: 2, mb: 1 },
        h(Chakra.Heading, { as: "h2", size: "lg" },
          h(RouterLink, { to: `/plugin/airflow-backfill/jobs/${encodeURIComponent(view.name)}` }, view.name)),
        status && status.phase ? h(Chakra.Badge, { "data-testid": `phase-${view.name}`, colorPalette: "running",
          variant: "subtle" }, status.phase) : null,
        status ? h(Chakra.Badge, { "data-testid": `state-${view.name}`, variant: "outline",
          colorPalette: status.state === "created" ? "success" : "gray" }, status.state) : null,
        paused ? h(Chakra.Badge, { colorPalette: "warning", variant: "solid", "data-testid": `paused-${view.name}` },
          "paused") : null),
      h(Links, { view })),
    status ? h(Chakra.Stack, { gap: 1, fontSize: "sm", color: "fg.muted", align: "flex-end" },
      h(Chakra.Text, null, "upstream ", h(Chakra.Code, { size: "sm" }, status.source)),
      h(Chakra.Text, null, "MV ", h(Chakra.Code, { size: "sm" }, status.target))) : null);
}

function JobBody({ view, onChanged }) {
  const status = view.status;
  const name = view.name;
  if (!status) {
    return h(Chakra.AlertRoot, { status: "error", mt: 3 }, h(Chakra.AlertIndicator),
      h(Chakra.AlertContent, null, h(Chakra.AlertTitle, null, "The job's state cannot be read"),
        h(Chakra.AlertDescription, null, view.error)));
  }
  const lag = missing(status.pending_epochs) ? "–" : plural(status.pending_epochs, "epoch");
  return h(Chakra.Box, null,
    h(PhaseStrip, { view }),
    h(Chakra.SimpleGrid, { columns: { base: 2, md: 4 }, gap: 3, mt: 4 },
      h(Stat, { label: "MV watermark (epoch)", value: count(status.watermark), testId: `watermark-${name}` }),
      h(Stat, { label: "Upstream's latest epoch", value: count(status.upstream_version), testId: `upstream-${name}` }),
      h(Stat, { label: "Lag", value: lag, testId: `lag-epochs-${name}`,
        help: missing(status.lag_seconds) ? null : `${duration(status.lag_seconds)} behind` }),
      h(Stat, { label: "MV version", value: count(status.mv_version),
        help: status.commits.length ? `last commit ${ago(status.commits[0].timestamp)}` : null })),
    h(SnapshotProgress, { name, status }),
    h(CatchUpProgress, { name, status }),
    h(LagChart, { view }),
    h(UpstreamLags, { view }),
    h(RoundsTable, { name, rounds: status.catch_up_rounds }),
    h(CommitsTable, { name, commits: status.commits }),
    h(Controls, { view, onChanged }));
}

function neverRan(view) {
  const status = view.status;
  return Boolean(status) && !status.phase && missing(status.watermark) && !status.snapshot;
}

function JobCard({ view, onChanged }) {
  return h(Chakra.CardRoot, { mb: 5, "data-testid": `job-${view.name}` },
    h(Chakra.CardBody, null, h(Header, { view }), h(JobBody, { view, onChanged })));
}

function NeverRan({ views, onChanged }) {
  if (!views.length) return null;
  return h(Chakra.CollapsibleRoot, { "data-testid": "never-ran" },
    h(Chakra.CollapsibleTrigger, { asChild: true },
      h(Chakra.Button, { variant: "ghost", size: "sm", mb: 2 },
        `${plural(views.length, "job")} that never ran: `,
        views.map((view) => view.name).join(", "), " ▾")),
    h(Chakra.CollapsibleContent, null, ...views.map((view) => h(JobCard, { key: view.name, view, onChanged }))));
}

// ---- many jobs: one table that sorts and filters --------------------------------------

const PHASE_RANK = { failing: 0, snapshot: 1, backfill: 2, catch_up: 3, forward: 4, "never ran": 5 };
const SORTS = { lag: "Lag (largest first)", phase: "Phase", name: "Name" };

function phaseOf(view) {
  if (view.error || view.forward_error || view.backfill_error) return "failing";
  return (view.status && view.status.phase) || "never ran";
}

function lagOf(view) {
  const status = view.status;
  return status && !missing(status.pending_epochs) ? status.pending_epochs : -1;
}

// A Kafka pipeline's splits counted by state: "3 Finished · 1 Backfilling".
function splitCounts(view) {
  const counts = {};
  for (const split of view.splits || []) counts[split.state] = (counts[split.state] || 0) + 1;
  return Object.entries(counts).map(([state, n]) => `${n} ${state}`).join(" · ") || "no split yet";
}

function lagDetail(view) {
  const status = view.status;
  if (!status) return view.error || "–";
  if (view.kind === "kafka") {
    const splits = (view.splits || []).map((split) => `p${split.partition} ${split.state}(${split.offset})`);
    return `${splitCounts(view)}${splits.length ? `: ${splits.join(", ")}` : ""}` +
      (status.source_job_running ? "" : " · source job not running");
  }
  if (view.kind === "join") {
    return (status.upstreams || []).map((upstream) =>
      `${upstream.name} ${missing(upstream.pending_epochs) ? "–" : plural(upstream.pending_epochs, "epoch")}` +
      (missing(upstream.lag_seconds) ? "" : ` (${duration(upstream.lag_seconds)})`)).join(" · ");
  }
  return missing(status.lag_seconds) ? "" : `${duration(status.lag_seconds)} behind`;
}

function sortedViews(views, sort) {
  const byName = (a, b) => a.name.localeCompare(b.name);
  const compare = {
    name: byName,
    lag: (a, b) => lagOf(b) - lagOf(a) || byName(a, b),
    phase: (a, b) => (PHASE_RANK[phaseOf(a)] ?? 9) - (PHASE_RANK[phaseOf(b)] ?? 9) || byName(a, b),
  }[sort];
  return [...views].sort(compare);
}

function JobsTable({ views }) {
  const [sort, setSort] = useState("lag");
  const [phase, setPhase] = useState("all");
  const [text, setText] = useState("");
  const phases = ["all", ...Object.keys(PHASE_RANK).filter((key) => views.some((view) => phaseOf(view) === key))];
  const needle = text.trim().toLowerCase();
  const shown = sortedViews(views.filter((view) => (phase === "all" || phaseOf(view) === phase) &&
    (!needle || view.name.toLowerCase().includes(needle))), sort);
  const select = (testId, value, onChange, options) => h("select", {
    "data-testid": testId, value, onChange: (event) => onChange(event.target.value),
    style: { padding: "4px 8px", borderRadius: "6px", border: "1px solid var(--chakra-colors-border)",
      background: "var(--chakra-colors-bg)", color: "var(--chakra-colors-fg)" },
  }, ...options.map(([key, label]) => h("option", { key, value: key }, label)));
  return h(Section, { title: `Jobs (${count(shown.length)} of ${count(views.length)})` },
    h(Chakra.HStack, { gap: 3, mb: 2, wrap: "wrap", fontSize: "sm" },
      h(Chakra.Text, null, "Phase"),
      select("filter-phase", phase, setPhase, phases.map((key) => [key, key === "all" ? "all" : key])),
      h(Chakra.Text, null, "Sort by"),
      select("sort-jobs", sort, setSort, Object.entries(SORTS)),
      h(Chakra.Input, { size: "sm", maxW: "16rem", placeholder: "Filter by name", value: text,
        "data-testid": "filter-name", onChange: (event) => setText(event.target.value) })),
    h(DataTable, {
      rows: shown, testId: "jobs-table",
      columns: [
        { label: "Job", render: (view) => (view.kind === "kafka" ? view.name
          : h(RouterLink, { to: `/plugin/airflow-backfill/jobs/${encodeURIComponent(view.name)}`,
            testId: `row-${view.name}` }, view.name)) },
        { label: "Kind", render: (view) => view.kind },
        { label: "Phase", render: (view) => h(Chakra.Span, { "data-testid": `row-phase-${view.name}` }, phaseOf(view)) },
        { label: "State", render: (view) => (view.status && view.status.state) || "–" },
        { label: "Lag (epochs)", numeric: true,
          render: (view) => h(Chakra.Span, { "data-testid": `row-lag-${view.name}` },
            lagOf(view) < 0 ? "–" : count(lagOf(view))) },
        { label: "Detail", render: (view) => h(Chakra.Span, { "data-testid": `row-detail-${view.name}` },
          view.forward_error ? `forward failing: ${view.forward_error}`
            : view.backfill_error ? `backfill failing: ${view.backfill_error}` : lagDetail(view)) },
      ],
    }));
}

// A join's lag per upstream (its chart of lag over time has one line for the whole MV).
function UpstreamLags({ view }) {
  const upstreams = (view.status && view.status.upstreams) || [];
  if (upstreams.length < 2) return null;
  return h(Section, { title: "Lag per upstream" }, h(DataTable, {
    rows: upstreams, testId: `upstream-lags-${view.name}`,
    columns: [
      { label: "Upstream", render: (u) => u.name },
      { label: "Table", render: (u) => h(Chakra.Code, { size: "sm" }, u.table) },
      { label: "Latest epoch", numeric: true, render: (u) => count(u.upstream_version) },
      { label: "MV reflects", numeric: true, render: (u) => count(u.watermark) },
      { label: "Lag (epochs)", numeric: true, render: (u) => count(u.pending_epochs) },
      { label: "Behind", numeric: true, render: (u) => (missing(u.lag_seconds) ? "–" : duration(u.lag_seconds)) },
    ],
  }));
}

// ---- the page --------------------------------------------------------------------------

function jobFromLocation(pathname) {
  const match = /\/plugin\/[^/]+\/jobs\/([^/]+)\/?$/.exec(pathname);
  return match ? decodeURIComponent(match[1]) : null;
}

function BackfillProgress() {
  const location = Router.useLocation();
  const jobName = jobFromLocation(location.pathname);
  const [views, setViews] = useState(null);
  const [failure, setFailure] = useState(null);
  const [updated, setUpdated] = useState(null);
  const inFlight = useRef(false);

  const refresh = useCallback(async () => {
    if (inFlight.current) return;
    inFlight.current = true;
    try {
      const answer = await request(jobName ? `/${encodeURIComponent(jobName)}` : "");
      setViews(jobName ? [answer] : answer.jobs);
      setFailure(null);
      setUpdated(Date.now());
    } catch (error) {
      setFailure(String(error.message || error));
    } finally {
      inFlight.current = false;
    }
  }, [jobName]);

  useEffect(() => {
    setViews(null);
    refresh();
    const timer = setInterval(refresh, REFRESH_MS);
    return () => clearInterval(timer);
  }, [refresh]);

  // One job's page shows it whole. The list shows every job (Kafka pipelines included) in
  // one table; with few jobs their cards follow, folding the jobs that never ran.
  const whole = (views || []).filter((view) => !view.summary);
  const ran = whole.filter((view) => jobName || !neverRan(view));
  const idle = jobName ? [] : whole.filter(neverRan);
  return h(Chakra.Box, { p: 2, "data-testid": "backfill-progress" },
    h(Chakra.Flex, { justify: "space-between", align: "baseline", mb: 4, wrap: "wrap", gap: 2 },
      h(Chakra.Heading, { as: "h1", size: "xl" }, jobName ? `Backfill progress: ${jobName}` : "Backfill progress"),
      h(Chakra.HStack, { gap: 3, fontSize: "sm", color: "fg.muted" },
        jobName ? h(RouterLink, { to: "/plugin/airflow-backfill" }, "All backfill jobs") : null,
        h(Chakra.Text, { "data-testid": "updated" },
          updated ? `Updated ${clockTime(updated).slice(11)} · every ${REFRESH_MS / 1000} s` : "Loading…"))),
    failure ? h(Chakra.AlertRoot, { status: "error", mb: 4, "data-testid": "failure" }, h(Chakra.AlertIndicator),
      h(Chakra.AlertContent, null, h(Chakra.AlertDescription, null, failure))) : null,
    views === null && !failure ? h(Chakra.Spinner, null) : null,
    views !== null && !views.length
      ? h(Chakra.Text, { color: "fg.muted" }, "No DAG you can read declares a backfill job.") : null,
    !jobName && views && views.length ? h(JobsTable, { views }) : null,
    ...ran.map((view) => h(JobCard, { key: view.name, view, onChanged: refresh })),
    h(NeverRan, { views: idle, onChanged: refresh }));
}

globalThis.AirflowPlugin = BackfillProgress;
