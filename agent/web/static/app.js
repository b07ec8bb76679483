// The status page: reads /api every two seconds and draws what it finds. No framework, no
// internet: uPlot (vendored next to this file) draws the charts. Every value from the agent is
// written with textContent, never as HTML.
"use strict";

const REFRESH_MS = 2000;
const SLOW_REFRESH_MS = 5000;
const KEEP_POINTS = 900;

const history = { ts: [], temp_c: [], power_w: [], battery_percent: [], cameras: {} };
const charts = {};
const cameraCards = {};
let lastStatus = null;

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

// Every request goes to the page's origin as an absolute URL without user name or password: a
// browser given the credentials in the address (http://user:password@device:8080/) refuses to
// fetch a URL that carries them, and sends the ones it was given (its HTTP auth cache) to the
// origin by itself.
function here(path) { return new URL(path, location.origin).href; }

async function api(path, options) {
  const response = await fetch(here(path), Object.assign({ cache: "no-store", credentials: "same-origin" }, options));
  const body = response.headers.get("content-type")?.includes("json") ? await response.json() : null;
  if (!response.ok) {
    const error = new Error(body?.error?.message || response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

function fmt(value, digits, unit) {
  if (value === null || value === undefined) return "–";
  return `${Number(value).toFixed(digits)}${unit ? " " + unit : ""}`;
}

function ago(ts) {
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

function fill(dl, rows) {
  dl.replaceChildren(...rows.flatMap(([term, value]) => [el("dt", {}, term), el("dd", {}, value ?? "–")]));
}

// -- the overview ----------------------------------------------------------------------------

// What the shadow (before the switch) and probation's quality check (after it) judged the
// version to see (docs/quality.md): the outcome, then one row per camera.
function shadowRows(shadow) {
  if (!shadow) return [];
  const mode = shadow.mode === "report" ? "report only" : "gate";
  return [
    ["shadow", `${shadow.outcome} (${mode}, minimum agreement ${shadow.min_agreement}, ${fmt(shadow.seconds, 0, "s")})`],
    ...shadow.cameras.map(c => [`shadow ${c.camera}`,
      `agreement ${fmt(c.agreement, 2)} (precision ${fmt(c.precision, 2)}, recall ${fmt(c.recall, 2)}) over ${c.frames} frames`]),
    ["shadow says", shadow.message],
  ];
}

function qualityRows(quality) {
  if (!quality) return [];
  return [
    ["probation quality", `${quality.outcome} (minimum ratio ${quality.min_ratio})`],
    ...quality.cameras.map(c => [`quality ${c.camera}`, c.ratio === null
      ? `not judged (${fmt(c.before_per_frame, 3)} a frame before the swap)`
      : `ratio ${fmt(c.ratio, 2)} (${fmt(c.before_per_frame, 3)} → ${fmt(c.after_per_frame, 3)} detections a frame)`]),
    ["quality says", quality.message],
  ];
}

const ENROLMENT_STATES = { waiting: "waiting for approval", denied: "enrolment denied", expired: "claim expired" };

function renderStatus(s) {
  lastStatus = s;
  document.title = `${s.device} – edge-agent`;
  $("device").textContent = s.device;
  $("identity").textContent =
    `${s.board.model} (${s.board.kind}, ${s.board.arch}) · edge-agent ${s.agent_version}` + (s.group ? ` · group ${s.group}` : "");
  const state = $("state");
  const enrol = s.enrolment; // set only while a device with only a claim waits for enrolment
  state.textContent = enrol ? ENROLMENT_STATES[enrol.state] : s.state;
  state.className = "badge " + (enrol ? (enrol.state === "waiting" ? "warn" : "fail") : s.state === "online" ? "good" : "warn");

  const serving = s.serving;
  fill($("model"), [
    ["bundle", s.bundle ? `${s.bundle.name} ${s.bundle.version}` : "none installed"],
    ["runtime", serving ? `${serving.runtime} on ${serving.device}` : "–"],
    ["why", serving ? serving.reason : "–"],
    ["artifact", serving ? serving.artifact : "–"],
    ["previous", s.previous ? `${s.previous.name} ${s.previous.version}` : "none"],
  ]);
  const d = s.deployment;
  fill($("deployment"), d ? [
    ["state", d.state],
    ["version", `${d.name || "?"} ${d.version || d.sha256.slice(0, 12)}`],
    ["id", d.id],
    ["error", d.error ? `${d.error.code}: ${d.error.message}` : "none"],
    ["progress", d.progress ? `${d.progress.chunks_done}/${d.progress.chunks_total} chunks` : "–"],
    ...shadowRows(d.shadow),
    ...qualityRows(d.quality),
  ] : [["state", "no deployment yet"]]);
  const b = s.broker;
  // the events' snapshots and clips kept on disk (events.media's retention), with or without a broker
  const media = s.media ? [["media", `${s.media.files} file(s), ${fmt(s.media.bytes / 1048576, 1, "MiB")}`]] : [];
  fill($("broker"), b ? [
    ["broker", b.broker],
    ["connection", b.connected ? "connected" : "unreachable"],
    ["last error", b.last_error || "none"],
    ["queued", `${b.queued} message(s)`],
    ["reconnects", String(b.reconnects)],
    ...(s.outbox ? [
      ["backlog", `${s.outbox.messages} message(s)` + (s.outbox.oldest_age_s === null ? "" : `, oldest ${fmt(s.outbox.oldest_age_s, 0, "s")}`)],
      ["dropped", `${s.outbox.dropped.telemetry} telemetry, ${s.outbox.dropped.event} event(s), ${s.outbox.dropped.deployment} report(s)`],
    ] : []),
    ...media,
  ] : [["broker", "none configured (runs alone)"], ...media]);
  const g = s.governor;
  fill($("governor"), g ? [
    ["level", g.level],
    ["why", g.reason],
    ["since", ago(g.since)],
    ["FPS cap", g.actions.fps_cap === null ? "none" : fmt(g.actions.fps_cap, 1, "FPS")],
    ["fan", g.actions.fan === null ? "–" : fmt(g.actions.fan, 0, "%")],
  ] : [["level", "governor off"]]);
  const sensors = s.sensors || {};
  const sys = s.system || {};
  const battery = sensors.battery;
  fill($("board"), [
    ["temperature", fmt(sensors.temp_c, 1, "°C")],
    ["power", fmt(sensors.power_w, 2, "W") + (sensors.power_source ? ` (${sensors.power_source})` : "")],
    ["battery", battery ? `${fmt(battery.percent, 0, "%")} ${battery.status || ""}` : "none"],
    ["CPU", fmt(sys.cpu_percent, 0, "%")],
    ["memory", sys.memory_available_mb === undefined ? "–" : `${fmt(sys.memory_percent, 0, "%")} used`],
    ["disk free", sys.disk_free_mb == null ? "–" : fmt(sys.disk_free_mb / 1024, 1, "GiB")],
    ["clock", sys.clock_synchronised === true ? "synchronised" : sys.clock_synchronised === false ? "not synchronised" : "unknown"],
  ]);
  $("rollback-target").textContent = s.previous ? `(back to ${s.previous.name} ${s.previous.version})` : "(no previous version)";
  $("rollback").disabled = !s.previous;
  const drift = Object.fromEntries((s.drift || []).map((d) => [d.camera, d]));
  for (const camera of s.cameras) renderCamera(camera, (s.cameras_analytics || {})[camera.name], drift[camera.name]);
  for (const name of Object.keys(cameraCards)) {
    if (!s.cameras.some((c) => c.name === name)) { cameraCards[name].card.remove(); delete cameraCards[name]; }
  }
  $("updated").textContent = `Updated ${new Date(s.ts * 1000).toLocaleTimeString()}.`;
}

function renderProblems(p) {
  const health = $("health");
  health.textContent = p.health.ok ? "healthy" : "hung";
  health.className = "badge " + (p.health.ok ? "good" : "fail");
  $("problems").replaceChildren(...p.problems.map((f) =>
    el("li", { class: f.status }, el("strong", {}, f.message), f.fix ? el("span", { class: "fix" }, `What to do: ${f.fix}`) : "")));
  $("all-good").hidden = p.problems.length > 0;
}

// -- cameras ---------------------------------------------------------------------------------

function renderCamera(c, analytics, drift) {
  let entry = cameraCards[c.name];
  if (!entry) {
    const image = el("img", { alt: `camera ${c.name}`, class: "snapshot" });
    // the motion gate's regions and masks, drawn over the frame (drawMotion); its legend below
    const overlay = el("canvas", { class: "motion-overlay", "aria-hidden": "true" });
    const legend = el("div", { class: "motion-legend muted" },
      el("span", { class: "key region" }), "motion", el("span", { class: "key mask" }), "masked (ignored)", el("span", { class: "motion-state" }));
    legend.hidden = true;
    const frame = el("div", { class: "frame" }, image, overlay);
    const stats = el("dl", {});
    const restart = el("button", { type: "button" }, "Restart camera");
    restart.addEventListener("click", () => act(`/api/cameras/${encodeURIComponent(c.name)}/restart`, `restart camera ${c.name}`));
    const chart = el("div", { class: "chart" });
    // camera health's "moved": the reference image beside the live one, and accepting the new view
    const reference = el("img", { alt: `camera ${c.name}'s reference view`, class: "snapshot reference" });
    const accept = el("button", { type: "button" }, "Accept the new view");
    accept.addEventListener("click", () => act(`/api/cameras/${encodeURIComponent(c.name)}/accept-view`, `accept the new view of camera ${c.name}`));
    const moved = el("div", { class: "moved", hidden: true },
      el("p", {}, "The view moved. What the live view above is compared with (the reference, grey):"), reference, accept);
    const card = el("div", { class: "camera card", "data-camera": c.name },
      el("h3", {}, `Camera ${c.name}`), frame, legend, moved, stats, restart, chart);
    $("cameras").append(card);
    entry = cameraCards[c.name] = { card, image, overlay, legend, stats, chart, moved, reference, loading: false, motion: null };
    image.addEventListener("load", () => { entry.loading = false; drawMotion(entry); });
    image.addEventListener("error", () => { entry.loading = false; });
  }
  const total = c.latency_ms.total || {};
  const inference = c.latency_ms.inference || {};
  fill(entry.stats, [
    ["FPS", fmt(c.fps, 1) + (c.max_fps ? ` (cap ${fmt(c.max_fps, 1)})` : "")],
    ["latency", `${fmt(total.p50, 0, "ms")} median, ${fmt(total.p95, 0, "ms")} p95`],
    ["inference", fmt(inference.p50, 1, "ms")],
    ["frames", `${c.frames} inferred, ${c.dropped} dropped, ${c.errors} failed`],
    ["source", `${c.source_status.state}${c.source_status.error ? ": " + c.source_status.error : ""}`],
    ["model", `${c.model} on ${c.runtime}${c.paused ? " (paused)" : ""}`],
    ...(c.health ? [["picture", c.health.problems.length ? c.health.problems.map((p) => p.kind.replace("_", " ")).join(", ") : "good"]] : []),
    ...thresholdRows(c.thresholds),
    ...motionRows(c.motion),
    ...driftRows(drift),
    ...analyticsRows(analytics),
  ]);
  entry.motion = c.motion || null;
  drawMotion(entry);
  if (!entry.loading) {
    entry.loading = true;
    entry.image.src = here(`/api/cameras/${encodeURIComponent(c.name)}/snapshot.jpg?t=${Date.now()}`);
  }
  const moved = Boolean(c.health && c.health.problems.some((p) => p.kind === "moved"));
  if (moved && entry.moved.hidden) {  // the reference only changes when accepted: fetched as it shows
    entry.reference.src = here(`/api/cameras/${encodeURIComponent(c.name)}/reference.jpg?t=${Date.now()}`);
  }
  entry.moved.hidden = !moved;
}

// What the camera keeps of its model's detections: agent.yaml's cameras[] over the bundle's.
function thresholdRows(t) {
  if (!t) return [];
  const from = t.configured.length ? `${t.configured.join(", ")} from agent.yaml, the rest from the bundle` : "from the bundle";
  const classes = t.classes === null ? "all" : (t.classes.length ? t.classes.join(", ") : "none (see the problems)");
  return [
    ["thresholds", `conf ${fmt(t.conf, 2)} · iou ${fmt(t.iou, 2)} · max_det ${t.max_det} (${from})`],
    ["classes", classes],
  ];
}

// The motion gate's shares of frames (docs/cameras.md#motion); nothing for a camera without one.
function motionRows(m) {
  if (!m) return [];
  return [["motion gate", `${fmt(m.inferred_ratio * 100, 0, "%")} of frames inferred, ${fmt(m.motion_ratio * 100, 0, "%")} with motion`]];
}

// The camera's drift score against its version's baseline (docs/cameras.md#drift); nothing with
// drift off. A problem only past its threshold (/api/problems); the row shows it either way.
function driftRows(d) {
  if (!d) return [];
  if (!d.score) {
    const hours = fmt(d.baseline_s / 3600, 1, "h");
    return [["drift", d.complete ? "no score yet (baseline complete)" : `no score yet (baseline ${hours} so far)`]];
  }
  const over = d.score.score >= d.threshold ? `: ${d.score.changed}` : "";
  return [["drift", `${fmt(d.score.score, 2)} (threshold ${fmt(d.threshold, 2)})${over}`]];
}

// A diagonal hatch for the masks: grey lines over a dimmed frame.
let maskPattern = null;
function hatch(ctx) {
  if (maskPattern) return maskPattern;
  const tile = document.createElement("canvas");
  tile.width = tile.height = 8;
  const t = tile.getContext("2d");
  t.fillStyle = "rgba(0, 0, 0, 0.45)";
  t.fillRect(0, 0, 8, 8);
  t.strokeStyle = "rgba(220, 220, 220, 0.8)";
  t.lineWidth = 1.5;
  t.beginPath(); t.moveTo(0, 8); t.lineTo(8, 0); t.moveTo(-2, 2); t.lineTo(2, -2); t.moveTo(6, 10); t.lineTo(10, 6); t.stroke();
  maskPattern = ctx.createPattern(tile, "repeat");
  return maskPattern;
}

// Draws the newest motion of a gated camera (entry.motion: /api/status's cameras[].motion, in
// frame pixels) over its live frame as shown: the image is letterboxed in its box (object-fit:
// contain), so the frame's pixels map to the box by one scale and an offset. The canvas is
// cleared for a camera without a gate, and its legend hidden. What it drew is kept in the
// canvas's data-regions and data-masks (the page test reads them beside the pixels).
function drawMotion(entry) {
  const { image, overlay, legend } = entry;
  const motion = entry.motion;
  overlay.width = image.clientWidth;
  overlay.height = image.clientHeight;  // setting the size clears the canvas
  overlay.dataset.regions = overlay.dataset.masks = "0";
  legend.hidden = !motion;
  if (!motion || !image.naturalWidth) return;
  legend.querySelector(".motion-state").textContent = motion.recalibrated
    ? "lighting changed: background recalibrated"
    : `${fmt(motion.changed * 100, 1, "%")} of the frame changed`;
  const scale = Math.min(overlay.width / image.naturalWidth, overlay.height / image.naturalHeight);
  const dx = (overlay.width - image.naturalWidth * scale) / 2;
  const dy = (overlay.height - image.naturalHeight * scale) / 2;
  const ctx = overlay.getContext("2d");
  ctx.fillStyle = hatch(ctx);
  for (const polygon of motion.masks) {
    ctx.beginPath();
    polygon.forEach(([x, y], i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, dx + x * scale, dy + y * scale));
    ctx.closePath();
    ctx.fill();
  }
  ctx.strokeStyle = "#ff2bd6";
  ctx.fillStyle = "rgba(255, 43, 214, 0.18)";
  ctx.lineWidth = 2;
  ctx.setLineDash([6, 4]);  // dashed: not one of the detections' solid boxes drawn into the frame
  for (const [x0, y0, x1, y1] of motion.regions) {
    const box = [dx + x0 * scale, dy + y0 * scale, (x1 - x0) * scale, (y1 - y0) * scale];
    ctx.fillRect(...box);
    ctx.strokeRect(...box);
  }
  overlay.dataset.regions = String(motion.regions.length);
  overlay.dataset.masks = String(motion.masks.length);
}

// The camera's tracked objects, line crossings and zone occupancy (docs/analytics.md).
function analyticsRows(a) {
  if (!a) return [];
  return [
    ["objects tracked", String(a.tracks)],
    ...a.lines.map((l) => [`line ${l.name}`, `${l.in} in, ${l.out} out`]),
    ...a.zones.map((z) => [`zone ${z.name}`, `${z.now} now, ${z.total} total`]),
  ];
}

// -- charts ----------------------------------------------------------------------------------

function chart(key, container, series) {
  if (charts[key]) return charts[key];
  const width = Math.max(280, container.clientWidth || 400);
  const axes = [{}, { label: series[0].label, size: 50 }];
  if (series.length > 1) axes.push({ side: 1, label: series[1].label, scale: "right", grid: { show: false }, size: 50 });
  const options = {
    width, height: 170,
    series: [{}, ...series.map((s, i) => ({ label: s.label, stroke: s.color, width: 2, scale: i === 0 ? "y" : "right", spanGaps: false }))],
    axes,
    scales: { x: { time: true } },
    legend: { show: true },
  };
  charts[key] = new uPlot(options, [[], ...series.map(() => [])], container);
  return charts[key];
}

function appendHistory(h) {
  const n = h.ts.length;
  for (const key of ["ts", "temp_c", "power_w", "battery_percent"]) history[key].push(...h[key]);
  const known = history.ts.length - n;
  for (const [name, columns] of Object.entries(h.cameras)) {
    const mine = history.cameras[name] || (history.cameras[name] = { fps: Array(known).fill(null), latency_ms: Array(known).fill(null) });
    mine.fps.push(...columns.fps);
    mine.latency_ms.push(...columns.latency_ms);
  }
  for (const [name, mine] of Object.entries(history.cameras)) {
    while (mine.fps.length < history.ts.length) { mine.fps.push(null); mine.latency_ms.push(null); }
  }
  const extra = history.ts.length - KEEP_POINTS;
  if (extra > 0) {
    for (const key of ["ts", "temp_c", "power_w", "battery_percent"]) history[key].splice(0, extra);
    for (const mine of Object.values(history.cameras)) { mine.fps.splice(0, extra); mine.latency_ms.splice(0, extra); }
  }
}

// Why a board chart ("temp" or "power") has nothing to draw, in words, from the newest sensor
// readings (/api/status's `sensors`, docs/telemetry.md); null while a point of its `columns` is
// known, or the readings know a value (its point is on its way).
function nothingToDraw(kind, sensors, columns) {
  if (columns.some((column) => column.some((value) => value != null))) return null;
  if (!sensors) return "Nothing to draw yet: the sensors have not been read.";
  if (kind === "temp") {
    if (sensors.temp_c != null) return null;
    const zones = Object.keys(sensors.thermal_zones || {});
    return zones.length
      ? `Nothing to draw: the thermal zones (${zones.join(", ")}) give no reading; can the agent's user read them?`
      : "Nothing to draw: no temperature sensor on this board (no thermal zone in /sys/class/thermal, no GPU temperature; a VM has none).";
  }
  if (sensors.power_w != null || sensors.battery?.percent != null) return null;
  if (sensors.battery) return "Nothing to draw: the battery reports no charge, and nothing measures the board's input power.";
  const rails = Object.keys(sensors.rails || {});
  return rails.length
    ? `Nothing to draw: no input power rail on this board; its rails (${rails.join(", ")}) measure parts of it only.`
    : "Nothing to draw: no power sensor on this board (no input power rail, no PMIC, no battery or UPS).";
}

function drawCharts() {
  const temp = chart("temp", $("chart-temp"), [{ label: "°C", color: "#d9534f" }]);
  temp.setData([history.ts, history.temp_c]);
  const power = chart("power", $("chart-power"), [{ label: "W", color: "#f0ad4e" }, { label: "battery %", color: "#5cb85c" }]);
  power.setData([history.ts, history.power_w, history.battery_percent]);
  const sensors = lastStatus ? lastStatus.sensors : null;
  for (const [kind, columns] of [["temp", [history.temp_c]], ["power", [history.power_w, history.battery_percent]]]) {
    const note = $(`chart-${kind}`).querySelector(".chart-note");
    const why = nothingToDraw(kind, sensors, columns);
    note.hidden = why === null;
    note.textContent = why || "";
  }
  for (const [name, entry] of Object.entries(cameraCards)) {
    const columns = history.cameras[name];
    if (!columns) continue;
    const c = chart(`camera:${name}`, entry.chart, [{ label: "FPS", color: "#337ab7" }, { label: "latency ms", color: "#8e44ad" }]);
    c.setData([history.ts, columns.fps, columns.latency_ms]);
  }
}

// -- events, logs, actions -------------------------------------------------------------------

function renderEvents(events) {
  const rows = events.slice(-15).reverse().map((e) => {
    const time = new Date(e.ts * 1000).toLocaleTimeString();
    const what = e.type === "governor"
      ? `governor ${e.previous} → ${e.level}: ${e.reason}`
      : e.type === "camera"  // a camera health problem that started or cleared
      ? `camera ${e.camera}: ${e.problem.replace("_", " ")} ${e.change === "start" ? "since" : "cleared after"} ${new Date(e.since * 1000).toLocaleTimeString()} (${e.detail})`
      : `${e.camera ?? e.pipeline}: ${e.label}${e.classification ? ` → ${e.classification.label}` : ""} #${e.track_id} ${e.type}${e.type === "end" ? ` after ${fmt(e.duration_s, 1, "s")}` : ""} (${fmt(e.confidence, 2)})`;
    const media = [];  // the kept snapshot and clip, served by /api/events/<id>/... with the page's credentials
    if (e.snapshot) media.push(el("a", { href: `/api/events/${e.object_id}/snapshot`, target: "_blank", class: "snapshot" }, "snapshot"));
    if (e.clip) media.push(el("a", { href: `/api/events/${e.object_id}/clip`, target: "_blank", class: "clip" }, "clip"));
    return el("tr", {}, el("td", {}, time), el("td", {}, what), el("td", {}, ...media));
  });
  $("events").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", {}, "no events yet"))]));
}

// samples for retraining (issue 40 item 3): count, size and newest per camera keeping them
function renderSamples(kept) {
  const names = Object.keys(kept).sort();
  $("samples-section").hidden = names.length === 0;
  $("samples").tBodies[0].replaceChildren(...names.map((name) => {
    const k = kept[name];
    return el("tr", { "data-camera": name }, el("td", {}, name), el("td", { class: "count" }, String(k.count)),
      el("td", {}, fmt(k.bytes / 1048576, 1, "MiB")), el("td", { class: "newest" }, k.newest === null ? "none yet" : ago(k.newest)));
  }));
}

function renderLogs(lines) {
  // every audit line (the page's actions: a ring of their own) and the 60 newest others
  const shown = [...lines.filter((l) => l.audit), ...lines.filter((l) => !l.audit).slice(-60)].sort((a, b) => a.ts - b.ts);
  $("logs").textContent = shown.reverse().map((l) =>
    `${new Date(l.ts * 1000).toLocaleTimeString()} ${(l.audit ? "AUDIT" : l.level).padEnd(7)} ${l.message}`).join("\n") || "no log lines yet";
}

async function act(path, what) {
  if (!window.confirm(`Really ${what}?`)) return;
  const result = $("action-result");
  result.textContent = `${what}…`;
  result.className = "";
  try {
    const body = await api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
    result.textContent = body.deployment ? `Done: ${body.deployment.state} to ${body.deployment.name} ${body.deployment.version}.` : `Done: ${what}.`;
    result.className = "good";
  } catch (error) {
    result.textContent = error.status === 401 || error.status === 403 ? `Not allowed: ${error.message}` : `Failed: ${error.message}`;
    result.className = "fail";
  }
  refresh();
}

// -- the loop --------------------------------------------------------------------------------

async function refresh() {
  try {
    const since = history.ts.length ? history.ts[history.ts.length - 1] : 0;
    const [status, problems, points] = await Promise.all([api("/api/status"), api("/api/problems"), api(`/api/history?since=${since}`)]);
    $("offline").hidden = true;
    renderStatus(status);
    renderProblems(problems);
    appendHistory(points);
    drawCharts();
  } catch (error) {
    $("offline").hidden = false;
    $("offline").textContent = `The agent does not answer (${error.message}): is the service running? (systemctl status edge-agent)`;
  }
}

async function refreshSlow() {
  try {
    const [events, logs, samples] = await Promise.all([api("/api/events"), api("/api/logs"), api("/api/samples")]);
    renderEvents(events);
    renderLogs(logs);
    renderSamples(samples);
  } catch (error) { /* the fast loop says the agent is gone */ }
}

$("rollback").addEventListener("click", () => act("/api/rollback", "roll back to the previous version"));
refresh();
refreshSlow();
setInterval(refresh, REFRESH_MS);
setInterval(refreshSlow, SLOW_REFRESH_MS);
window.edgeAgent = { charts, history, nothingToDraw, get status() { return lastStatus; } };
