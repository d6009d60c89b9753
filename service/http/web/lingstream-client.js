// @lingstream/client for the served page, generated from web/packages/client/src by `npm run build:page` in web/
// (tests/unit/web/test_packages.py checks it equals a fresh build): do not edit.

// packages/client/src/errors.ts
var LingstreamError = class extends Error {
  name = "LingstreamError";
};
var ApiError = class extends LingstreamError {
  name = "ApiError";
  status;
  code;
  /** The `Retry-After` header (seconds) of a 429 or 503, else null. */
  retryAfter;
  constructor(status, code, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
};

// packages/client/src/api.ts
function tokenEndpoint(url, fetchImpl) {
  return async () => {
    const doFetch = fetchImpl ?? ((input, init) => fetch(input, init));
    const response = await doFetch(url, {
      method: "POST",
      credentials: "include",
      headers: { Accept: "application/json" }
    });
    const data = await readJson(response);
    if (!response.ok || data === null || typeof data.token !== "string") {
      throw new ApiError(response.status, "token_endpoint_failed", `the token endpoint answered ${response.status}`);
    }
    return data.token;
  };
}
async function readJson(response) {
  try {
    return await response.json();
  } catch {
    return null;
  }
}
function refusal(response, data) {
  const error = data?.error ?? {};
  return new ApiError(
    response.status,
    error.code || `http_${response.status}`,
    error.message || response.statusText || `HTTP ${response.status}`,
    response.headers.get("Retry-After")
  );
}
function query(params) {
  const given = Object.entries(params).filter(([, value]) => value !== null && value !== void 0);
  if (given.length === 0) return "";
  return `?${new URLSearchParams(given.map(([name, value]) => [name, String(value)])).toString()}`;
}
function sinceParam(since) {
  if (since === void 0) return void 0;
  return since instanceof Date ? since.toISOString() : String(since);
}
var path = (id) => `/v1/sessions/${encodeURIComponent(id)}`;
var Api = class {
  baseUrl;
  key;
  /** A client, session or watch token; wins over the key. */
  token;
  doFetch;
  constructor(options = {}) {
    this.baseUrl = (options.baseUrl ?? "").replace(/\/+$/, "");
    this.key = options.apiKey ?? "";
    this.token = options.token ?? null;
    this.doFetch = options.fetch ?? ((input, init) => fetch(input, init));
  }
  /** The credential every request carries: the token if any, else the API key. */
  get credential() {
    return this.token || this.key;
  }
  useToken(token) {
    this.token = token || null;
  }
  url(path2) {
    return /^[a-z]+:\/\//i.test(path2) ? path2 : `${this.baseUrl}${path2}`;
  }
  headers(json, key = this.credential) {
    const headers = {};
    if (json) headers["Content-Type"] = "application/json";
    if (key) headers.Authorization = `Bearer ${key}`;
    return headers;
  }
  /** `key`: the bearer credential (the current one unless given: a viewer's offer carries its viewer credential). */
  async request(method, path2, body, key = this.credential) {
    const response = await this.doFetch(this.url(path2), {
      method,
      headers: this.headers(body !== void 0, key),
      body: body === void 0 ? void 0 : JSON.stringify(body)
    });
    const data = await readJson(response);
    if (!response.ok) throw refusal(response, data);
    return { status: response.status, body: data };
  }
  createSession(body) {
    return this.request("POST", "/v1/sessions", body);
  }
  getSession(id) {
    return this.request("GET", `/v1/sessions/${encodeURIComponent(id)}`);
  }
  deleteSession(id, mode = "drain") {
    return this.request("DELETE", `/v1/sessions/${encodeURIComponent(id)}?mode=${mode}`);
  }
  pauseSession(id) {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/pause`);
  }
  resumeSession(id) {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/resume`);
  }
  /** `GET /v1/sessions`: this credential's live and remembered sessions, oldest first. */
  listSessions() {
    return this.request("GET", "/v1/sessions");
  }
  /**
   * `GET /v1/recordings`: one page of this key's recordings started at `since` or later (default: every one kept),
   * oldest first; pass the page's `next_cursor` as `cursor` for the next (null on the last page).
   */
  listRecordings(options = {}) {
    const params = { since: sinceParam(options.since), cursor: options.cursor, limit: options.limit };
    return this.request("GET", `/v1/recordings${query(params)}`);
  }
  /** Every recording `listRecordings` pages through, one page (`limit` each) per request. */
  async *recordings(options = {}) {
    let cursor = null;
    do {
      const page = (await this.listRecordings({ ...options, cursor })).body;
      yield* page.recordings;
      cursor = page.next_cursor;
    } while (cursor);
  }
  /**
   * `GET /v1/sessions/{id}/recording`: the ended session's MP4 as the fetch `Response` (its body not yet read:
   * `.blob()` in a page, `.arrayBuffer()`, or `.body`, a stream, to write a file in Node). A recording in an object
   * store answers a redirect to a presigned URL, which fetch follows (a cross-origin redirect drops our
   * Authorization header, as it should). 409 `recording_not_ready` while it is still being finished: retry.
   */
  recording(id) {
    return this.download(`${path(id)}/recording`);
  }
  /** `GET /v1/sessions/{id}/recording/controls`: the recording's control trace (JSON Lines), as `recording` does. */
  recordingControls(id) {
    return this.download(`${path(id)}/recording/controls`);
  }
  /** A GET whose answer is a file: the `Response` when it is one, else the refusal as an `ApiError`. */
  async download(target) {
    const response = await this.doFetch(this.url(target), { method: "GET", headers: this.headers(false) });
    if (!response.ok) throw refusal(response, await readJson(response));
    return response;
  }
  /**
   * `GET /v1/usage`: this key's usage since `since` (counted from the start of its hour; default: the 35 days kept)
   * and its quota.
   */
  usage(since) {
    return this.request("GET", `/v1/usage${query({ since: sinceParam(since) })}`);
  }
  /**
   * `POST /v1/client_tokens`, with the API key whatever token this `Api` holds: for an app's backend (Node) that
   * mints short-lived client tokens for its browsers (docs/integrate.md); a browser never holds the key. 404
   * `tokens_not_configured` without LINGSTREAM_TOKEN_SECRET.
   */
  createClientToken(body = {}) {
    return this.request("POST", "/v1/client_tokens", body, this.key);
  }
  /** `DELETE /v1/sessions/{id}/viewers/{share_id}`: the share link's watch token is refused from now on. */
  revokeShare(id, shareId) {
    return this.request("DELETE", `${path(id)}/viewers/${encodeURIComponent(shareId)}`);
  }
  /** Best effort while a page is being closed: `keepalive` lets the request outlive the page. */
  endOnUnload(id) {
    this.doFetch(this.url(`/v1/sessions/${encodeURIComponent(id)}?mode=cancel`), {
      method: "DELETE",
      headers: this.headers(false),
      keepalive: true
    }).catch(() => {
    });
  }
  /**
   * Join details of one more viewer (a place among the session's MAX_VIEWERS): LiveKit, a watch-only token for a new
   * identity; embedded, a viewer credential and the watch URL.
   */
  createViewer(id) {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/viewers`);
  }
  /** A share link: a watch URL whose watch-only token admits one viewer per use (within MAX_VIEWERS). */
  share(id) {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/viewers`, { share: true });
  }
  /** An SDP offer; a viewer's goes with its viewer credential instead of the current one. */
  offer(url, sdp, viewerToken = null) {
    return this.request("POST", url, { sdp, type: "offer" }, viewerToken === null ? this.credential : viewerToken);
  }
  /** Yields every session snapshot of the event stream until it ends (after the terminal one) or `signal` aborts. */
  async *events(id, signal) {
    const response = await this.doFetch(this.url(`/v1/sessions/${encodeURIComponent(id)}/events`), {
      headers: this.headers(false),
      signal
    });
    if (!response.ok) throw refusal(response, await readJson(response));
    if (response.body === null) {
      throw new ApiError(response.status, `http_${response.status}`, "the event stream has no body");
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new EventStreamParser();
    try {
      for (; ; ) {
        const { value, done } = await reader.read();
        if (done) return;
        for (const event of parser.push(value)) {
          if (event.event === "session" && event.data) yield JSON.parse(event.data);
        }
      }
    } finally {
      reader.cancel().catch(() => {
      });
    }
  }
};
var EventStreamParser = class {
  buffer = "";
  push(text) {
    this.buffer += text.replace(/\r\n/g, "\n");
    const events = [];
    let cut;
    while ((cut = this.buffer.indexOf("\n\n")) >= 0) {
      const block = this.buffer.slice(0, cut);
      this.buffer = this.buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trimStart();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      events.push({ event, data: data.join("\n") });
    }
    return events;
  }
};

