// The lingstream page: a thin view over @lingstream/client (web/packages/client, served as the built
// /static/lingstream-client.js): create a session, follow its queue position, join it (embedded WebRTC or LiveKit),
// show the video, send the held keys, and show what the service applied and how fast. With `?watch=<session id>` it
// watches a session instead (a viewer on either transport: video and status, no control); a running session's page
// shows that link. The controller can pause and resume the session and steer it with a text prompt. What a session
// does lives in the package; this file holds only what is the page's: the form, the credential it picks, the share
// link, the words it shows. `window.lingstream` is a small view of the page's state for tests and the console.

import {
  ApiError,
  MAX_PROMPT_BYTES,
  STREAMING_STATES as STREAMING,
  TERMINAL_STATES as TERMINAL,
  createSession,
  tokenEndpoint,
  utf8Bytes,
  watchSession,
} from "./lingstream-client.js";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "lingstream.apiKey";
const query = new URLSearchParams(window.location.search);
const watchId = query.get("watch");
// `?token=`: a client token to create with (controller), or a share link's watch token (with `?watch=`). It is used
// once and taken out of the address bar, so a reload or a copied URL does not carry a spent credential.
let urlToken = query.get("token");
if (urlToken !== null && !watchId) {
  query.delete("token");
  const rest = query.toString();
  history.replaceState(null, "", `${window.location.pathname}${rest ? `?${rest}` : ""}`);
}
// `?jitter_ms=N`: ask the receiver to hold at most about N ms of video before showing it (RTCRtpReceiver
// `jitterBufferTarget`); absent, the browser's own adaptive choice. bench/latency.py measures both side by side.
const jitterTargetMs = query.has("jitter_ms") ? Math.max(0, Number(query.get("jitter_ms")) || 0) : null;

const video = $("video");
let pageConfig = { transport: null, livekit_client: null, api_keys: false, token_url: null };
let apiKey = sessionStorage.getItem(KEY_STORAGE) || "";
let session = null; // the current @lingstream/client Session
let pending = { state: "idle", credential: "none" }; // what the page shows before a session exists
let sharing = false; // a share link is being asked for
let shareUrl = null;
const role = watchId ? "viewer" : "controller";

const emptyStats = { frames: 0, framesThisConnection: 0, fps: 0, latencyMs: null, photonMs: null, framesById: 0, repeatsById: 0 };
const stats = () => (session !== null ? session.stats : emptyStats);
const live = (name, fallback) => (session !== null ? session[name] : fallback);

window.lingstream = {
  get state() { return session !== null ? session.state : pending.state; },
  get sessionId() { return session !== null ? session.id : pending.sessionId ?? null; },
  get queuePosition() { return live("queuePosition", null); },
  get transport() { return live("transport", null); },
  get lastChunk() { return live("lastChunk", null); },
  get chunks() { return session !== null ? session.chunks.slice() : []; },
  get frames() { return stats().frames; },
  get framesThisConnection() { return stats().framesThisConnection; },
  get fps() { return stats().fps; },
  get latencyMs() { return stats().latencyMs; },
  get photonMs() { return stats().photonMs; },
  get photonsMs() { return session !== null ? session.figures.photonsMs.slice() : []; },
  get errors() { return session !== null ? session.errors.filter((e) => !LOCAL_CODES.has(e.code)) : []; },
  get calls() { return session !== null ? session.calls.slice() : []; },
  get framesById() { return stats().framesById; },
  get repeatsById() { return stats().repeatsById; },
  get warnings() { return session !== null ? session.warnings.slice() : []; },
  get lastPrompt() { return live("lastPrompt", null); },
  get done() { return live("done", null); },
  get ended() { return live("ended", false); },
  get role() { return role; },
  get credential() { return session !== null ? session.credential : pending.credential; },
  get shareUrl() { return shareUrl; },
  // LiveKit only: the service participant's attributes as the page last read them (`lingstream.state`, ...).
  get serviceAttributes() { return session !== null && session.link && session.link.attributes ? { ...session.link.attributes } : {}; },
  get connection() { return live("connection", null); },
  get jitterBufferTarget() { return live("jitterBufferTarget", null); },
  get generation() { return session !== null ? session.generation : 0; },
  get pc() { return session !== null && session.link !== null ? session.link.pc : null; },
  get lastSent() { return session !== null ? session.controls.lastSent : null; },
  get seq() { return session !== null ? session.controls.seq : null; },
  get videoSize() { return { width: video.videoWidth, height: video.videoHeight }; },
  get session() { return session; }, // the @lingstream/client Session itself (the console)
  reconnect() {
    const link = session !== null ? session.link : null;
    return link !== null && link.kind === "embedded" ? link.connect() : Promise.resolve();
  },
  // LiveKit only: livekit-client's own fault drill on the room connection (tests), e.g. "signal-reconnect" (the signal
  // connection closed here: a resume) or "node-failure" (the server drops the participant: its resume is refused).
  simulate(scenario) {
    const link = session !== null ? session.link : null;
    return link !== null && link.kind === "livekit" ? link.simulate(scenario) : Promise.resolve(false);
  },
  // Sends a control protocol message on the current link as the page would (tests, the console); false if none.
  send(message, reliable = true) { return session !== null ? session.send(message, reliable) : false; },
};

