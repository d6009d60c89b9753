// The lingstream page: create a session, follow its queue position, join it (embedded WebRTC or LiveKit), show the
// video, send the held keys, and show what the service applied and how fast. With `?watch=<session id>` it watches a
// session instead (a viewer on either transport: video and status, no control); a running session's page shows that
// link. The controller can pause and resume the session and steer it with a text prompt (sent on the link, newest wins
// by its own seq; the HUD shows the prompt the newest chunk was generated from). `window.lingstream` is a small view
// of the page's state for tests and the console.
//
// A session ends on the page once: the event stream reports the terminal state and the link brings the final `done`
// status, in either order. The link closes when both have happened, or DONE_WAIT_MS after the terminal state when no
// `done` comes (the link was down), so the reason the service gave is never cut off by closing the link early.

import { Api, ApiError } from "./api.js";
import { Controls } from "./controls.js";
import { EmbeddedLink } from "./embedded.js";
import { LiveKitLink } from "./livekit.js";

const $ = (id) => document.getElementById(id);
const TERMINAL = new Set(["closed", "expired", "failed", "cancelled"]);
const STREAMING = new Set(["running", "paused", "recovering", "draining"]);
const MAX_PROMPT_BYTES = 512;
const encoder = new TextEncoder();
const HISTORY = 64;
const DONE_WAIT_MS = 2000;
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

const api = new Api();
const video = $("video");
let pageConfig = { transport: null, livekit_client: null, api_keys: false, token_url: null };
let sharing = false; // a share link is being asked for
let link = null;
let joining = false;
let follower = null; // AbortController of the event stream
let doneTimer = null; // closes the link if `done` does not follow the terminal state

const page = {
  state: "idle", // idle | creating | queued | admitted | running | paused | recovering | draining | closed | expired | failed | cancelled
  sessionId: null,
  queuePosition: null,
  transport: null,
  lastChunk: null,
  chunks: [], // the last HISTORY chunk statuses, each with the peer connection generation it arrived on
  frames: 0, // video frames shown (requestVideoFrameCallback), over the whole session
  framesThisConnection: 0,
  fps: 0,
  latencyMs: null, // control to the chunk status of the newest applied snapshot (the chunk left the model)
  latenciesMs: [],
  photonMs: null, // control to the first presented frame generated from it (matched by RTP timestamp)
  photonsMs: [],
  errors: [],
  framesById: 0, // frames matched to their chunks by their frame id (LiveKit frame metadata)
  repeatsById: 0, // keep-warm repeats told apart by their frame id
  calls: [], // discrete commands sent as LiveKit RPC calls: {type, state, applied} answered, or {type, code} refused
  warnings: [], // `warning` statuses: the session ends soon (its time limit, a pause that lasts too long)
  promptSeq: Date.now(), // the prompt's own sequence (newest wins); Date.now() starts above an earlier page load's
  lastPrompt: null, // the last prompt message this page sent
  done: null,
  ended: false, // the session is over and the page let go of its link
  connection: null,
  jitterBufferTarget: null, // the receiver's jitterBufferTarget (ms) once the video arrived; null: none set
  role: watchId ? "viewer" : "controller",
  credential: "none", // none | key | client_token | session_token | watch_token: what the page authenticates with
  shareUrl: null, // the share link of this session (a session token's page), once made
};
const frameTimes = [];

const controls = new Controls(
  (message, reliable) => (link !== null ? link.send(message, reliable) : false),
  () => render(),
);