// packages/client/src/clock.ts
var systemClock = {
  now: () => performance.now(),
  wall: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (handle) => clearTimeout(handle),
  setInterval: (fn, ms) => setInterval(fn, ms),
  clearInterval: (handle) => clearInterval(handle)
};

// packages/client/src/controls.ts
var RESEND_MS = 250;
var REMEMBERED_SEQS = 256;
var CONTROL_KEYS = ["w", "a", "s", "d", "i", "j", "k", "l"];
var KEY_MAP = {
  w: "w",
  a: "a",
  s: "s",
  d: "d",
  i: "i",
  j: "j",
  k: "k",
  l: "l",
  ArrowUp: "w",
  ArrowDown: "s",
  ArrowLeft: "j",
  ArrowRight: "l"
};
var Controls = class {
  constructor(send, onChange = () => {
  }, clock = systemClock) {
    this.send = send;
    this.onChange = onChange;
    this.clock = clock;
    this.seq = clock.wall();
  }
  send;
  onChange;
  clock;
  held = /* @__PURE__ */ new Set();
  /** Sequence numbers belong to the session; the wall clock starts above anything an earlier page load sent. */
  seq;
  lastSent = null;
  active = false;
  sentAt = /* @__PURE__ */ new Map();
  timer = null;
  /** Press `key` (a control key or a keyboard name for one); false when it means nothing or the controls are off. */
  hold(key) {
    return this.change(key, true);
  }
  release(key) {
    return this.change(key, false);
  }
  change(name, down) {
    const key = KEY_MAP[name] ?? null;
    if (!this.active || key === null) return false;
    if (down === this.held.has(key)) return true;
    if (down) this.held.add(key);
    else this.held.delete(key);
    this.snapshot();
    return true;
  }
  releaseAll() {
    if (this.held.size === 0) return;
    this.held.clear();
    if (this.active) this.snapshot();
  }
  /** Send the held keys now (also when a connection opens: the service then knows the current state). */
  snapshot() {
    const seq = ++this.seq;
    const message = { v: 1, type: "control_state", seq, keys: [...this.held].sort() };
    if (this.send(message, false)) {
      this.sentAt.set(seq, this.clock.now());
      if (this.sentAt.size > REMEMBERED_SEQS) this.sentAt.delete(this.sentAt.keys().next().value);
      this.lastSent = message;
    }
    if (this.held.size > 0 && this.timer === null) {
      this.timer = this.clock.setInterval(() => this.snapshot(), RESEND_MS);
    } else if (this.held.size === 0 && this.timer !== null) {
      this.clock.clearInterval(this.timer);
      this.timer = null;
    }
    this.onChange();
  }
  /** When (the clock's `now()`) `seq` was sent from here, or null if it was not (or is forgotten). */
  sentTime(seq) {
    return this.sentAt.get(seq) ?? null;
  }
  /** Milliseconds since `seq` was sent from here, or null. */
  since(seq) {
    const sent = this.sentAt.get(seq);
    return sent === void 0 ? null : this.clock.now() - sent;
  }
  start() {
    this.active = true;
  }
  stop() {
    this.active = false;
    this.held.clear();
    if (this.timer !== null) this.clock.clearInterval(this.timer);
    this.timer = null;
  }
};

// packages/client/src/types.ts
var TERMINAL_STATES = /* @__PURE__ */ new Set(["closed", "expired", "failed", "cancelled"]);
var STREAMING_STATES = /* @__PURE__ */ new Set(["running", "paused", "recovering", "draining"]);

// packages/client/src/rejoin.ts
var REJOIN_BUDGET_MS = 6e4;
var REJOIN_BACKOFF_MS = [0, 500, 1e3, 2e3, 3e3];
var OPEN_TIMEOUT_MS = 1e4;
var FINAL_REFUSALS = /* @__PURE__ */ new Set([401, 403, 404]);
var Rejoin = class {
  /** A link that has never connected starts in an outage at `now`: its first connection takes the same path. */
  constructor(now, budgetMs = REJOIN_BUDGET_MS, backoffMs = REJOIN_BACKOFF_MS) {
    this.budgetMs = budgetMs;
    this.backoffMs = backoffMs;
    this.since = now;
  }
  budgetMs;
  backoffMs;
  phase = "probing";
  /** Outages so far, and tries in the current one (probes). */
  outages = 0;
  tries = 0;
  since;
  /** How long the current outage has lasted (0 when connected). */
  outageMs(now) {
    return this.phase === "connected" || this.phase === "ended" ? 0 : now - this.since;
  }
  /** The first connection: offer at once (the session streams: that is why it is joined). */
  start() {
    this.phase = "offering";
    return { action: "offer", openWithinMs: OPEN_TIMEOUT_MS };
  }
  /** The control path opened: the outage (if any) is over. */
  opened() {
    if (this.phase === "ended") return;
    this.phase = "connected";
    this.tries = 0;
  }
  /**
   * The peer connection failed, its data channel closed, or an offer did not open in time. From CONNECTED this
   * starts an outage (probe at once); while OFFERING it is one more failed try (probe after the backoff); while
   * PROBING nothing changes (a probe is already due).
   */
  lost(now) {
    if (this.phase === "ended" || this.phase === "probing") return { action: "none" };
    if (this.phase === "connected") {
      this.outages += 1;
      this.since = now;
    }
    return this.probeLater(now);
  }
  /** The service's answer to a probe or an offer. */
  answered(now, answer) {
    if (this.phase === "ended" || this.phase === "connected") return { action: "none" };
    if (answer.kind === "session") {
      if (TERMINAL_STATES.has(answer.status)) {
        this.phase = "ended";
        return { action: "over" };
      }
      if (answer.status === "queued") return this.probeLater(now);
      this.phase = "offering";
      return { action: "offer", openWithinMs: OPEN_TIMEOUT_MS };
    }
    if (answer.kind === "refused" && FINAL_REFUSALS.has(answer.status)) {
      this.phase = "ended";
      return { action: "give_up", code: answer.code, message: answer.message };
    }
    return this.probeLater(now);
  }
  /** The caller lets go (the session ends or closes): nothing more is asked. */
  end() {
    this.phase = "ended";
  }
  probeLater(now) {
    const left = this.since + this.budgetMs - now;
    if (left <= 0) {
      this.phase = "ended";
      return {
        action: "give_up",
        code: "connection_lost",
        message: `not reconnected within ${Math.round(this.budgetMs / 1e3)} s`
      };
    }
    const wait = this.backoffMs[Math.min(this.tries, this.backoffMs.length - 1)] ?? 0;
    this.tries += 1;
    this.phase = "probing";
    return { action: "probe", afterMs: Math.min(wait, left) };
  }
};