// The client's own failure codes, which the page shows but does not count as the service's `error` statuses.
const LOCAL_CODES = new Set(["join_failed", "no_transport", "connection_lost", "stop_failed"]);

// -- rendering --------------------------------------------------------------------------------------------------

function say(text, isError = false) {
  const message = $("message");
  message.textContent = text;
  message.classList.toggle("error", isError);
}

function render() {
  const state = window.lingstream.state;
  const id = window.lingstream.sessionId;
  $("state").textContent = state;
  const queued = state === "queued";
  const position = window.lingstream.queuePosition;
  $("queue").hidden = !queued;
  $("queue-position").textContent = queued && position !== null ? String(position) : "–";
  const linked = session !== null && session.link !== null && !TERMINAL.has(state);
  const viewer = role === "viewer";
  $("stop").disabled = viewer || id === null || TERMINAL.has(state);
  $("reset").disabled = viewer || !linked;
  // Recovering (the model worker failed; the session is rebuilt from its checkpoint): keys and prompts are kept for
  // the first chunk after it, but a pause is refused until it runs again.
  const steerable = !viewer && linked && ["running", "paused", "recovering"].includes(state);
  $("pause").disabled = !steerable || state === "recovering";
  $("pause").textContent = state === "paused" ? "Resume" : "Pause";
  $("prompt-live").disabled = !steerable;
  $("send-prompt").disabled = !steerable;
  $("prompt-form").hidden = viewer;
  $("start").disabled = id !== null && !TERMINAL.has(state) && state !== "idle";
  const watchLink = $("watch-link");
  watchLink.hidden = viewer || id === null || !STREAMING.has(state);
  if (!watchLink.hidden && window.lingstream.credential === "session_token") watchLink.hidden = shareUrl === null;
  if (!watchLink.hidden) watchLink.href = shareUrl || `/?watch=${encodeURIComponent(id)}`;
  $("controls-help").hidden = viewer;
  $("control-buttons").hidden = viewer;
  const held = session !== null ? [...session.keys.held].sort() : [];
  $("hud-held").textContent = held.length ? held.join(" ") : "none";
  const chunk = window.lingstream.lastChunk;
  $("hud-applied").textContent = chunk ? (chunk.keys.length ? chunk.keys.join(" ") : "none") : "–";
  $("hud-chunk").textContent = chunk ? `#${chunk.index} (seq ${chunk.applied_seq})` : "–";
  $("hud-prompt").textContent = chunk ? (chunk.prompt ? chunk.prompt : "none") : "–";
  const figures = stats();
  $("hud-fps").textContent = figures.frames ? `${figures.fps.toFixed(1)} fps, ${figures.frames} frames` : "–";
  $("hud-latency").textContent = latencyText(figures.latencyMs, figures.latencyMedianMs);
  $("hud-photon").textContent = latencyText(figures.photonMs, figures.photonMedianMs);
  $("hud-video").textContent = video.videoWidth ? `${video.videoWidth}×${video.videoHeight}` : "–";
  $("hud-connection").textContent = window.lingstream.connection || "–";
}

function latencyText(latest, median) {
  if (latest === null || latest === undefined) return "–";
  return `${Math.round(latest)} ms (median ${Math.round(median ?? latest)} ms)`;
}

// -- the session's events → the page's words ----------------------------------------------------------------------