window.lingstream = {
  get state() { return page.state; },
  get sessionId() { return page.sessionId; },
  get queuePosition() { return page.queuePosition; },
  get transport() { return page.transport; },
  get lastChunk() { return page.lastChunk; },
  get chunks() { return page.chunks.slice(); },
  get frames() { return page.frames; },
  get framesThisConnection() { return page.framesThisConnection; },
  get fps() { return page.fps; },
  get latencyMs() { return page.latencyMs; },
  get photonMs() { return page.photonMs; },
  get photonsMs() { return page.photonsMs.slice(); },
  get errors() { return page.errors.slice(); },
  get calls() { return page.calls.slice(); },
  get framesById() { return page.framesById; },
  get repeatsById() { return page.repeatsById; },
  get warnings() { return page.warnings.slice(); },
  get lastPrompt() { return page.lastPrompt; },
  get done() { return page.done; },
  get ended() { return page.ended; },
  get role() { return page.role; },
  get credential() { return page.credential; },
  get shareUrl() { return page.shareUrl; },
  // LiveKit only: the service participant's attributes as the page last read them (`lingstream.state`, ...).
  get serviceAttributes() { return link !== null && link.attributes ? { ...link.attributes } : {}; },
  get connection() { return page.connection; },
  get jitterBufferTarget() { return page.jitterBufferTarget; },
  get generation() { return link !== null && link.generation !== undefined ? link.generation : 0; },
  get pc() { return link !== null ? link.pc : null; },
  get lastSent() { return controls.lastSent; },
  get seq() { return controls.seq; },
  get videoSize() { return { width: video.videoWidth, height: video.videoHeight }; },
  reconnect() { return link !== null && link.kind === "embedded" ? link.connect() : Promise.resolve(); },
  // LiveKit only: livekit-client's own fault drill on the room connection (tests), e.g. "signal-reconnect" (the signal
  // connection closed here: a resume) or "node-failure" (the server drops the participant: its resume is refused).
  simulate(scenario) {
    return link !== null && link.kind === "livekit" ? link.simulate(scenario) : Promise.resolve(false);
  },
  // Sends a control protocol message on the current link as the page would (tests, the console); false if none.
  send(message, reliable = true) { return link !== null ? link.send(message, reliable) : false; },
};

// -- rendering --------------------------------------------------------------------------------------------------

function say(text, isError = false) {
  const message = $("message");
  message.textContent = text;
  message.classList.toggle("error", isError);
}

function render() {
  $("state").textContent = page.state;
  const queued = page.state === "queued";
  $("queue").hidden = !queued;
  $("queue-position").textContent = queued && page.queuePosition !== null ? String(page.queuePosition) : "–";
  const live = link !== null && !TERMINAL.has(page.state);
  const viewer = page.role === "viewer";
  $("stop").disabled = viewer || page.sessionId === null || TERMINAL.has(page.state);
  $("reset").disabled = viewer || !live;
  // Recovering (the model worker failed; the session is rebuilt from its checkpoint): keys and prompts are kept for
  // the first chunk after it, but a pause is refused until it runs again.
  const steerable = !viewer && live && ["running", "paused", "recovering"].includes(page.state);
  $("pause").disabled = !steerable || page.state === "recovering";
  $("pause").textContent = page.state === "paused" ? "Resume" : "Pause";
  $("prompt-live").disabled = !steerable;
  $("send-prompt").disabled = !steerable;
  $("prompt-form").hidden = viewer;
  $("start").disabled = page.sessionId !== null && !TERMINAL.has(page.state);
  const watchLink = $("watch-link");
  watchLink.hidden = viewer || page.sessionId === null || !STREAMING.has(page.state);
  if (!watchLink.hidden && page.credential === "session_token") watchLink.hidden = page.shareUrl === null;
  if (!watchLink.hidden) watchLink.href = page.shareUrl || `/?watch=${encodeURIComponent(page.sessionId)}`;
  $("controls-help").hidden = viewer;
  $("control-buttons").hidden = viewer;
  $("hud-held").textContent = controls.held.size ? [...controls.held].sort().join(" ") : "none";
  const chunk = page.lastChunk;
  $("hud-applied").textContent = chunk ? (chunk.keys.length ? chunk.keys.join(" ") : "none") : "–";
  $("hud-chunk").textContent = chunk ? `#${chunk.index} (seq ${chunk.applied_seq})` : "–";
  $("hud-prompt").textContent = chunk ? (chunk.prompt ? chunk.prompt : "none") : "–";
  $("hud-fps").textContent = page.frames ? `${page.fps.toFixed(1)} fps, ${page.frames} frames` : "–";
  $("hud-latency").textContent = latencyText(page.latencyMs, page.latenciesMs);
  $("hud-photon").textContent = latencyText(page.photonMs, page.photonsMs);
  $("hud-video").textContent = video.videoWidth ? `${video.videoWidth}×${video.videoHeight}` : "–";
  $("hud-connection").textContent = page.connection || "–";
}

