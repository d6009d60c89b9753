// One session as a web page lives it: created (or watched), its queue followed over the event stream, joined on
// either transport once it streams, steered with held keys, prompts and commands, and measured (figures.ts). What
// happens is told as events to listeners that cannot break it (emitter.ts); the page and the React hook are two
// readers of the same object.
//
// A session ends here once: the event stream reports the terminal state and the link brings the final `done` status,
// in either order. The link closes when both have happened, or DONE_WAIT_MS after the terminal state when no `done`
// comes (the link was down), so the reason the service gave is never cut off by closing the link early. `close()`
// lets go of everything this side holds (link, event stream, timers) and returns within CLOSE_MS whatever state the
// link is in; it does not end the session on the service (`stop()` does).

import { Api, type FetchLike, type TokenProvider } from "./api.js";
import { ApiError } from "./errors.js";
import { type Clock, systemClock } from "./clock.js";
import { Controls } from "./controls.js";
import { EmbeddedLink } from "./embedded.js";
import { Emitter, type Logger } from "./emitter.js";
import { Figures, type Stats } from "./figures.js";
import { type InputController, gamepadController, keyboardController } from "./input.js";
import type { Link, LinkHandlers } from "./link.js";
import { type LiveKitModule, LiveKitLink } from "./livekit.js";
import {
  type ChunkStatus,
  type CreateSessionBody,
  type ErrorStatus,
  type JoinDetails,
  STREAMING_STATES,
  type SessionSnapshot,
  type StatusMessage,
  TERMINAL_STATES,
  type WarningStatus,
} from "./types.js";

export const MAX_PROMPT_BYTES = 512;
const HISTORY = 64;
const DONE_WAIT_MS = 2000;
const STATS_MS = 500;
/** The longest close() takes, whatever state the link is in. */
export const CLOSE_MS = 3000;
// How long a stop sent over the link may go unanswered before the session is ended over REST instead. A real LiveKit
// server announces a participant that publishes nothing to the others in batches, up to 3 s after it joined; until
// then the service cannot tell whose packet it is and ignores it, so a stop sent in the first seconds is lost.
const STOP_FALLBACK_MS = 2000;

export function utf8Bytes(text: string): number {
  return new TextEncoder().encode(text).length;
}

export type Role = "controller" | "viewer";
export type Credential = "none" | "key" | "client_token" | "session_token" | "watch_token";
/** What a command came to: answered by the service (LiveKit RPC), sent (its outcome comes as a status), or false. */
export type CommandOutcome = "answered" | "sent" | false;

/** A chunk status as kept in `session.chunks`: with the peer connection generation it arrived on. */
export type ChunkRecord = ChunkStatus & { generation: number };

/** A discrete command's outcome as LiveKit RPC answered it, or its refusal. */
export interface CallRecord {
  type: string;
  state?: string;
  applied?: unknown;
  code?: string;
  message?: string;
}

export interface SessionEvents {
  [name: string]: unknown;
  /** The queue position changed (null once admitted). */
  queue: { position: number | null };
  /** The lifecycle state changed (from the event stream, a `state` status or a command's answer). */
  state: { state: string; detail: string | null };
  /** Every session snapshot of the REST API and the event stream. */
  snapshot: SessionSnapshot;
  chunk: ChunkStatus;
  warning: WarningStatus;
  /**
   * Something was refused or failed: an `error` status of the service (its stable code), a refused command, or one
   * of this client's: `join_failed`, `no_transport`, `connection_lost`, `stop_failed`.
   */
  error: ErrorStatus;
  /** The session is over and this side let go of its link: why (the `done` reason, else the terminal state's). */
  done: { reason: string; state: string };
  /** The figures, every 500 ms while joined. */
  stats: Stats;
  /** The link is connecting, connected (the control path opened) or changed state (`text`, for people). */
  connection: { phase: "connecting" | "open" | "state"; text: string };
  /** A video stream arrived (also given to the joined video element). */
  stream: MediaStream;
  /** Anything above: for a view that re-renders on every change. */
  change: undefined;
}