function listen(current) {
  current.on("change", render);
  current.on("snapshot", (snapshot) => {
    if (snapshot.status === "queued") say("Waiting for a free slot…");
    if (TERMINAL.has(snapshot.status)) {
      const why = snapshot.error ? `${snapshot.error.code}: ${snapshot.error.message}` : snapshot.reason || snapshot.status;
      say(`The session is over (${snapshot.status}: ${why}).`, snapshot.status === "failed");
    }
    if (STREAMING.has(snapshot.status) && current.credential === "session_token" && shareUrl === null && !sharing) {
      makeShareLink(current, snapshot.id);
    }
  });
  let recovering = false;
  current.on("state", ({ state, detail }) => {
    if (state === "recovering") say(detail || "the model worker failed; rebuilding the session");
    else if (recovering && state === "running") say("the session runs again");
    recovering = state === "recovering";
  });
  let opened = false;
  current.on("connection", ({ phase }) => {
    if (phase === "connecting") say("Connecting…");
    if (phase !== "open" || opened) return;
    opened = true;
    if (role === "viewer") say("Watching (a viewer: the keys here steer nothing).");
    else say("Connected. Click the video, then hold W A S D / I J K L or the arrow keys.");
    $("stage").focus();
  });
  current.on("warning", (message) => say(`The session ends in ${Math.round(message.ends_in_s)} s: ${message.message}`));
  current.on("error", (message) => {
    if (message.code === "no_transport") say("This service has no transport configured: the session runs without video.", true);
    else if (message.code === "join_failed") say(`Could not join: ${message.message.replace(/^could not join: /, "")}`, true);
    else if (message.code === "connection_lost") say(`The connection cannot be restored: ${message.message}`, true);
    else if (LOCAL_CODES.has(message.code)) say(message.message, true);
    else say(`The service reported ${message.code}: ${message.message}`, true);
  });
  current.on("done", ({ reason }) => {
    if (!TERMINAL.has(current.state)) say(`The session is over (${reason}).`);
  });
  current.on("stream", () => $("stage").focus());
}

// -- the session ----------------------------------------------------------------------------------------------------

function sessionOptions() {
  return {
    jitterBufferTargetMs: jitterTargetMs,
    livekitClient: () => {
      if (!pageConfig.livekit_client) throw new Error("the livekit-client bundle is not installed on this server");
      return import(pageConfig.livekit_client);
    },
    frameMetadataWorker: () =>
      new Worker(new URL("livekit-client.fm.worker.mjs", new URL(pageConfig.livekit_client, window.location.href)), {
        type: "module",
      }),
  };
}

async function readImage() {
  const file = $("image").files[0];
  if (!file) return null;
  const url = await new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
  return String(url).slice(String(url).indexOf(",") + 1);
}

function readConfig() {
  const config = {};
  for (const name of ["width", "height", "fps", "seed"]) {
    const value = $(name).value.trim();
    if (value !== "") config[name] = Number(value);
  }
  if (!$("hud").checked) config.hud = false;
  return config;
}

// What the create authenticates with: a `?token=` client token (once), the app's token endpoint, else the API key
// the user typed (asked for only without a token endpoint).
function chooseCredential() {
  if (urlToken !== null) {
    const token = urlToken;
    urlToken = null;
    return { credential: "client_token", tokenProvider: async () => token };
  }
  if (pageConfig.token_url) return { credential: "client_token", tokenProvider: tokenEndpoint(pageConfig.token_url) };
  if (pageConfig.api_keys) {
    apiKey = $("api-key").value.trim();
    if (apiKey) sessionStorage.setItem(KEY_STORAGE, apiKey);
    else sessionStorage.removeItem(KEY_STORAGE);
  }
  return { credential: apiKey ? "key" : "none", apiKey: apiKey || undefined };
}

async function start(event) {
  event.preventDefault();
  if (session !== null && !TERMINAL.has(session.state)) return;
  if (session !== null) session.close();
  session = null;
  shareUrl = null;
  sharing = false;
  pending = { state: "creating", credential: "none" };
  say("Creating a session…");
  render();
  try {
    const { credential, ...auth } = chooseCredential();
    pending.credential = credential;
    const body = { config: readConfig() };
    const prompt = $("prompt").value.trim();
    if (prompt !== "") {
      if (utf8Bytes(prompt) > MAX_PROMPT_BYTES) throw new Error(`the prompt is over ${MAX_PROMPT_BYTES} bytes`);
      body.prompt = prompt;
    }
    const image = await readImage();
    if (image !== null) body.image = image;
    session = await createSession({ ...sessionOptions(), ...auth, ...body });
    listen(session);
    session.attachKeyboard(window);
    if (session.state === "queued") say("Waiting for a free slot…");
    render();
    session.join(video);
  } catch (error) {
    pending.state = "idle";
    if (error instanceof ApiError && error.code === "token_endpoint_failed") {
      say(`Could not get a token from this app: ${error.message}`, true);
    } else if (error instanceof ApiError && pending.credential === "client_token") {
      say(`The client token was refused (${error.code}): ${error.message}`, true);
    } else if (error instanceof ApiError && error.status === 401 && !pageConfig.token_url) {
      $("api-key-row").hidden = false;
      say("This service needs an API key: enter it and start again.", true);
    } else if (error instanceof ApiError && error.status === 429) {
      say(`Every slot is taken and the queue is full; try again in about ${error.retryAfter || "a few"} s.`, true);
    } else {
      say(`Could not create a session: ${error.message}`, true);
    }
    render();
  }
}

