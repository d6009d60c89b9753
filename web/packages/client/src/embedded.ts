// The embedded transport: direct WebRTC with the service. One RTCPeerConnection at a time, with a receive-only video
// transceiver and a data channel labelled "control" (control protocol v1 both ways). The offer is POSTed with its
// candidates (no trickle). Every new offer rebinds the same session, so reconnecting is offering again, through the
// service (any replica routes it): when the peer connection fails, stays disconnected for DISCONNECTED_GRACE_MS, or its
// data channel closes, the link asks the service whether the session is still on and offers again, with backoff and
// within a budget, as `Rejoin` (rejoin.ts) decides; that covers a network blip and the loss of the replica that ran
// the session (another adopts it: docs/continuity.md) alike. A viewer offers to its watch URL with its viewer
// credential; when that is refused (401: expired), it asks `refresh` for new details.

import type { Api } from "./api.js";
import { type Clock, systemClock } from "./clock.js";
import { ApiError } from "./errors.js";
import type { Link, LinkHandlers } from "./link.js";
import { Rejoin, type RejoinAnswer, type RejoinStep } from "./rejoin.js";
import type { EmbeddedJoin, EmbeddedViewer, JoinDetails, SessionSnapshot, StatusMessage } from "./types.js";

const GATHER_TIMEOUT_MS = 3000;
const DISCONNECTED_GRACE_MS = 2000;

/** What an embedded link needs of its session besides the API: its id and how long an outage may last. */
export interface EmbeddedOptions {
  sessionId: string;
  /** Fresh viewer details (viewers only: a viewer whose credential expired gets a new one). */
  refresh?: (() => Promise<JoinDetails>) | null;
  clock?: Clock;
  /** How long an outage may last before giving up (default REJOIN_BUDGET_MS). */
  rejoinBudgetMs?: number;
}

/** A failed request as `Rejoin` reads it: refused (with the stable code) or unreachable. */
function answerOf(error: unknown): Exclude<RejoinAnswer, { kind: "session" }> {
  if (error instanceof ApiError) {
    return { kind: "refused", status: error.status, code: error.code, message: error.message };
  }
  return { kind: "unreachable", message: error instanceof Error ? error.message : String(error) };
}

function gathered(pc: RTCPeerConnection): Promise<void> {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, GATHER_TIMEOUT_MS); // offer what was gathered so far
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}

export class EmbeddedLink implements Link {
  readonly kind = "embedded" as const;
  pc: RTCPeerConnection | null = null;
  generation = 0;
  readonly rejoin: Rejoin;
  private channel: RTCDataChannel | null = null;
  private closed = false;
  /** The one pending step: a probe, an offer's open deadline, or the disconnected grace. */
  private timer: unknown = null;
  private readonly clock: Clock;
  private readonly sessionId: string;
  private readonly refresh: (() => Promise<JoinDetails>) | null;
  /** The newest snapshot a probe read, handed to the session when the link opens again. */
  private probed: SessionSnapshot | null = null;

  constructor(
    private readonly api: Api,
    private details: EmbeddedJoin | EmbeddedViewer,
    private readonly handlers: LinkHandlers,
    options: EmbeddedOptions,
  ) {
    this.clock = options.clock ?? systemClock;
    this.sessionId = options.sessionId;
    this.refresh = options.refresh ?? null;
    this.rejoin = new Rejoin(this.clock.now(), options.rejoinBudgetMs);
  }

  /** The first connection; later ones follow from `Rejoin`'s steps. */
  async connect(): Promise<void> {
    await this.step(this.rejoin.start());
  }