export interface SessionOptions {
  /** Where the service is ("" or omitted: this page's origin). */
  baseUrl?: string;
  /** An API key (server-side or trusted use; a browser app uses a token provider). */
  apiKey?: string;
  /** A client token provider (docs/integrate.md): asked once, for the create. */
  tokenProvider?: TokenProvider;
  /** Loads livekit-client (a peer dependency) when a session is on LiveKit; default: `import("livekit-client")`. */
  livekitClient?: () => Promise<LiveKitModule>;
  /** A worker reading LiveKit frame metadata (livekit-client's `livekit-client.fm.worker.mjs`); none by default. */
  frameMetadataWorker?: () => Worker | null;
  /** Ask the receiver to hold at most about this much video (ms) before showing it; default the browser's choice. */
  jitterBufferTargetMs?: number | null;
  /**
   * Embedded transport: how long the link may try to rejoin after losing its connection (a network blip, the loss
   * of the replica that ran the session) before giving up with `connection_lost`; default REJOIN_BUDGET_MS (60 s).
   */
  rejoinBudgetMs?: number;
  fetch?: FetchLike;
  clock?: Clock;
  logger?: Logger;
}

export interface CreateOptions extends SessionOptions, CreateSessionBody {}

export interface WatchOptions extends SessionOptions {
  sessionId: string;
  /** A share link's watch token. */
  token?: string;
}

const defaultLoader = (): Promise<LiveKitModule> => import("livekit-client");

/**
 * Create a session (a client token from `tokenProvider`, else `apiKey`) and follow it. Rejects with an ApiError when
 * the create is refused (429 with `retryAfter` when every slot is taken and the queue is full).
 */
export async function createSession(options: CreateOptions): Promise<Session> {
  const {
    baseUrl,
    apiKey,
    tokenProvider,
    livekitClient,
    frameMetadataWorker,
    jitterBufferTargetMs,
    rejoinBudgetMs,
    fetch,
    clock,
    logger,
    ...body
  } = options;
  const api = new Api({ baseUrl, apiKey, fetch });
  let credential: Credential = apiKey ? "key" : "none";
  if (tokenProvider !== undefined) {
    api.useToken(await tokenProvider());
    credential = "client_token";
  }
  const { body: created } = await api.createSession(body);
  if (created.session_token) {
    api.useToken(created.session_token); // this session's own token from now on
    credential = "session_token";
  }
  const session = new Session(api, "controller", credential, options);
  session.begin(created);
  return session;
}

/** Watch a session someone else controls (a viewer: video and status, no control). */
export async function watchSession(options: WatchOptions): Promise<Session> {
  const api = new Api({ baseUrl: options.baseUrl, apiKey: options.apiKey, token: options.token ?? null, fetch: options.fetch });
  const credential: Credential = options.token ? "watch_token" : options.apiKey ? "key" : "none";
  const { body } = await api.getSession(options.sessionId);
  const session = new Session(api, "viewer", credential, options);
  session.begin(body);
  return session;
}

export class Session {
  readonly api: Api;
  readonly role: Role;
  readonly credential: Credential;
  readonly controls: Controls;
  readonly figures = new Figures();
  /** The keys a controller holds: `keys.hold("w")`, `keys.release("w")` (keyboard names too: "ArrowLeft"). */
  readonly keys: {
    hold(key: string): boolean;
    release(key: string): boolean;
    releaseAll(): void;
    readonly held: ReadonlySet<string>;
  };
  id: string | null = null;
  state = "creating";
  detail: string | null = null;
  queuePosition: number | null = null;
  transport: string | null = null;
  snapshot: SessionSnapshot | null = null;
  lastChunk: ChunkStatus | null = null;
  chunks: ChunkRecord[] = [];
  errors: ErrorStatus[] = [];
  warnings: WarningStatus[] = [];
  calls: CallRecord[] = [];
  lastPrompt: { v: 1; type: "prompt"; seq: number; text: string } | null = null;
  /** The `done` status's reason, once it came. */
  done: string | null = null;
  /** The session is over and this side let go of its link. */
  ended = false;
  connection: string | null = null;
  jitterBufferTarget: number | null = null;
  link: Link | null = null;
  private readonly emitter: Emitter<SessionEvents>;
  private readonly clock: Clock;
  private readonly logger: Logger;
  private readonly options: SessionOptions;
  private promptSeq: number;
  private video: HTMLVideoElement | null = null;
  private joinWanted = false;
  private joining = false;
  private follower: AbortController | null = null;
  private doneTimer: unknown = null;
  private statsTimer: unknown = null;
  private frameCallback: number | null = null;
  private qualityTimer: unknown = null;
  private closed = false;
  private doneEmitted = false;
  private inputs: InputController[] = [];