function latencyText(latest, recent) {
  if (latest === null) return "–";
  const sorted = recent.slice().sort((a, b) => a - b);
  const median = sorted[Math.floor(sorted.length / 2)];
  return `${Math.round(latest)} ms (median ${Math.round(median)} ms)`;
}

// -- control → photon ---------------------------------------------------------------------------------------------
// A chunk status carries `first_frame_pts`, the 90 kHz presentation timestamp of the chunk's first frame; the RTP
// timestamp of that frame is the same plus an offset the sender picked at random. The offset is learnt once per
// peer connection from the first frame presented after a stamped status arrived (the status leaves the service
// with that frame), and from then on each chunk's first frame is found exactly by its `rtpTimestamp`.
// Keep-warm repeats (docs/control-protocol.md): while the session has nothing new, the service sends the last frame
// again every LINGSTREAM_IDLE_FRAME_INTERVAL_MS, REPEAT_TICKS off the grid generated frames sit on. Once the offset is
// known such a frame is told apart (`isRepeat`) and neither counted as a frame nor taken for a chunk's first frame.
//
// The frame the offset is learnt from may itself be a repeat: a page that (re)connects while the session idles or
// is paused gets only repeats, and when the next chunk comes, repeats sent just before its first frame may still be
// presented after its status (the video takes the longer way). Learnt from a repeat, the offset is REPEAT_TICKS too
// high: generated frames would lie REPEAT_TICKS *before* the grid and be taken for repeats, and repeats would be
// counted. Nothing lies there when the offset is right (generated frames are on the grid, repeats after it), so the
// first frame presented there shows it and is the first generated frame since: the offset is learnt again from it
// (the pacer sends the frame that ends the repeats at once, so it is the first frame of the chunk the status named,
// unless generation fell behind within that chunk: then it is a later one, as when the offset is learnt from a
// generated frame), and what was done on the repeats since the first learning is undone (`photon.learnt`): their
// frame counts and photon samples are taken back and the chunk starts they were taken for wait for their frames.
const REPEAT_TICKS = 90; // transport.session.pacing.REPEAT_PTS_OFFSET: 1 ms of the 90 kHz clock
const GRID_SLACK = 2; // ticks: a phase combines four timestamps (frame, origin's frame and status, reference), each rounded
const photon = { generation: null, origin: null, pending: [], reference: null, fps: null, learnt: null };

// On LiveKit the RTP timestamps are the SFU's sender's, but every frame carries the service's frame id (LiveKit frame
// metadata, read by the link: `link.frameId(meta)`) and every chunk status its first frame's (`first_frame_id`): a
// chunk starts at the first frame presented whose id is at least its `first_frame_id`, exactly, and a frame whose id
// was presented already is a keep-warm repeat (a repeat carries the id of the frame it repeats).
const byId = { newest: null, pending: [] };

function expectPhotonById(message) {
  if (typeof message.first_frame_id !== "number") return;
  const sent = controls.sentTime(message.applied_seq);
  if (sent === null) return;
  byId.pending.push({ id: message.first_frame_id, sent });
  if (byId.pending.length > 16) byId.pending.shift();
}

function presentedById(now, id) {
  if (byId.newest !== null && id <= byId.newest) {
    page.repeatsById += 1;
    return;
  }
  byId.newest = id;
  page.framesById += 1;
  frameShown(now, 1);
  while (byId.pending.length && id >= byId.pending[0].id) {
    const next = byId.pending.shift();
    page.photonMs = now - next.sent;
    page.photonsMs.push(page.photonMs);
    if (page.photonsMs.length > 20) page.photonsMs.shift();
  }
}

