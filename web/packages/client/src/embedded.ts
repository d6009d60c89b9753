// The embedded transport: direct WebRTC with the service. One RTCPeerConnection at a time, with a receive-only video
// transceiver and a data channel labelled "control" (control protocol v1 both ways). The offer is POSTed with its
// candidates (no trickle). Every new offer rebinds the same session, so reconnecting is simply offering again:
// on "failed" at once, on "disconnected" if it has not recovered after DISCONNECTED_GRACE_MS. A viewer offers to its
// watch URL with its viewer credential; when that is refused (401: expired), it asks `refresh` for new details.

import type { Api } from "./api.js";
import { ApiError } from "./errors.js";
import type { Link, LinkHandlers } from "./link.js";
import type { EmbeddedJoin, EmbeddedViewer, JoinDetails, StatusMessage } from "./types.js";

const GATHER_TIMEOUT_MS = 3000;
const DISCONNECTED_GRACE_MS = 2000;
const RETRY_MS = [500, 1000, 2000, 4000, 4000, 4000];

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
  private channel: RTCDataChannel | null = null;
  private closed = false;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private failures = 0;

  /** refresh: fresh viewer details (viewers only: a viewer whose credential expired gets a new one). */
  constructor(
    private readonly api: Api,
    private details: EmbeddedJoin | EmbeddedViewer,
    private readonly handlers: LinkHandlers,
    private readonly refresh: (() => Promise<JoinDetails>) | null = null,
  ) {}

  /** Offer a new peer connection (the first one, or a rebind replacing the current one). */
  async connect(): Promise<void> {
    if (this.closed) return;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    const generation = ++this.generation;
    if (this.pc) this.pc.close();
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    const current = (): boolean => this.pc === pc && !this.closed;
    pc.addTransceiver("video", { direction: "recvonly" });
    const channel = pc.createDataChannel(this.details.data_channel || "control");
    this.channel = channel;
    channel.onopen = () => {
      if (current()) this.handlers.onOpen();
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
      if (state === "connected") {
        this.failures = 0;
        if (this.timer !== null) clearTimeout(this.timer);
        this.timer = null;
      } else if (state === "failed") {
        this.reconnectLater(0);
      } else if (state === "disconnected") {
        this.reconnectLater(DISCONNECTED_GRACE_MS);
      }
    };
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
      const status = error instanceof ApiError ? error.status : 0;
      if (status === 404 || status === 409) {
        this.handlers.onFatal(error as Error); // the session is gone or ending: nothing to reconnect to
        return;
      }
      if (status === 401 && this.refresh !== null) {
        try {
          const fresh = await this.refresh(); // a viewer whose credential expired: a new one, a new place
          if (fresh.kind === "embedded") this.details = fresh;
        } catch (refreshError) {
          this.handlers.onFatal(refreshError as Error);
          return;
        }
      }
      this.handlers.onState(`offer failed: ${(error as Error).message}`);
      this.reconnectLater(RETRY_MS[Math.min(this.failures++, RETRY_MS.length - 1)] as number);
    }
  }

  private reconnectLater(delay: number): void {
    if (this.closed || this.timer !== null) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      const state = this.pc ? this.pc.connectionState : "closed";
      if (!this.closed && state !== "connected") void this.connect();
    }, delay);
  }

  send(message: unknown): boolean {
    if (this.channel === null || this.channel.readyState !== "open") return false;
    this.channel.send(JSON.stringify(message));
    return true;
  }

  close(): Promise<void> {
    this.closed = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    if (this.pc) this.pc.close();
    this.channel = null;
    return Promise.resolve();
  }
}