  constructor(api: Api, role: Role, credential: Credential, options: SessionOptions = {}) {
    this.api = api;
    this.role = role;
    this.credential = credential;
    this.options = options;
    this.clock = options.clock ?? systemClock;
    this.logger = options.logger ?? console;
    this.emitter = new Emitter<SessionEvents>(this.logger);
    this.promptSeq = this.clock.wall(); // the prompt's own sequence (newest wins), above an earlier page load's
    this.controls = new Controls(
      (message, reliable) => (this.link !== null ? this.link.send(message, reliable) : false),
      () => this.changed(),
      this.clock,
    );
    const controls = this.controls;
    this.keys = {
      hold: (key) => controls.hold(key),
      release: (key) => controls.release(key),
      releaseAll: () => controls.releaseAll(),
      get held() {
        return controls.held as ReadonlySet<string>;
      },
    };
  }

  // -- listening --------------------------------------------------------------------------------------------------

  /** Calls `listener` on each `name` event (a listener that throws is logged once and the session goes on). */
  on<K extends keyof SessionEvents>(name: K, listener: (payload: SessionEvents[K]) => void): () => void {
    return this.emitter.on(name, listener);
  }

  off<K extends keyof SessionEvents>(name: K, listener: (payload: SessionEvents[K]) => void): void {
    this.emitter.off(name, listener);
  }

  /** Exceptions thrown by listeners (each caught; the first of each listener logged). */
  get listenerErrors(): number {
    return this.emitter.listenerErrors;
  }

  get stats(): Stats {
    return this.figures.stats();
  }

  get generation(): number {
    return this.link !== null ? this.link.generation : 0;
  }

  get terminal(): boolean {
    return TERMINAL_STATES.has(this.state);
  }

  private emit<K extends keyof SessionEvents>(name: K, payload: SessionEvents[K]): void {
    this.emitter.emit(name, payload);
    if (name !== "change") this.emitter.emit("change", undefined);
  }

  private changed(): void {
    this.emitter.emit("change", undefined);
  }

  // -- the session resource ---------------------------------------------------------------------------------------

  /** Starts with the create's (or the first GET's) snapshot: follows the event stream until the session ends. */
  begin(snapshot: SessionSnapshot): void {
    this.onSnapshot(snapshot);
    void this.follow(snapshot.id);
    if (this.statsTimer === null) {
      this.statsTimer = this.clock.setInterval(() => {
        this.figures.tick(this.clock.now());
        this.emit("stats", this.figures.stats());
      }, STATS_MS);
    }
  }

  private onSnapshot(snapshot: SessionSnapshot): void {
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
  private async follow(id: string): Promise<void> {
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
      await new Promise<void>((resolve) => this.clock.setTimeout(resolve, Math.min(5000, 500 * 2 ** failures)));
    }
  }