// A session token's page shares its session with a share link (made once, when the session streams).
async function makeShareLink(current, id) {
  sharing = true;
  try {
    const { body } = await current.api.share(id);
    if (session === current) shareUrl = body.watch_url;
  } catch (error) {
    say(`Could not make a share link: ${error.message}`, true);
  }
  render();
}

// Watch a session someone else controls: join with a viewer token, follow its event stream until it ends.
async function watch(id) {
  $("setup").hidden = true;
  pending = { state: "joining", credential: urlToken !== null ? "watch_token" : "none", sessionId: id };
  say("Joining as a viewer…");
  render();
  try {
    const auth = urlToken !== null ? { token: urlToken } : { apiKey: apiKey || undefined };
    session = await watchSession({ ...sessionOptions(), ...auth, sessionId: id });
    listen(session);
    render();
    session.join(video);
  } catch (error) {
    pending.state = "idle";
    say(`Cannot watch session ${id}: ${error.message}`, true);
    render();
  }
}

function stop() {
  if (session === null || session.id === null) return;
  say("Stopping…");
  session.stop();
}

// Pause or resume over the link (the REST routes do the same for clients without one); the state follows as a
// `state` status (and, on LiveKit, as the call's answer).
function togglePause() {
  if (session === null || session.link === null) return;
  if (session.state === "paused") session.resume();
  else session.pause();
}

function sendPrompt(event) {
  event.preventDefault();
  const text = $("prompt-live").value.trim();
  if (utf8Bytes(text) > MAX_PROMPT_BYTES) {
    say(`A prompt is at most ${MAX_PROMPT_BYTES} bytes (this one has ${utf8Bytes(text)}).`, true);
    return;
  }
  if (session !== null) {
    session.prompt(text).then((sent) => {
      if (sent) say(text ? `Prompt sent: “${text}”. It applies from the next chunk.` : "Prompt cleared.");
    });
  }
  $("stage").focus();
  render();
}

function resetPose() {
  if (session !== null) session.resetPose();
  $("stage").focus();
}

// -- start --------------------------------------------------------------------------------------------------------

async function loadConfig() {
  try {
    const response = await fetch("/page-config.json");
    pageConfig = await response.json();
  } catch {
    pageConfig = { transport: null, livekit_client: null, api_keys: false };
  }
  const parts = [];
  if (pageConfig.transport === "embedded") parts.push("Transport: direct WebRTC with the service (embedded).");
  else if (pageConfig.transport === "livekit") parts.push("Transport: LiveKit.");
  else parts.push("This service has no transport: sessions run without video.");
  if (!pageConfig.livekit_client) {
    parts.push(
      pageConfig.transport === "livekit"
        ? "The livekit-client bundle is missing on this server: the page cannot join."
        : "LiveKit is unavailable here (no livekit-client bundle).",
    );
  }
  $("transport-info").textContent = parts.join(" ");
  // With a token endpoint (or a `?token=`) the page never asks for an API key.
  const tokens = Boolean(pageConfig.token_url) || urlToken !== null;
  $("api-key-row").hidden = !pageConfig.api_keys || tokens;
  if (pageConfig.api_keys && !tokens) $("api-key").value = apiKey;
}

// Leaving the page ends its session at once (instead of holding a slot until the reconnect grace runs out); a viewer
// leaving ends nothing.
window.addEventListener("pagehide", () => {
  if (role === "controller" && session !== null && session.id !== null && !TERMINAL.has(session.state)) {
    session.api.endOnUnload(session.id);
  }
});
$("create-form").addEventListener("submit", start);
$("stop").addEventListener("click", stop);
$("reset").addEventListener("click", resetPose);
$("pause").addEventListener("click", togglePause);
$("prompt-form").addEventListener("submit", sendPrompt);
$("stage").addEventListener("click", () => $("stage").focus());
setInterval(render, 500);
render();
loadConfig().then(() => {
  if (watchId) watch(watchId);
});