function stamped(message) {
  if (typeof message.first_frame_pts !== "number") return;
  if (photon.reference === null) photon.pending.push({ pts: message.first_frame_pts, sent: null });
  photon.reference = message.first_frame_pts;
}

// How many ticks a frame lies off the grid of generated frames (signed, within half a frame), or null while the grid
// is unknown.
function gridPhase(meta) {
  // LiveKit's sender stamps RTP from its own capture clock: the grid is the service's only on the embedded transport.
  if (page.transport !== "embedded") return null;
  if (!meta || typeof meta.rtpTimestamp !== "number" || photon.origin === null || photon.reference === null) return null;
  if (!(photon.fps > 0)) return null;
  const ticks = 90000 / photon.fps;
  const delta = (meta.rtpTimestamp - ((photon.origin + photon.reference) >>> 0)) | 0; // signed, modulo 2^32
  return delta - Math.round(Math.round(delta / ticks) * ticks);
}

function isRepeat(meta) {
  const phase = gridPhase(meta);
  return phase !== null && Math.abs(phase) > GRID_SLACK;
}

// Checks the learnt offset against a frame (see above): a frame REPEAT_TICKS before the grid proves that it was learnt
// from a repeat, and it is learnt again from this frame; a repeat where repeats lie proves it right.
function checkOrigin(meta) {
  const learnt = photon.learnt;
  const phase = gridPhase(meta);
  if (learnt === null || phase === null) return;
  if (Math.abs(phase - REPEAT_TICKS) <= GRID_SLACK) {
    photon.learnt = null;
  } else if (Math.abs(phase + REPEAT_TICKS) <= GRID_SLACK) {
    photon.learnt = null;
    photon.origin = (meta.rtpTimestamp - learnt.pts) >>> 0;
    page.frames -= learnt.frames;
    page.framesThisConnection = Math.max(0, page.framesThisConnection - learnt.frames);
    frameTimes.splice(Math.max(0, frameTimes.length - learnt.frames));
    page.photonsMs.splice(Math.max(0, page.photonsMs.length - learnt.samples));
    page.photonMs = page.photonsMs.length ? page.photonsMs[page.photonsMs.length - 1] : null;
    photon.pending.unshift(...learnt.consumed);
  }
}

function expectPhoton(message) {
  if (typeof message.first_frame_pts !== "number") return;
  const sent = controls.sentTime(message.applied_seq);
  if (sent === null) return;
  photon.pending.push({ pts: message.first_frame_pts, sent });
  if (photon.pending.length > 16) photon.pending.shift();
}

function framePresented(now, meta) {
  if (!meta || typeof meta.rtpTimestamp !== "number") return;
  const generation = window.lingstream.generation;
  if (photon.generation !== generation) Object.assign(photon, { generation, origin: null, learnt: null });
  const learnt = photon.learnt;
  if (learnt !== null) learnt.frames += 1;
  while (photon.pending.length) {
    const next = photon.pending[0];
    if (photon.origin === null) {
      photon.origin = (meta.rtpTimestamp - next.pts) >>> 0;
      photon.learnt = { pts: next.pts, frames: 1, samples: 0, consumed: [] }; // what to undo if this was a repeat
    }
    const ahead = (meta.rtpTimestamp - ((photon.origin + next.pts) >>> 0)) | 0; // signed, modulo 2^32
    if (ahead < 0) break;
    photon.pending.shift();
    if (photon.learnt !== null && photon.learnt.consumed.length < 16) photon.learnt.consumed.push(next);
    if (next.sent === null) continue; // only learnt the offset from it
    page.photonMs = now - next.sent;
    page.photonsMs.push(page.photonMs);
    if (page.photonsMs.length > 20) page.photonsMs.shift();
    if (photon.learnt !== null) photon.learnt.samples += 1;
  }
}

// -- video frames -------------------------------------------------------------------------------------------------