  // Our own handlers run inside the transports' callbacks: nothing of ours may throw into them.
  private guard(fn: () => void): void {
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
  async join(video: HTMLVideoElement | null = null): Promise<void> {
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

  private async freshDetails(id: string): Promise<JoinDetails> {
    const { body } = await this.api.getSession(id);
    // A watch token reads the session without its join details: a viewer needs only its own.
    if (!STREAMING_STATES.has(body.status) || (!body.transport && this.role !== "viewer")) {
      throw new ApiError(409, "session_not_running", `the session is ${body.status}`);
    }
    if (this.role === "viewer") return (await this.api.createViewer(id)).body; // a viewer's place and credential
    return body.transport as JoinDetails;
  }

  private handlers(): LinkHandlers {
    return {
      onOpen: () =>
        this.guard(() => {
          if (this.role === "controller") {
            this.controls.start();
            this.controls.snapshot(); // the service learns the current keys (and a rebound session generates again)
          }
          this.emit("connection", { phase: "open", text: this.connection ?? "open" });
        }),
      onStatus: (message) => this.guard(() => this.onStatus(message)),
      onStream: (stream, receiver) =>
        this.guard(() => {
          const target = this.options.jitterBufferTargetMs ?? null;
          const tunable = receiver !== null && "jitterBufferTarget" in receiver;
          if (target !== null && tunable) (receiver as { jitterBufferTarget: number | null }).jitterBufferTarget = target;
          this.jitterBufferTarget = tunable ? (receiver as { jitterBufferTarget: number | null }).jitterBufferTarget : null;
          this.figures.newConnection();
          if (this.video !== null) {
            this.video.srcObject = stream;
            this.video.play().catch(() => {});
          }
          this.emit("stream", stream);
        }),
      onState: (text) =>
        this.guard(() => {
          this.connection = text;
          this.emit("connection", { phase: "state", text });
        }),
      onFatal: (error, code) =>
        this.guard(() => {
          this.fail(code ?? "connection_lost", `the connection cannot be restored: ${error.message}`);
          this.finish();
        }),
      onLost: (why) =>
        this.guard(() => {
          // A hiccup, not an error: the link rejoins through the service (any replica) while the session goes on.
          if (this.terminal) return;
          this.state = "recovering";
          this.detail = `reconnecting: ${why}`;
          this.emit("state", { state: this.state, detail: this.detail });
        }),
      onSnapshot: (snapshot) => this.guard(() => this.onSnapshot(snapshot)),
    };
  }

  private fail(code: string, message: string): void {
    const status: ErrorStatus = { v: 1, type: "error", code, message };
    this.errors.push(status);
    this.emit("error", status);
  }

  private async connect(snapshot: SessionSnapshot): Promise<void> {
    this.joining = true;
    try {
      await this.connectNow(snapshot);
    } finally {
      this.joining = false;
    }
  }

  private async connectNow(snapshot: SessionSnapshot): Promise<void> {
    const id = snapshot.id;
    let details: JoinDetails | null = snapshot.transport ?? null;
    let fetched: JoinDetails | null = null; // a viewer's details already taken (a place): used, never asked twice
    try {
      if (this.role === "viewer" && details === null && STREAMING_STATES.has(snapshot.status)) {
        details = fetched = await this.freshDetails(id); // a share link's watcher: its details name the transport
      }
      this.transport = details !== null ? details.kind : null;
      if (details === null) {
        this.fail("no_transport", "this service has no transport configured: the session runs without video");
        return;
      }
      const refresh = (): Promise<JoinDetails> => this.freshDetails(id);
      let link: Link;
      if (details.kind === "embedded") {
        const embedded = { sessionId: id, clock: this.clock, rejoinBudgetMs: this.options.rejoinBudgetMs };
        if (this.role === "viewer") {
          const own = fetched ?? (await this.freshDetails(id));
          if (own.kind !== "embedded") throw new Error(`the viewer's details are for ${own.kind}`);
          link = new EmbeddedLink(this.api, own, this.handlers(), { ...embedded, refresh });
        } else {
          link = new EmbeddedLink(this.api, details, this.handlers(), embedded);
        }
      } else if (details.kind === "livekit") {
        const fresh = fetched ?? (await this.freshDetails(id)); // tokens are short-lived: the create's may be stale
        if (fresh.kind !== "livekit") throw new Error(`the join details are for ${fresh.kind}`);
        link = new LiveKitLink(
          this.options.livekitClient ?? defaultLoader,
          fresh,
          refresh,
          this.handlers(),
          this.options.frameMetadataWorker ?? null,
        );
      } else {
        this.fail("join_failed", `unknown transport ${(details as { kind: string }).kind}: cannot join`);
        return;
      }
      if (this.closed) return;
      this.link = link;
      this.emit("connection", { phase: "connecting", text: "connecting" });
      await link.connect();
    } catch (error) {
      this.fail("join_failed", `could not join: ${(error as Error).message}`);
    }
    this.changed();
  }

  // -- status messages from the service ---------------------------------------------------------------------------

  private onStatus(message: StatusMessage): void {
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
        if (this.terminal) this.finish(); // the event stream said why already
        else this.controls.stop(); // the event stream's terminal state follows; finish() then
        this.changed();
        break;
      default:
        break;
    }
  }

  // -- ending -----------------------------------------------------------------------------------------------------

  // The session is terminal: finish once its `done` status is in (at once if it is, or if there is no link that
  // could bring it), else after DONE_WAIT_MS.
  private finishWhenDone(): void {
    this.controls.stop();
    if (this.done !== null || this.link === null) {
      this.finish();
    } else if (this.doneTimer === null && !this.ended) {
      this.doneTimer = this.clock.setTimeout(() => this.finish(), DONE_WAIT_MS);
    }
  }

  private finish(): void {
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

  private async closeLink(link: Link): Promise<void> {
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
  async command(message: { v: 1; type: string; [field: string]: unknown }): Promise<CommandOutcome> {
    const link = this.link;
    if (link === null) return false;
    if (link.command === undefined) return link.send(message, true) ? "sent" : false;
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
      // 1503: the service left the room before its answer arrived (livekit-client learns of the departure by
      // signalling, which can overtake the answer): after a stop the session is over, as asked; REST confirms it.
      const failure = error as { code?: unknown; data?: unknown; message?: string };
      if (message.type === "stop" && failure.code === 1503) return "sent";
      const code = typeof failure.data === "string" && failure.data !== "" ? failure.data : `rpc_${String(failure.code)}`;
      const text = failure.message || String(error);
      this.calls.push({ type: message.type, code, message: text });
      this.onStatus({ v: 1, type: "error", code, message: text });
      return false;
    }
  }

  /** Sends a control protocol message on the current link (reliable unless told); false if there is none. */
  send(message: unknown, reliable = true): boolean {
    return this.link !== null ? this.link.send(message, reliable) : false;
  }

  /** The text prompt (newest wins by its own seq; "" clears it), from the next chunk on. */
  prompt(text: string): Promise<CommandOutcome> {
    const bytes = utf8Bytes(text);
    if (bytes > MAX_PROMPT_BYTES) {
      return Promise.reject(new RangeError(`a prompt is at most ${MAX_PROMPT_BYTES} bytes (this one has ${bytes})`));
    }
    this.promptSeq = Math.max(this.promptSeq + 1, this.clock.wall());
    const message = { v: 1 as const, type: "prompt" as const, seq: this.promptSeq, text };
    if (this.link === null) return Promise.resolve(false);
    this.lastPrompt = message;
    this.changed();
    return this.command(message);
  }

  pause(): Promise<CommandOutcome> {
    return this.command({ v: 1, type: "pause" });
  }

  resume(): Promise<CommandOutcome> {
    return this.command({ v: 1, type: "resume" });
  }

  resetPose(): Promise<CommandOutcome> {
    return this.command({ v: 1, type: "reset_pose" });
  }

  /**
   * Ends the session: a `stop` over the link, and over REST when the link cannot carry it (or it went unanswered
   * for STOP_FALLBACK_MS). The `done` event follows.
   */
  async stop(): Promise<void> {
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

  private async endOverRest(id: string): Promise<void> {
    try {
      const { body } = await this.api.deleteSession(id);
      this.onSnapshot(body);
    } catch (error) {
      this.fail("stop_failed", `could not stop the session: ${(error as Error).message}`);
    }
  }

  /** Keyboard control from `target` (the window by default) while this session runs; detached on close(). */
  attachKeyboard(target?: EventTarget): InputController {
    const controller = keyboardController(this.controls, target);
    this.inputs.push(controller);
    return controller;
  }

  /** Gamepad control (the first connected pad, standard mapping); detached on close(). */
  attachGamepad(): InputController {
    const controller = gamepadController(this.controls);
    this.inputs.push(controller);
    return controller;
  }

  /**
   * Lets go of everything held here (link, event stream, timers, input controllers); resolves within CLOSE_MS in
   * every state. The session itself goes on until the service's reconnect grace ends it: `stop()` ends it at once.
   */
  async close(): Promise<void> {
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
      let timer: unknown = null;
      const bound = new Promise<void>((resolve) => {
        timer = this.clock.setTimeout(resolve, CLOSE_MS);
      });
      await Promise.race([this.closeLink(link), bound]);
      this.clock.clearTimeout(timer);
    }
    this.emitter.clear();
  }

  // -- video frames -----------------------------------------------------------------------------------------------

  private countFrames(video: HTMLVideoElement): void {
    if (typeof video.requestVideoFrameCallback !== "function") {
      let last = 0; // fallback: decoded frames from the playback quality counters
      this.qualityTimer = this.clock.setInterval(() => {
        const total = video.getVideoPlaybackQuality().totalVideoFrames;
        if (total > last) this.figures.shown(this.clock.now(), total - last);
        last = total;
      }, 250);
      return;
    }
    const onFrame = (now: number, meta: VideoFrameCallbackMetadata): void => {
      if (this.closed || this.video !== video) return;
      this.guard(() => {
        const link = this.link;
        const frameId = link !== null && link.frameId !== undefined ? link.frameId(meta) : null;
        this.figures.presented(now, meta, { embedded: this.transport === "embedded", generation: this.generation, frameId });
      });
      this.frameCallback = video.requestVideoFrameCallback(onFrame);
    };
    this.frameCallback = video.requestVideoFrameCallback(onFrame);
  }
}