// packages/client/src/embedded.ts
var GATHER_TIMEOUT_MS = 3e3;
var DISCONNECTED_GRACE_MS = 2e3;
function answerOf(error) {
  if (error instanceof ApiError) {
    return { kind: "refused", status: error.status, code: error.code, message: error.message };
  }
  return { kind: "unreachable", message: error instanceof Error ? error.message : String(error) };
}
function gathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, GATHER_TIMEOUT_MS);
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}
var EmbeddedLink = class {
  constructor(api, details, handlers, options) {
    this.api = api;
    this.details = details;
    this.handlers = handlers;
    this.clock = options.clock ?? systemClock;
    this.sessionId = options.sessionId;
    this.refresh = options.refresh ?? null;
    this.rejoin = new Rejoin(this.clock.now(), options.rejoinBudgetMs);
  }
  api;
  details;
  handlers;
  kind = "embedded";
  pc = null;
  generation = 0;
  rejoin;
  channel = null;
  closed = false;
  /** The one pending step: a probe, an offer's open deadline, or the disconnected grace. */
  timer = null;
  clock;
  sessionId;
  refresh;
  /** The newest snapshot a probe read, handed to the session when the link opens again. */
  probed = null;
  /** The first connection; later ones follow from `Rejoin`'s steps. */
  async connect() {
    await this.step(this.rejoin.start());
  }
  async step(step) {
    if (this.closed) return;
    this.clearTimer();
    switch (step.action) {
      case "probe":
        this.timer = this.clock.setTimeout(() => {
          this.timer = null;
          void this.probe();
        }, step.afterMs);
        return;
      case "offer":
        await this.offer(step.openWithinMs);
        return;
      case "over":
        if (this.probed !== null) this.handlers.onSnapshot?.(this.probed);
        return;
      case "give_up":
        this.handlers.onFatal(new Error(step.message), step.code);
        return;
      case "none":
        return;
    }
  }
  clearTimer() {
    if (this.timer !== null) this.clock.clearTimeout(this.timer);
    this.timer = null;
  }
  // The peer connection or its channel died (or did not open in time): an outage starts, or goes on.
  lost(why) {
    if (this.closed) return;
    const starts = this.rejoin.phase === "connected";
    const step = this.rejoin.lost(this.clock.now());
    if (starts && step.action !== "none") this.handlers.onLost?.(why);
    void this.step(step);
  }
  // Ask the service whether the session is still on.
  async probe() {
    let answer;
    try {
      const { body } = await this.api.getSession(this.sessionId);
      this.probed = body;
      answer = { kind: "session", status: body.status, reason: body.reason ?? null };
    } catch (error) {
      answer = answerOf(error);
    }
    if (this.closed) return;
    this.handlers.onState(
      answer.kind === "session" ? `reconnecting: the session is ${answer.status}` : `reconnecting: ${answer.kind === "refused" ? `${answer.status} ${answer.code}` : answer.message}`
    );
    await this.step(this.rejoin.answered(this.clock.now(), answer));
  }
  /** Offer a new peer connection (the first one, or a rebind replacing the current one). */
  async offer(openWithinMs) {
    if (this.closed) return;
    const generation = ++this.generation;
    if (this.pc) this.pc.close();
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    const current = () => this.pc === pc && !this.closed;
    pc.addTransceiver("video", { direction: "recvonly" });
    const channel = pc.createDataChannel(this.details.data_channel || "control");
    this.channel = channel;
    channel.onopen = () => {
      if (!current()) return;
      this.clearTimer();
      const wasOut = this.rejoin.outages > 0;
      this.rejoin.opened();
      if (wasOut && this.probed !== null) this.handlers.onSnapshot?.(this.probed);
      this.handlers.onOpen();
    };
    channel.onclose = () => {
      if (current()) this.lost(`the control channel closed (peer connection ${generation})`);
    };
    channel.onmessage = (event) => {
      if (!current()) return;
      let message;
      try {
        message = JSON.parse(String(event.data));
      } catch (error) {
        console.warn("lingstream: unreadable status message", error);
        return;
      }
      this.handlers.onStatus(message);
    };
    pc.ontrack = (event) => {
      if (current()) this.handlers.onStream(event.streams[0] || new MediaStream([event.track]), event.receiver);
    };
    pc.onconnectionstatechange = () => {
      if (!current()) return;
      const state = pc.connectionState;
      this.handlers.onState(`${state} (peer connection ${generation})`);
      if (state === "connected" && this.rejoin.phase === "connected") {
        this.clearTimer();
      } else if (state === "failed") {
        this.lost(`the peer connection failed (${generation})`);
      } else if (state === "disconnected" && this.rejoin.phase === "connected" && this.timer === null) {
        this.timer = this.clock.setTimeout(() => {
          this.timer = null;
          if (current() && pc.connectionState !== "connected") this.lost(`the peer connection stayed disconnected`);
        }, DISCONNECTED_GRACE_MS);
      }
    };
    this.timer = this.clock.setTimeout(() => {
      this.timer = null;
      if (current() && this.rejoin.phase === "offering") this.lost(`peer connection ${generation} did not open`);
    }, openWithinMs);
    try {
      await pc.setLocalDescription(await pc.createOffer());
      await gathered(pc);
      if (!current() || pc.localDescription === null) return;
      const token = "viewer_token" in this.details ? this.details.viewer_token : null;
      const { body } = await this.api.offer(this.details.offer_url, pc.localDescription.sdp, token);
      if (!current()) return;
      await pc.setRemoteDescription(body);
    } catch (error) {
      if (!current()) return;
      if (error instanceof ApiError && error.status === 401 && this.refresh !== null) {
        try {
          const fresh = await this.refresh();
          if (fresh.kind === "embedded") this.details = fresh;
          this.handlers.onState("offer refused (401): the viewer's credential was renewed");
          await this.step(this.rejoin.answered(this.clock.now(), { kind: "unreachable", message: "renewed" }));
          return;
        } catch (refreshError) {
          this.rejoin.end();
          this.handlers.onFatal(refreshError);
          return;
        }
      }
      const answer = answerOf(error);
      this.handlers.onState(
        answer.kind === "refused" ? `offer refused: ${answer.status} ${answer.code}` : `offer failed: ${answer.message}`
      );
      await this.step(this.rejoin.answered(this.clock.now(), answer));
    }
  }
  send(message) {
    if (this.channel === null || this.channel.readyState !== "open") return false;
    this.channel.send(JSON.stringify(message));
    return true;
  }
  close() {
    this.closed = true;
    this.rejoin.end();
    this.clearTimer();
    if (this.pc) this.pc.close();
    this.channel = null;
    return Promise.resolve();
  }
};