  private async step(step: RejoinStep): Promise<void> {
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
        if (this.probed !== null) this.handlers.onSnapshot?.(this.probed); // the session ends with the service's why
        return;
      case "give_up":
        this.handlers.onFatal(new Error(step.message), step.code);
        return;
      case "none":
        return;
    }
  }

  private clearTimer(): void {
    if (this.timer !== null) this.clock.clearTimeout(this.timer);
    this.timer = null;
  }

  // The peer connection or its channel died (or did not open in time): an outage starts, or goes on.
  private lost(why: string): void {
    if (this.closed) return;
    const starts = this.rejoin.phase === "connected";
    const step = this.rejoin.lost(this.clock.now());
    if (starts && step.action !== "none") this.handlers.onLost?.(why);
    void this.step(step);
  }

  // Ask the service whether the session is still on.
  private async probe(): Promise<void> {
    let answer: RejoinAnswer;
    try {
      const { body } = await this.api.getSession(this.sessionId);
      this.probed = body;
      answer = { kind: "session", status: body.status, reason: body.reason ?? null };
    } catch (error) {
      answer = answerOf(error);
    }
    if (this.closed) return;
    this.handlers.onState(
      answer.kind === "session"
        ? `reconnecting: the session is ${answer.status}`
        : `reconnecting: ${answer.kind === "refused" ? `${answer.status} ${answer.code}` : answer.message}`,
    );
    await this.step(this.rejoin.answered(this.clock.now(), answer));
  }

  /** Offer a new peer connection (the first one, or a rebind replacing the current one). */
  private async offer(openWithinMs: number): Promise<void> {
    if (this.closed) return;
    const generation = ++this.generation;
    if (this.pc) this.pc.close();
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    const current = (): boolean => this.pc === pc && !this.closed;
    pc.addTransceiver("video", { direction: "recvonly" });
    const channel = pc.createDataChannel(this.details.data_channel || "control");
    this.channel = channel;
    channel.onopen = () => {
      if (!current()) return;
      this.clearTimer();
      const wasOut = this.rejoin.outages > 0;
      this.rejoin.opened();
      if (wasOut && this.probed !== null) this.handlers.onSnapshot?.(this.probed); // where the session stands now
      this.handlers.onOpen();
    };
    channel.onclose = () => {
      if (current()) this.lost(`the control channel closed (peer connection ${generation})`);
    };
    channel.onmessage = (event: MessageEvent) => {
      if (!current()) return;
      let message: StatusMessage;
      try {
        message = JSON.parse(String(event.data)) as StatusMessage;
      } catch (error) {
        console.warn("lingstream: unreadable status message", error);
        return;
      }
      this.handlers.onStatus(message);
    };
    pc.ontrack = (event: RTCTrackEvent) => {
      if (current()) this.handlers.onStream(event.streams[0] || new MediaStream([event.track]), event.receiver);
    };
    pc.onconnectionstatechange = () => {
      if (!current()) return;
      const state = pc.connectionState;
      this.handlers.onState(`${state} (peer connection ${generation})`);
      if (state === "connected" && this.rejoin.phase === "connected") {
        this.clearTimer(); // back from "disconnected" by itself
      } else if (state === "failed") {
        this.lost(`the peer connection failed (${generation})`);
      } else if (state === "disconnected" && this.rejoin.phase === "connected" && this.timer === null) {
        this.timer = this.clock.setTimeout(() => {
          this.timer = null;
          if (current() && pc.connectionState !== "connected") this.lost(`the peer connection stayed disconnected`);
        }, DISCONNECTED_GRACE_MS);
      }
    };
    // Counted lost unless its control path opens in time (an answered offer whose ICE never completes).
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
          const fresh = await this.refresh(); // a viewer whose credential expired: a new one, a new place
          if (fresh.kind === "embedded") this.details = fresh;
          this.handlers.onState("offer refused (401): the viewer's credential was renewed");
          await this.step(this.rejoin.answered(this.clock.now(), { kind: "unreachable", message: "renewed" }));
          return;
        } catch (refreshError) {
          this.rejoin.end();
          this.handlers.onFatal(refreshError as Error);
          return;
        }
      }
      const answer = answerOf(error);
      this.handlers.onState(
        answer.kind === "refused"
          ? `offer refused: ${answer.status} ${answer.code}`
          : `offer failed: ${answer.message}`,
      );
      await this.step(this.rejoin.answered(this.clock.now(), answer));
    }
  }

  send(message: unknown): boolean {
    if (this.channel === null || this.channel.readyState !== "open") return false;
    this.channel.send(JSON.stringify(message));
    return true;
  }

  close(): Promise<void> {
    this.closed = true;
    this.rejoin.end();
    this.clearTimer();
    if (this.pc) this.pc.close();
    this.channel = null;
    return Promise.resolve();
  }
}