function countFrames() {
  if (!("requestVideoFrameCallback" in HTMLVideoElement.prototype)) {
    let last = 0; // fallback: decoded frames from the playback quality counters
    setInterval(() => {
      const total = video.getVideoPlaybackQuality().totalVideoFrames;
      if (total > last) frameShown(performance.now(), total - last);
      last = total;
    }, 250);
    return;
  }
  const onFrame = (now, meta) => {
    const id = link !== null && typeof link.frameId === "function" ? link.frameId(meta) : null;
    if (id !== null) {
      presentedById(now, id);
      video.requestVideoFrameCallback(onFrame);
      return;
    }
    if (window.lingstream.generation !== photon.generation) {
      Object.assign(photon, { generation: window.lingstream.generation, origin: null, reference: null, learnt: null });
    }
    checkOrigin(meta);
    if (!isRepeat(meta)) {
      frameShown(now, 1);
      framePresented(now, meta);
    }
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
}

function frameShown(now, count) {
  page.frames += count;
  page.framesThisConnection += count;
  for (let i = 0; i < count; i++) frameTimes.push(now);
  while (frameTimes.length && frameTimes[0] < now - 1000) frameTimes.shift();
  page.fps = frameTimes.length;
}

setInterval(() => {
  const now = performance.now();
  while (frameTimes.length && frameTimes[0] < now - 1000) frameTimes.shift();
  page.fps = frameTimes.length;
  render();
}, 500);

// -- status messages from the service -----------------------------------------------------------------------------

function onStatus(message) {
  switch (message.type) {
    case "state":
      if (!TERMINAL.has(page.state)) {
        if (message.state === "recovering") say(message.detail || "the model worker failed; rebuilding the session");
        else if (page.state === "recovering" && message.state === "running") say("the session runs again");
        page.state = message.state;
      }
      break;
    case "chunk": {
      stamped(message);
      const previous = page.lastChunk;
      page.lastChunk = message;
      page.chunks.push({ ...message, generation: window.lingstream.generation });
      if (page.chunks.length > HISTORY) page.chunks.shift();
      if (!previous || previous.applied_seq !== message.applied_seq) {
        expectPhoton(message);
        expectPhotonById(message);
        const latency = controls.since(message.applied_seq);
        if (latency !== null) {
          page.latencyMs = latency;
          page.latenciesMs.push(latency);
          if (page.latenciesMs.length > 20) page.latenciesMs.shift();
        }
      }
      break;
    }
    case "warning":
      page.warnings.push(message);
      say(`The session ends in ${Math.round(message.ends_in_s)} s: ${message.message}`);
      break;
    case "error":
      page.errors.push(message);
      say(`The service reported ${message.code}: ${message.message}`, true);
      break;
    case "done":
      page.done = message.reason;
      if (TERMINAL.has(page.state)) {
        finish(); // the event stream said why already
      } else {
        say(`The session is over (${message.reason}).`);
        controls.stop(); // the event stream's terminal state follows; finish() then
      }
      break;
    default:
      break;
  }
  render();
}

// -- the session --------------------------------------------------------------------------------------------------

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

function utf8Bytes(text) {
  return encoder.encode(text).length;
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

function resetPage() {
  if (link !== null) link.close();
  if (follower !== null) follower.abort();
  link = null;
  follower = null;
  clearTimeout(doneTimer);
  doneTimer = null;
  Object.assign(page, {
    state: "creating", sessionId: null, queuePosition: null, transport: null, lastChunk: null, chunks: [],
    frames: 0, framesThisConnection: 0, fps: 0, latencyMs: null, latenciesMs: [], photonMs: null, photonsMs: [],
    errors: [], calls: [], warnings: [], lastPrompt: null, done: null, framesById: 0, repeatsById: 0,
    ended: false, connection: null, shareUrl: null,
  });
  sharing = false;
  frameTimes.length = 0;
  Object.assign(photon, { generation: null, origin: null, pending: [], reference: null, fps: null, learnt: null });
  Object.assign(byId, { newest: null, pending: [] });
}

async function start(event) {
  event.preventDefault();
  if (page.sessionId !== null && !TERMINAL.has(page.state)) return;
  resetPage();
  say("Creating a session…");
  render();
  try {
    await chooseCredential();
    const body = { config: readConfig() };
    const prompt = $("prompt").value.trim();
    if (prompt !== "") {
      if (utf8Bytes(prompt) > MAX_PROMPT_BYTES) throw new Error(`the prompt is over ${MAX_PROMPT_BYTES} bytes`);
      body.prompt = prompt;
    }
    const image = await readImage();
    if (image !== null) body.image = image;
    const { body: session } = await api.createSession(body);
    if (session.session_token) {
      api.useToken(session.session_token); // this session's own token from now on
      page.credential = "session_token";
    }
    onSession(session);
    follow(session.id);
  } catch (error) {
    page.state = "idle";
    if (error instanceof ApiError && page.credential === "client_token") {
      say(`The client token was refused (${error.code}): ${error.message}`, true);
    } else if (error instanceof ApiError && error.code === "token_endpoint_failed") {
      say(`Could not get a token from this app: ${error.message}`, true);
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

// What the create authenticates with: a `?token=` client token (once), the app's token endpoint, else the API key
// the user typed (asked for only without a token endpoint).
async function chooseCredential() {
  api.useToken(null);
  if (urlToken !== null) {
    api.useToken(urlToken);
    urlToken = null;
    page.credential = "client_token";
  } else if (pageConfig.token_url) {
    api.useToken(await api.fetchClientToken(pageConfig.token_url));
    page.credential = "client_token";
  } else {
    if (pageConfig.api_keys) api.setKey($("api-key").value);
    page.credential = api.key ? "key" : "none";
  }
}

// A session token's page shares its session with a share link (made once, when the session streams).
async function makeShareLink(id) {
  sharing = true;
  try {
    const { body } = await api.share(id);
    if (page.sessionId === id) page.shareUrl = body.watch_url;
  } catch (error) {
    say(`Could not make a share link: ${error.message}`, true);
  }
  render();
}

function onSession(session) {
  if (session.id !== page.sessionId && page.sessionId !== null) return;
  page.sessionId = session.id;
  if (!(TERMINAL.has(page.state) && !TERMINAL.has(session.status))) page.state = session.status;
  page.queuePosition = session.queue_position;
  if (session.video && typeof session.video.fps === "number") photon.fps = session.video.fps;
  if (session.status === "queued") say("Waiting for a free slot…");
  if (STREAMING.has(session.status) && link === null && !joining) join(session);
  if (STREAMING.has(session.status) && page.credential === "session_token" && page.shareUrl === null && !sharing) {
    makeShareLink(session.id);
  }
  if (TERMINAL.has(session.status)) {
    const why = session.error ? `${session.error.code}: ${session.error.message}` : session.reason || session.status;
    say(`The session is over (${session.status}: ${why}).`, session.status === "failed");
    finishWhenDone();
  }
  render();
}

// Follow the event stream until the session ends (it is also the queued session's heartbeat).
async function follow(id) {
  const controller = new AbortController();
  follower = controller;
  let failures = 0;
  while (!controller.signal.aborted && page.sessionId === id && !TERMINAL.has(page.state)) {
    try {
      for await (const session of api.events(id, controller.signal)) {
        failures = 0;
        onSession(session);
      }
    } catch (error) {
      if (controller.signal.aborted) return;
      if (error instanceof ApiError && error.status === 404) return;
      failures += 1;
    }
    await new Promise((resolve) => setTimeout(resolve, Math.min(5000, 500 * 2 ** failures)));
  }
}

async function freshDetails(id) {
  const { body } = await api.getSession(id);
  // A watch token reads the session without its join details: a viewer needs only its own.
  if (!STREAMING.has(body.status) || (!body.transport && page.role !== "viewer")) {
    throw new ApiError(409, "session_not_running", `the session is ${body.status}`);
  }
  if (page.role === "viewer") return (await api.createViewer(id)).body; // a viewer's place and credential
  return body.transport;
}

async function join(session) {
  joining = true;
  try {
    await connect(session);
  } finally {
    joining = false;
  }
}

async function connect(session) {
  const id = session.id;
  const handlers = {
    onOpen: () => {
      if (page.role === "controller") {
        controls.start();
        controls.snapshot(); // the service learns the current keys (and a rebound session generates again)
      }
      render();
    },
    onStatus,
    onStream: (stream, receiver) => {
      if (jitterTargetMs !== null && receiver && "jitterBufferTarget" in receiver) {
        receiver.jitterBufferTarget = jitterTargetMs;
      }
      page.jitterBufferTarget = receiver && "jitterBufferTarget" in receiver ? receiver.jitterBufferTarget : null;
      page.framesThisConnection = 0;
      video.srcObject = stream;
      video.play().catch(() => {});
    },
    onState: (text) => {
      page.connection = text;
      render();
    },
    onFatal: (error) => {
      say(`The connection cannot be restored: ${error.message}`, true);
      finish();
    },
  };
  let details = session.transport;
  let fetched = null; // a viewer's details already taken (a place): used, never asked for twice
  if (page.role === "viewer" && !details && STREAMING.has(session.status)) {
    try {
      details = fetched = await freshDetails(id); // a share link's watcher: its viewer details name the transport
    } catch (error) {
      say(`Could not join: ${error.message}`, true);
      render();
      return;
    }
  }
  page.transport = details ? details.kind : null;
  if (!details) {
    say("This service has no transport configured: the session runs without video.", true);
    return;
  }
  try {
    if (details.kind === "embedded" && page.role === "viewer") {
      link = new EmbeddedLink(api, fetched || (await freshDetails(id)), handlers, () => freshDetails(id));
    } else if (details.kind === "embedded") {
      link = new EmbeddedLink(api, details, handlers);
    } else if (details.kind === "livekit") {
      details = fetched || (await freshDetails(id)); // tokens are short-lived: the creation's may be stale by now
      link = new LiveKitLink(pageConfig.livekit_client, details, () => freshDetails(id), handlers);
    } else {
      say(`Unknown transport ${details.kind}: cannot join.`, true);
      return;
    }
    say("Connecting…");
    render();
    await link.connect();
    if (page.role === "viewer") say("Watching (a viewer: the keys here steer nothing).");
    else say("Connected. Click the video, then hold W A S D / I J K L or the arrow keys.");
    $("stage").focus();
  } catch (error) {
    say(`Could not join: ${error.message}`, true);
  }
  render();
}

// The session is terminal: finish once its `done` status is in (at once if it is, or if there is no link that
// could bring it), else after DONE_WAIT_MS.
function finishWhenDone() {
  controls.stop();
  if (page.done !== null || link === null) {
    finish();
  } else if (doneTimer === null && !page.ended) {
    doneTimer = setTimeout(finish, DONE_WAIT_MS);
  }
}

function finish() {
  clearTimeout(doneTimer);
  doneTimer = null;
  controls.stop();
  if (link !== null) link.close();
  if (follower !== null && TERMINAL.has(page.state)) follower.abort();
  page.ended = TERMINAL.has(page.state) || page.ended;
  render();
}

// How long a stop sent over the link may go unanswered before the page ends the session over REST instead. A real
// LiveKit server announces a participant that publishes nothing (this page) to the others in batches, up to 3 s
// after it joined; until then the service cannot tell whose packet it is and ignores it, so a stop sent in a
// page's first seconds is lost.
const STOP_FALLBACK_MS = 2000;

// A discrete command (pause, resume, reset_pose, stop, prompt). On LiveKit an RPC call answered with the session's
// state (a refusal comes back with its stable code and is shown as an `error` status would be); elsewhere, or from a
// service without the RPC methods, a reliable packet whose outcome comes later as a status. Resolves to "answered",
// "sent" or false (nothing went out, or it was refused).
async function command(message) {
  if (link === null) return false;
  if (typeof link.command !== "function") return link.send(message, true) ? "sent" : false;
  try {
    const answer = await link.command(message);
    if (answer === null) return "sent";
    page.calls.push({ type: message.type, state: answer.state, applied: answer.applied });
    if (typeof answer.state === "string" && !TERMINAL.has(page.state)) page.state = answer.state;
    render();
    return "answered";
  } catch (error) {
    // 1503: the service left the room before its answer arrived (livekit-client learns of the departure by
    // signalling, which can overtake the answer): after a stop the session is over, as asked; the REST fallback
    // confirms it.
    if (message.type === "stop" && error.code === 1503) return "sent";
    const code = typeof error.data === "string" && error.data !== "" ? error.data : `rpc_${error.code}`;
    page.calls.push({ type: message.type, code, message: error.message || String(error) });
    onStatus({ v: 1, type: "error", code, message: error.message || String(error) });
    return false;
  }
}

async function stop() {
  if (page.sessionId === null) return;
  say("Stopping…");
  const id = page.sessionId;
  const sent = await command({ v: 1, type: "stop" });
  if (sent === "sent") {
    setTimeout(() => {
      if (page.sessionId === id && !TERMINAL.has(page.state)) endOverRest(id);
    }, STOP_FALLBACK_MS);
  } else if (sent !== "answered") {
    await endOverRest(id);
  }
}

async function endOverRest(id) {
  try {
    const { body } = await api.deleteSession(id);
    onSession(body);
  } catch (error) {
    say(`Could not stop the session: ${error.message}`, true);
  }
}

// Pause or resume over the link (the REST routes do the same for clients without one); the state follows as a
// `state` status (and, on LiveKit, as the call's answer).
function togglePause() {
  if (link === null) return;
  const type = page.state === "paused" ? "resume" : "pause";
  command({ v: 1, type });
}

function sendPrompt(event) {
  event.preventDefault();
  const text = $("prompt-live").value.trim();
  if (utf8Bytes(text) > MAX_PROMPT_BYTES) {
    say(`A prompt is at most ${MAX_PROMPT_BYTES} bytes (this one has ${utf8Bytes(text)}).`, true);
    return;
  }
  page.promptSeq = Math.max(page.promptSeq + 1, Date.now());
  const message = { v: 1, type: "prompt", seq: page.promptSeq, text };
  if (link !== null) {
    page.lastPrompt = message;
    command(message).then((sent) => {
      if (sent) say(text ? `Prompt sent: “${text}”. It applies from the next chunk.` : "Prompt cleared.");
    });
  }
  $("stage").focus();
  render();
}

function resetPose() {
  command({ v: 1, type: "reset_pose" });
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
  if (pageConfig.api_keys && !tokens) $("api-key").value = api.key;
}

// Watch a session someone else controls: join with a viewer token, follow its event stream until it ends.
async function watchSession(id) {
  $("setup").hidden = true;
  page.sessionId = id;
  page.state = "joining";
  if (urlToken !== null) {
    api.useToken(urlToken); // a share link's watch token
    page.credential = "watch_token";
  }
  say("Joining as a viewer…");
  render();
  try {
    const { body: session } = await api.getSession(id);
    onSession(session);
    follow(id);
  } catch (error) {
    page.state = "idle";
    say(`Cannot watch session ${id}: ${error.message}`, true);
    render();
  }
}

// Leaving the page ends its session at once (instead of holding a slot until the reconnect grace runs out); a viewer
// leaving ends nothing.
window.addEventListener("pagehide", () => {
  if (page.role === "controller" && page.sessionId !== null && !TERMINAL.has(page.state)) {
    api.endOnUnload(page.sessionId);
  }
});
$("create-form").addEventListener("submit", start);
$("stop").addEventListener("click", stop);
$("reset").addEventListener("click", resetPose);
$("pause").addEventListener("click", togglePause);
$("prompt-form").addEventListener("submit", sendPrompt);
$("stage").addEventListener("click", () => $("stage").focus());
controls.attach(window);
countFrames();
render();
loadConfig().then(() => {
  if (watchId) watchSession(watchId);
});