// packages/client/src/emitter.ts
var Emitter = class {
  constructor(logger) {
    this.logger = logger;
  }
  logger;
  listeners = /* @__PURE__ */ new Map();
  logged = /* @__PURE__ */ new WeakSet();
  /** Exceptions thrown by listeners (each was caught). */
  listenerErrors = 0;
  /** Calls `listener` on each `name` event; returns a function that removes it. */
  on(name, listener) {
    let set = this.listeners.get(name);
    if (set === void 0) {
      set = /* @__PURE__ */ new Set();
      this.listeners.set(name, set);
    }
    set.add(listener);
    return () => this.off(name, listener);
  }
  off(name, listener) {
    this.listeners.get(name)?.delete(listener);
  }
  emit(name, payload) {
    const set = this.listeners.get(name);
    if (set === void 0) return;
    for (const listener of [...set]) {
      try {
        listener(payload);
      } catch (error) {
        this.listenerErrors += 1;
        if (!this.logged.has(listener)) {
          this.logged.add(listener);
          this.logger.error(`lingstream: a '${String(name)}' listener threw (logged once; the session goes on)`, error);
        }
      }
    }
  }
  clear() {
    this.listeners.clear();
  }
};

// packages/client/src/figures.ts
var REPEAT_TICKS = 90;
var GRID_SLACK = 2;
var SAMPLES = 20;
var PENDING = 16;
function median(values) {
  if (values.length === 0) return null;
  const sorted = values.slice().sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? null;
}
var Figures = class {
  frames = 0;
  framesThisConnection = 0;
  fps = 0;
  latencyMs = null;
  latenciesMs = [];
  photonMs = null;
  photonsMs = [];
  framesById = 0;
  repeatsById = 0;
  /** The session's frame rate (from its snapshot): the spacing of the grid generated frames sit on. */
  videoFps = null;
  frameTimes = [];
  generation = null;
  origin = null;
  pending = [];
  reference = null;
  learnt = null;
  newestId = null;
  pendingById = [];
  /**
   * A chunk status arrived. `sentTime`: when its `applied_seq` was sent from here (null: not by us, or forgotten);
   * `now`: the clock's time now.
   */
  chunk(message, previous, sentTime, now) {
    if (typeof message.first_frame_pts === "number") {
      if (this.reference === null) this.pending.push({ pts: message.first_frame_pts, sent: null });
      this.reference = message.first_frame_pts;
    }
    if (previous !== null && previous.applied_seq === message.applied_seq) return;
    if (sentTime === null) return;
    if (typeof message.first_frame_pts === "number") {
      this.pending.push({ pts: message.first_frame_pts, sent: sentTime });
      if (this.pending.length > PENDING) this.pending.shift();
    }
    if (typeof message.first_frame_id === "number") {
      this.pendingById.push({ id: message.first_frame_id, sent: sentTime });
      if (this.pendingById.length > PENDING) this.pendingById.shift();
    }
    this.latencyMs = now - sentTime;
    push(this.latenciesMs, this.latencyMs);
  }
  /** A new video stream (a new connection): counted from zero for this connection. */
  newConnection() {
    this.framesThisConnection = 0;
  }
  /**
   * A frame was presented at `now`. `embedded`: whether its RTP timestamps are the service's (the embedded
   * transport); `generation`: the peer connection it came on; `frameId`: its frame id where the transport carries one.
   */
  presented(now, meta, options) {
    if (options.frameId !== null) {
      this.presentedById(now, options.frameId);
      return;
    }
    if (options.generation !== this.generation) {
      this.generation = options.generation;
      this.origin = null;
      this.reference = null;
      this.learnt = null;
    }
    this.checkOrigin(meta, options.embedded);
    if (!this.isRepeat(meta, options.embedded)) {
      this.shown(now, 1);
      this.matchPts(now, meta);
    }
  }
  /** `count` frames shown at `now` (where frames cannot be told apart: the playback quality counters). */
  shown(now, count) {
    this.frames += count;
    this.framesThisConnection += count;
    for (let i = 0; i < count; i++) this.frameTimes.push(now);
    this.tick(now);
  }
  /** Forget frames older than a second (call it now and then: the fps figure falls when frames stop). */
  tick(now) {
    while (this.frameTimes.length && this.frameTimes[0] < now - 1e3) this.frameTimes.shift();
    this.fps = this.frameTimes.length;
  }
  stats() {
    return {
      frames: this.frames,
      framesThisConnection: this.framesThisConnection,
      fps: this.fps,
      latencyMs: this.latencyMs,
      latencyMedianMs: median(this.latenciesMs),
      photonMs: this.photonMs,
      photonMedianMs: median(this.photonsMs),
      framesById: this.framesById,
      repeatsById: this.repeatsById
    };
  }
  presentedById(now, id) {
    if (this.newestId !== null && id <= this.newestId) {
      this.repeatsById += 1;
      return;
    }
    this.newestId = id;
    this.framesById += 1;
    this.shown(now, 1);
    while (this.pendingById.length && id >= this.pendingById[0].id) {
      const next = this.pendingById.shift();
      this.photon(now - next.sent);
    }
  }
  photon(ms) {
    this.photonMs = ms;
    push(this.photonsMs, ms);
  }
  /** How many ticks a frame lies off the grid of generated frames (signed, within half a frame), or null. */
  gridPhase(meta, embedded) {
    if (!embedded) return null;
    if (!meta || typeof meta.rtpTimestamp !== "number" || this.origin === null || this.reference === null) return null;
    if (this.videoFps === null || !(this.videoFps > 0)) return null;
    const ticks = 9e4 / this.videoFps;
    const delta = meta.rtpTimestamp - (this.origin + this.reference >>> 0) | 0;
    return delta - Math.round(Math.round(delta / ticks) * ticks);
  }
  isRepeat(meta, embedded) {
    const phase = this.gridPhase(meta, embedded);
    return phase !== null && Math.abs(phase) > GRID_SLACK;
  }
  // Checks the learnt offset against a frame: a frame REPEAT_TICKS before the grid proves that it was learnt from a
  // repeat, and it is learnt again from this frame; a repeat where repeats lie proves it right.
  checkOrigin(meta, embedded) {
    const learnt = this.learnt;
    const phase = this.gridPhase(meta, embedded);
    if (learnt === null || phase === null || !meta || typeof meta.rtpTimestamp !== "number") return;
    if (Math.abs(phase - REPEAT_TICKS) <= GRID_SLACK) {
      this.learnt = null;
    } else if (Math.abs(phase + REPEAT_TICKS) <= GRID_SLACK) {
      this.learnt = null;
      this.origin = meta.rtpTimestamp - learnt.pts >>> 0;
      this.frames -= learnt.frames;
      this.framesThisConnection = Math.max(0, this.framesThisConnection - learnt.frames);
      this.frameTimes.splice(Math.max(0, this.frameTimes.length - learnt.frames));
      this.photonsMs.splice(Math.max(0, this.photonsMs.length - learnt.samples));
      this.photonMs = this.photonsMs.length ? this.photonsMs[this.photonsMs.length - 1] : null;
      this.pending.unshift(...learnt.consumed);
    }
  }
  matchPts(now, meta) {
    if (!meta || typeof meta.rtpTimestamp !== "number") return;
    const rtp = meta.rtpTimestamp;
    if (this.learnt !== null) this.learnt.frames += 1;
    while (this.pending.length) {
      const next = this.pending[0];
      if (this.origin === null) {
        this.origin = rtp - next.pts >>> 0;
        this.learnt = { pts: next.pts, frames: 1, samples: 0, consumed: [] };
      }
      const ahead = rtp - (this.origin + next.pts >>> 0) | 0;
      if (ahead < 0) break;
      this.pending.shift();
      if (this.learnt !== null && this.learnt.consumed.length < PENDING) this.learnt.consumed.push(next);
      if (next.sent === null) continue;
      this.photon(now - next.sent);
      if (this.learnt !== null) this.learnt.samples += 1;
    }
  }
};
function push(values, value) {
  values.push(value);
  if (values.length > SAMPLES) values.shift();
}

// packages/client/src/input.ts
function isEditable(target) {
  if (typeof HTMLElement === "undefined" || !(target instanceof HTMLElement)) return false;
  return target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement || target instanceof HTMLSelectElement || target.isContentEditable;
}
function keyboardController(controls, target = window) {
  const onKey = (event, down2) => {
    const key = event;
    if (!controls.active || isEditable(key.target)) return;
    if (key.ctrlKey || key.metaKey || key.altKey) return;
    const name = key.key.length === 1 ? key.key.toLowerCase() : key.key;
    if (down2 ? controls.hold(name) : controls.release(name)) key.preventDefault();
  };
  const down = (event) => onKey(event, true);
  const up = (event) => onKey(event, false);
  const blur = () => controls.releaseAll();
  target.addEventListener("keydown", down);
  target.addEventListener("keyup", up);
  window.addEventListener("blur", blur);
  return {
    detach() {
      target.removeEventListener("keydown", down);
      target.removeEventListener("keyup", up);
      window.removeEventListener("blur", blur);
      controls.releaseAll();
    }
  };
}
var STICK = 0.5;
var POLL_MS = 50;
function gamepadKeys(pad) {
  const keys = /* @__PURE__ */ new Set();
  const axis = (index) => pad.axes[index] ?? 0;
  const button = (index) => Boolean(pad.buttons[index]?.pressed);
  if (axis(1) < -STICK || button(12)) keys.add("w");
  if (axis(1) > STICK || button(13)) keys.add("s");
  if (axis(0) < -STICK || button(14)) keys.add("a");
  if (axis(0) > STICK || button(15)) keys.add("d");
  if (axis(2) < -STICK) keys.add("j");
  if (axis(2) > STICK) keys.add("l");
  if (axis(3) < -STICK) keys.add("i");
  if (axis(3) > STICK) keys.add("k");
  return keys;
}
function gamepadController(controls, pads = () => navigator.getGamepads()) {
  let held = /* @__PURE__ */ new Set();
  const poll = () => {
    const pad = pads().find((candidate) => candidate !== null && candidate.connected) ?? null;
    const now = pad === null ? /* @__PURE__ */ new Set() : gamepadKeys(pad);
    for (const key of held) if (!now.has(key)) controls.release(key);
    for (const key of now) if (!held.has(key)) controls.hold(key);
    held = now;
  };
  const timer = setInterval(poll, POLL_MS);
  return {
    detach() {
      clearInterval(timer);
      for (const key of held) controls.release(key);
      held = /* @__PURE__ */ new Set();
    }
  };
}

// packages/client/src/livekit.ts
var OVER = /* @__PURE__ */ new Set([1, 2, 4, 5, 10]);
var REJOIN_MS = [500, 1e3, 2e3, 4e3];
var PACKET_INSTEAD = /* @__PURE__ */ new Set([1400, 1403, 1501]);
function ensureRandomUuid() {
  const crypto = globalThis.crypto;
  if (!crypto || typeof crypto.randomUUID === "function") return;
  crypto.randomUUID = () => {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    bytes[6] = bytes[6] & 15 | 64;
    bytes[8] = bytes[8] & 63 | 128;
    const hex = Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  };
}
var LiveKitLink = class {
  constructor(load, details, refresh, handlers, makeWorker = null) {
    this.load = load;
    this.details = details;
    this.refresh = refresh;
    this.handlers = handlers;
    this.makeWorker = makeWorker;
    ensureRandomUuid();
  }
  load;
  details;
  refresh;
  handlers;
  makeWorker;
  kind = "livekit";
  generation = 0;
  room = null;
  /** The service participant's attributes, as last read. */
  attributes = {};
  track = null;
  worker = null;
  closed = false;
  rejoins = 0;
  encoder = new TextEncoder();
  decoder = new TextDecoder();
  get pc() {
    return null;
  }
  async connect() {
    const lk = await this.load();
    const details = this.details;
    const worker = this.frameMetadataWorker();
    const options = { adaptiveStream: false, dynacast: false };
    if (worker !== null) options.frameMetadata = { worker };
    const room = new lk.Room(options);
    const current = () => this.room === room && !this.closed;
    room.on(lk.RoomEvent.TrackSubscribed, (track, _publication, participant) => {
      if (current() && track.kind === lk.Track.Kind.Video && participant.identity === details.service_identity) {
        this.track = track;
        this.handlers.onStream(new MediaStream([track.mediaStreamTrack]), track.receiver ?? null);
      }
    });
    room.on(lk.RoomEvent.DataReceived, (payload, participant, _kind, topic) => {
      if (!current() || topic !== details.status_topic) return;
      if (participant && participant.identity !== details.service_identity) return;
      let message;
      try {
        message = JSON.parse(this.decoder.decode(payload));
      } catch (error) {
        console.warn("lingstream: unreadable status message", error);
        return;
      }
      this.handlers.onStatus(message);
    });
    room.on(lk.RoomEvent.ParticipantAttributesChanged, (changed, participant) => {
      if (current() && participant.identity === details.service_identity && "lingstream.state" in changed) {
        this.stateFromAttributes(participant.attributes);
      }
    });
    room.on(lk.RoomEvent.ConnectionStateChanged, (state) => {
      if (current()) this.handlers.onState(`LiveKit ${state}`);
    });
    room.on(lk.RoomEvent.Disconnected, (reason) => {
      if (!current()) return;
      if (reason !== void 0 && OVER.has(reason)) {
        this.handlers.onState(`LiveKit: left the room (reason ${reason})`);
        return;
      }
      this.rejoinLater();
    });
    this.room = room;
    if (details.token === null) {
      throw new Error("the join details carry no token: the caller tokens its controller (a room it owns)");
    }
    await room.connect(details.url, details.token, { autoSubscribe: true });
    if (!current()) {
      await room.disconnect();
      return;
    }
    this.rejoins = 0;
    this.handlers.onOpen();
    const service = room.remoteParticipants.get(details.service_identity);
    if (service) this.stateFromAttributes(service.attributes);
  }
  stateFromAttributes(attributes) {
    const state = attributes["lingstream.state"];
    this.attributes = { ...attributes };
    if (state) this.handlers.onStatus({ v: 1, type: "state", state, detail: null, from: "attributes" });
  }
  // One worker for every room of this link (a rejoin makes a new room); null where workers cannot be had.
  frameMetadataWorker() {
    if (this.worker !== null || this.makeWorker === null) return this.worker;
    try {
      this.worker = this.makeWorker();
    } catch (error) {
      console.warn("lingstream: no frame metadata worker; frames are matched by arrival", error);
    }
    return this.worker;
  }
  /** The service's frame id of the frame requestVideoFrameCallback presents (`meta`), or null. */
  frameId(meta) {
    const track = this.track;
    if (track === null || !meta || typeof meta.rtpTimestamp !== "number" || !track.lookupFrameMetadata) return null;
    const found = track.lookupFrameMetadata({ rtpTimestamp: meta.rtpTimestamp });
    return found && typeof found.frameId === "number" ? found.frameId : null;
  }
  rejoinLater() {
    const delay = REJOIN_MS[Math.min(this.rejoins++, REJOIN_MS.length - 1)];
    this.handlers.onState(`LiveKit: disconnected, joining again in ${delay} ms`);
    setTimeout(async () => {
      if (this.closed) return;
      try {
        const fresh = await this.refresh();
        if (fresh.kind === "livekit") this.details = fresh;
        await this.connect();
      } catch (error) {
        const status = error instanceof ApiError ? error.status : 0;
        if (status === 404 || status === 409) this.handlers.onFatal(error);
        else if (!this.closed) this.rejoinLater();
      }
    }, delay);
  }
  send(message, reliable) {
    const room = this.room;
    const topic = "control_topic" in this.details ? this.details.control_topic : void 0;
    if (room === null || room.state !== "connected") return false;
    const payload = this.encoder.encode(JSON.stringify(message));
    room.localParticipant.publishData(payload, { reliable, topic }).catch((error) => console.warn("lingstream: sending control failed", error));
    return true;
  }
  /**
   * A discrete command (pause, resume, reset_pose, stop, prompt) as the RPC method `lingstream.<type>` of the service
   * participant: resolves to the answer ({v, ok, state, applied}), or to null when it went as a packet instead;
   * rejects with livekit-client's RpcError (`code`, `message`, `data`: the stable code) when the session refuses it.
   */
  async command(message) {
    const room = this.room;
    if (room === null || room.state !== "connected") throw new Error("not connected to the room");
    try {
      const answer = await room.localParticipant.performRpc({
        destinationIdentity: this.details.service_identity,
        method: `lingstream.${message.type}`,
        payload: JSON.stringify(message)
      });
      return JSON.parse(answer);
    } catch (error) {
      const code = error.code;
      if (typeof code === "number" && PACKET_INSTEAD.has(code) && this.send(message, true)) return null;
      throw error;
    }
  }
  /** livekit-client's fault drill (Room.simulateScenario) on the current room; false when there is none. */
  async simulate(scenario) {
    if (this.room === null || this.room.state !== "connected") return false;
    await this.room.simulateScenario(scenario);
    return true;
  }
  async close() {
    this.closed = true;
    const left = this.room ? this.room.disconnect() : Promise.resolve();
    if (this.worker !== null) this.worker.terminate();
    this.worker = null;
    await left;
  }
};

// packages/client/src/session.ts
var MAX_PROMPT_BYTES = 512;
var HISTORY = 64;
var DONE_WAIT_MS = 2e3;
var STATS_MS = 500;
var CLOSE_MS = 3e3;
var STOP_FALLBACK_MS = 2e3;
function utf8Bytes(text) {
  return new TextEncoder().encode(text).length;
}
var defaultLoader = () => import("livekit-client");
async function createSession(options) {
  const {
    baseUrl,
    apiKey,
    tokenProvider,
    livekitClient,
    frameMetadataWorker,
    jitterBufferTargetMs,
    rejoinBudgetMs,
    fetch: fetch2,
    clock,
    logger,
    ...body
  } = options;
  const api = new Api({ baseUrl, apiKey, fetch: fetch2 });
  let credential = apiKey ? "key" : "none";
  if (tokenProvider !== void 0) {
    api.useToken(await tokenProvider());
    credential = "client_token";
  }
  const { body: created } = await api.createSession(body);
  if (created.session_token) {
    api.useToken(created.session_token);
    credential = "session_token";
  }
  const session = new Session(api, "controller", credential, options);
  session.begin(created);
  return session;
}
async function watchSession(options) {
  const api = new Api({ baseUrl: options.baseUrl, apiKey: options.apiKey, token: options.token ?? null, fetch: options.fetch });
  const credential = options.token ? "watch_token" : options.apiKey ? "key" : "none";
  const { body } = await api.getSession(options.sessionId);
  const session = new Session(api, "viewer", credential, options);
  session.begin(body);
  return session;
}
var Session = class {
  api;
  role;
  credential;
  controls;
  figures = new Figures();
  /** The keys a controller holds: `keys.hold("w")`, `keys.release("w")` (keyboard names too: "ArrowLeft"). */
  keys;
  id = null;
  state = "creating";
  detail = null;
  queuePosition = null;
  transport = null;
  snapshot = null;
  lastChunk = null;
  chunks = [];
  errors = [];
  warnings = [];
  calls = [];
  lastPrompt = null;
  /** The `done` status's reason, once it came. */
  done = null;
  /** The session is over and this side let go of its link. */
  ended = false;
  connection = null;
  jitterBufferTarget = null;
  link = null;
  emitter;
  clock;
  logger;
  options;
  promptSeq;
  video = null;
  joinWanted = false;
  joining = false;
  follower = null;
  doneTimer = null;
  statsTimer = null;
  frameCallback = null;
  qualityTimer = null;
  closed = false;
  doneEmitted = false;
  inputs = [];
  constructor(api, role, credential, options = {}) {
    this.api = api;
    this.role = role;
    this.credential = credential;
    this.options = options;
    this.clock = options.clock ?? systemClock;
    this.logger = options.logger ?? console;
    this.emitter = new Emitter(this.logger);
    this.promptSeq = this.clock.wall();
    this.controls = new Controls(
      (message, reliable) => this.link !== null ? this.link.send(message, reliable) : false,
      () => this.changed(),
      this.clock
    );
    const controls = this.controls;
    this.keys = {
      hold: (key) => controls.hold(key),
      release: (key) => controls.release(key),
      releaseAll: () => controls.releaseAll(),
      get held() {
        return controls.held;
      }
    };
  }
  // -- listening --------------------------------------------------------------------------------------------------
  /** Calls `listener` on each `name` event (a listener that throws is logged once and the session goes on). */
  on(name, listener) {
    return this.emitter.on(name, listener);
  }
  off(name, listener) {
    this.emitter.off(name, listener);
  }
  /** Exceptions thrown by listeners (each caught; the first of each listener logged). */
  get listenerErrors() {
    return this.emitter.listenerErrors;
  }
  get stats() {
    return this.figures.stats();
  }
  get generation() {
    return this.link !== null ? this.link.generation : 0;
  }
  get terminal() {
    return TERMINAL_STATES.has(this.state);
  }
  emit(name, payload) {
    this.emitter.emit(name, payload);
    if (name !== "change") this.emitter.emit("change", void 0);
  }
  changed() {
    this.emitter.emit("change", void 0);
  }
  // -- the session resource ---------------------------------------------------------------------------------------
  /** Starts with the create's (or the first GET's) snapshot: follows the event stream until the session ends. */
  begin(snapshot) {
    this.onSnapshot(snapshot);
    void this.follow(snapshot.id);
    if (this.statsTimer === null) {
      this.statsTimer = this.clock.setInterval(() => {
        this.figures.tick(this.clock.now());
        this.emit("stats", this.figures.stats());
      }, STATS_MS);
    }
  }
  onSnapshot(snapshot) {
    if (this.id !== null && snapshot.id !== this.id) return;
    this.id = snapshot.id;
    this.snapshot = snapshot;
    const before = this.state;
    if (!(this.terminal && !TERMINAL_STATES.has(snapshot.status))) this.state = snapshot.status;
    const position = snapshot.queue_position ?? null;
    const queueChanged = position !== this.queuePosition;
    this.queuePosition = position;
    if (snapshot.video && typeof snapshot.video.fps === "number") this.figures.videoFps = snapshot.video.fps;
    this.emit("snapshot", snapshot);
    if (queueChanged) this.emit("queue", { position });
    if (this.state !== before) this.emit("state", { state: this.state, detail: snapshot.reason ?? null });
    if (STREAMING_STATES.has(snapshot.status) && this.link === null && !this.joining && this.joinWanted) {
      void this.connect(snapshot);
    }
    if (TERMINAL_STATES.has(snapshot.status)) this.finishWhenDone();
  }
  // Follow the event stream until the session ends (it is also the queued session's heartbeat).
  async follow(id) {
    const controller = new AbortController();
    this.follower = controller;
    let failures = 0;
    while (!controller.signal.aborted && this.id === id && !this.terminal && !this.closed) {
      try {
        for await (const snapshot of this.api.events(id, controller.signal)) {
          failures = 0;
          this.guard(() => this.onSnapshot(snapshot));
        }
      } catch (error) {
        if (controller.signal.aborted) return;
        if (error instanceof ApiError && error.status === 404) return;
        failures += 1;
      }
      await new Promise((resolve) => this.clock.setTimeout(resolve, Math.min(5e3, 500 * 2 ** failures)));
    }
  }
  // Our own handlers run inside the transports' callbacks: nothing of ours may throw into them.
  guard(fn) {
    try {
      fn();
    } catch (error) {
      this.logger.error("lingstream: internal error (the session goes on)", error);
    }
  }
  // -- joining ----------------------------------------------------------------------------------------------------
  /**
   * Join the session's video and control on its transport, now if it streams, else as soon as it does; the video
   * goes to `video` (muted autoplay). Resolves once the link is set up (or failed: an `error` event says why).
   */
  async join(video = null) {
    if (this.closed) return;
    if (video !== null && video !== this.video) {
      this.video = video;
      this.countFrames(video);
    }
    this.joinWanted = true;
    if (this.snapshot !== null && STREAMING_STATES.has(this.snapshot.status) && this.link === null && !this.joining) {
      await this.connect(this.snapshot);
    }
  }
  async freshDetails(id) {
    const { body } = await this.api.getSession(id);
    if (!STREAMING_STATES.has(body.status) || !body.transport && this.role !== "viewer") {
      throw new ApiError(409, "session_not_running", `the session is ${body.status}`);
    }
    if (this.role === "viewer") return (await this.api.createViewer(id)).body;
    return body.transport;
  }
  handlers() {
    return {
      onOpen: () => this.guard(() => {
        if (this.role === "controller") {
          this.controls.start();
          this.controls.snapshot();
        }
        this.emit("connection", { phase: "open", text: this.connection ?? "open" });
      }),
      onStatus: (message) => this.guard(() => this.onStatus(message)),
      onStream: (stream, receiver) => this.guard(() => {
        const target = this.options.jitterBufferTargetMs ?? null;
        const tunable = receiver !== null && "jitterBufferTarget" in receiver;
        if (target !== null && tunable) receiver.jitterBufferTarget = target;
        this.jitterBufferTarget = tunable ? receiver.jitterBufferTarget : null;
        this.figures.newConnection();
        if (this.video !== null) {
          this.video.srcObject = stream;
          this.video.play().catch(() => {
          });
        }
        this.emit("stream", stream);
      }),
      onState: (text) => this.guard(() => {
        this.connection = text;
        this.emit("connection", { phase: "state", text });
      }),
      onFatal: (error, code) => this.guard(() => {
        this.fail(code ?? "connection_lost", `the connection cannot be restored: ${error.message}`);
        this.finish();
      }),
      onLost: (why) => this.guard(() => {
        if (this.terminal) return;
        this.state = "recovering";
        this.detail = `reconnecting: ${why}`;
        this.emit("state", { state: this.state, detail: this.detail });
      }),
      onSnapshot: (snapshot) => this.guard(() => this.onSnapshot(snapshot))
    };
  }
  fail(code, message) {
    const status = { v: 1, type: "error", code, message };
    this.errors.push(status);
    this.emit("error", status);
  }
  async connect(snapshot) {
    this.joining = true;
    try {
      await this.connectNow(snapshot);
    } finally {
      this.joining = false;
    }
  }
  async connectNow(snapshot) {
    const id = snapshot.id;
    let details = snapshot.transport ?? null;
    let fetched = null;
    try {
      if (this.role === "viewer" && details === null && STREAMING_STATES.has(snapshot.status)) {
        details = fetched = await this.freshDetails(id);
      }
      this.transport = details !== null ? details.kind : null;
      if (details === null) {
        this.fail("no_transport", "this service has no transport configured: the session runs without video");
        return;
      }
      const refresh = () => this.freshDetails(id);
      let link;
      if (details.kind === "embedded") {
        const embedded = { sessionId: id, clock: this.clock, rejoinBudgetMs: this.options.rejoinBudgetMs };
        if (this.role === "viewer") {
          const own = fetched ?? await this.freshDetails(id);
          if (own.kind !== "embedded") throw new Error(`the viewer's details are for ${own.kind}`);
          link = new EmbeddedLink(this.api, own, this.handlers(), { ...embedded, refresh });
        } else {
          link = new EmbeddedLink(this.api, details, this.handlers(), embedded);
        }
      } else if (details.kind === "livekit") {
        const fresh = fetched ?? await this.freshDetails(id);
        if (fresh.kind !== "livekit") throw new Error(`the join details are for ${fresh.kind}`);
        link = new LiveKitLink(
          this.options.livekitClient ?? defaultLoader,
          fresh,
          refresh,
          this.handlers(),
          this.options.frameMetadataWorker ?? null
        );
      } else {
        this.fail("join_failed", `unknown transport ${details.kind}: cannot join`);
        return;
      }
      if (this.closed) return;
      this.link = link;
      this.emit("connection", { phase: "connecting", text: "connecting" });
      await link.connect();
    } catch (error) {
      this.fail("join_failed", `could not join: ${error.message}`);
    }
    this.changed();
  }
  // -- status messages from the service ---------------------------------------------------------------------------
  onStatus(message) {
    switch (message.type) {
      case "state":
        if (!this.terminal) {
          const before = this.state;
          this.state = message.state;
          this.detail = message.detail ?? null;
          if (before !== this.state || message.state === "recovering") {
            this.emit("state", { state: this.state, detail: this.detail });
          }
        }
        break;
      case "chunk": {
        const previous = this.lastChunk;
        this.lastChunk = message;
        this.chunks.push({ ...message, generation: this.generation });
        if (this.chunks.length > HISTORY) this.chunks.shift();
        this.figures.chunk(message, previous, this.controls.sentTime(message.applied_seq), this.clock.now());
        this.emit("chunk", message);
        break;
      }
      case "warning":
        this.warnings.push(message);
        this.emit("warning", message);
        break;
      case "error":
        this.errors.push(message);
        this.emit("error", message);
        break;
      case "done":
        this.done = message.reason;
        if (this.terminal) this.finish();
        else this.controls.stop();
        this.changed();
        break;
      default:
        break;
    }
  }
  // -- ending -----------------------------------------------------------------------------------------------------
  // The session is terminal: finish once its `done` status is in (at once if it is, or if there is no link that
  // could bring it), else after DONE_WAIT_MS.
  finishWhenDone() {
    this.controls.stop();
    if (this.done !== null || this.link === null) {
      this.finish();
    } else if (this.doneTimer === null && !this.ended) {
      this.doneTimer = this.clock.setTimeout(() => this.finish(), DONE_WAIT_MS);
    }
  }
  finish() {
    if (this.doneTimer !== null) this.clock.clearTimeout(this.doneTimer);
    this.doneTimer = null;
    this.controls.stop();
    if (this.link !== null) void this.closeLink(this.link);
    if (this.follower !== null && this.terminal) this.follower.abort();
    this.ended = this.terminal || this.ended;
    if (this.ended && !this.doneEmitted) {
      this.doneEmitted = true;
      const reason = this.done ?? this.snapshot?.reason ?? this.snapshot?.error?.code ?? this.state;
      this.emit("done", { reason, state: this.state });
    }
    this.changed();
  }
  async closeLink(link) {
    try {
      await link.close();
    } catch (error) {
      this.logger.warn("lingstream: closing the link failed", error);
    }
  }
  /**
   * A discrete command (pause, resume, reset_pose, stop, prompt). On LiveKit an RPC call answered with the session's
   * state (a refusal comes back with its stable code, as an `error` event); elsewhere, or from a service without the
   * RPC methods, a reliable packet whose outcome comes later as a status.
   */
  async command(message) {
    const link = this.link;
    if (link === null) return false;
    if (link.command === void 0) return link.send(message, true) ? "sent" : false;
    try {
      const answer = await link.command(message);
      if (answer === null) return "sent";
      this.calls.push({ type: message.type, state: answer.state, applied: answer.applied });
      if (typeof answer.state === "string" && !this.terminal && answer.state !== this.state) {
        this.state = answer.state;
        this.emit("state", { state: this.state, detail: null });
      }
      this.changed();
      return "answered";
    } catch (error) {
      const failure = error;
      if (message.type === "stop" && failure.code === 1503) return "sent";
      const code = typeof failure.data === "string" && failure.data !== "" ? failure.data : `rpc_${String(failure.code)}`;
      const text = failure.message || String(error);
      this.calls.push({ type: message.type, code, message: text });
      this.onStatus({ v: 1, type: "error", code, message: text });
      return false;
    }
  }
  /** Sends a control protocol message on the current link (reliable unless told); false if there is none. */
  send(message, reliable = true) {
    return this.link !== null ? this.link.send(message, reliable) : false;
  }
  /** The text prompt (newest wins by its own seq; "" clears it), from the next chunk on. */
  prompt(text) {
    const bytes = utf8Bytes(text);
    if (bytes > MAX_PROMPT_BYTES) {
      return Promise.reject(new RangeError(`a prompt is at most ${MAX_PROMPT_BYTES} bytes (this one has ${bytes})`));
    }
    this.promptSeq = Math.max(this.promptSeq + 1, this.clock.wall());
    const message = { v: 1, type: "prompt", seq: this.promptSeq, text };
    if (this.link === null) return Promise.resolve(false);
    this.lastPrompt = message;
    this.changed();
    return this.command(message);
  }
  pause() {
    return this.command({ v: 1, type: "pause" });
  }
  resume() {
    return this.command({ v: 1, type: "resume" });
  }
  resetPose() {
    return this.command({ v: 1, type: "reset_pose" });
  }
  /**
   * Ends the session: a `stop` over the link, and over REST when the link cannot carry it (or it went unanswered
   * for STOP_FALLBACK_MS). The `done` event follows.
   */
  async stop() {
    const id = this.id;
    if (id === null || this.terminal) return;
    const sent = await this.command({ v: 1, type: "stop" });
    if (sent === "sent") {
      this.clock.setTimeout(() => {
        if (this.id === id && !this.terminal) void this.endOverRest(id);
      }, STOP_FALLBACK_MS);
    } else if (sent !== "answered") {
      await this.endOverRest(id);
    }
  }
  async endOverRest(id) {
    try {
      const { body } = await this.api.deleteSession(id);
      this.onSnapshot(body);
    } catch (error) {
      this.fail("stop_failed", `could not stop the session: ${error.message}`);
    }
  }
  /** Keyboard control from `target` (the window by default) while this session runs; detached on close(). */
  attachKeyboard(target) {
    const controller = keyboardController(this.controls, target);
    this.inputs.push(controller);
    return controller;
  }
  /** Gamepad control (the first connected pad, standard mapping); detached on close(). */
  attachGamepad() {
    const controller = gamepadController(this.controls);
    this.inputs.push(controller);
    return controller;
  }
  /**
   * Lets go of everything held here (link, event stream, timers, input controllers); resolves within CLOSE_MS in
   * every state. The session itself goes on until the service's reconnect grace ends it: `stop()` ends it at once.
   */
  async close() {
    if (this.closed) return;
    this.closed = true;
    this.controls.stop();
    for (const input of this.inputs.splice(0)) input.detach();
    if (this.follower !== null) this.follower.abort();
    for (const timer of [this.doneTimer, this.statsTimer]) if (timer !== null) this.clock.clearTimeout(timer);
    if (this.statsTimer !== null) this.clock.clearInterval(this.statsTimer);
    if (this.qualityTimer !== null) this.clock.clearInterval(this.qualityTimer);
    this.doneTimer = this.statsTimer = this.qualityTimer = null;
    if (this.video !== null && this.frameCallback !== null && "cancelVideoFrameCallback" in this.video) {
      this.video.cancelVideoFrameCallback(this.frameCallback);
    }
    this.frameCallback = null;
    const link = this.link;
    if (link !== null) {
      let timer = null;
      const bound = new Promise((resolve) => {
        timer = this.clock.setTimeout(resolve, CLOSE_MS);
      });
      await Promise.race([this.closeLink(link), bound]);
      this.clock.clearTimeout(timer);
    }
    this.emitter.clear();
  }
  // -- video frames -----------------------------------------------------------------------------------------------
  countFrames(video) {
    if (typeof video.requestVideoFrameCallback !== "function") {
      let last = 0;
      this.qualityTimer = this.clock.setInterval(() => {
        const total = video.getVideoPlaybackQuality().totalVideoFrames;
        if (total > last) this.figures.shown(this.clock.now(), total - last);
        last = total;
      }, 250);
      return;
    }
    const onFrame = (now, meta) => {
      if (this.closed || this.video !== video) return;
      this.guard(() => {
        const link = this.link;
        const frameId = link !== null && link.frameId !== void 0 ? link.frameId(meta) : null;
        this.figures.presented(now, meta, { embedded: this.transport === "embedded", generation: this.generation, frameId });
      });
      this.frameCallback = video.requestVideoFrameCallback(onFrame);
    };
    this.frameCallback = video.requestVideoFrameCallback(onFrame);
  }
};

// packages/client/src/version.ts
var VERSION = "0.1.0";
export {
  Api,
  ApiError,
  CLOSE_MS,
  CONTROL_KEYS,
  Controls,
  EmbeddedLink,
  Emitter,
  EventStreamParser,
  Figures,
  KEY_MAP,
  LingstreamError,
  LiveKitLink,
  MAX_PROMPT_BYTES,
  OPEN_TIMEOUT_MS,
  REJOIN_BACKOFF_MS,
  REJOIN_BUDGET_MS,
  REPEAT_TICKS,
  RESEND_MS,
  Rejoin,
  STREAMING_STATES,
  Session,
  TERMINAL_STATES,
  VERSION,
  createSession,
  gamepadController,
  gamepadKeys,
  keyboardController,
  median,
  systemClock,
  tokenEndpoint,
  utf8Bytes,
  watchSession
};
