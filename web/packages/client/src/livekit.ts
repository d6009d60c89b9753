// The LiveKit transport: join the session's room with livekit-client (a peer dependency, loaded on first use through
// the session's `livekit` loader), show the service participant's video track, send control as data on the control
// topic (snapshots lossy) and the discrete commands as RPC calls to the service participant (`command`: answered with
// the session's state, or refused with a stable code; docs/livekit.md), and read status from the status topic.
// livekit-client resumes a dropped connection by itself; if it gives up (a disconnect that does not mean "over"), the
// link fetches fresh join details (same identity, new token) and joins again, within the service's reconnect grace.
// The service participant's attributes carry the session's state (`lingstream.state`, synced to late joiners): read
// on joining and on each change, so a viewer or a rejoining tab shows the state before the next status broadcast.
//
// Frame metadata: the service stamps every frame with its index in the session's video (LiveKit frame metadata,
// `frame_id`). livekit-client reads it only in a dedicated worker (its `livekit-client.fm.worker.mjs`), given as the
// room's `frameMetadata` option; `frameId(meta)` then names the frame a requestVideoFrameCallback presents (by its RTP
// timestamp), or null when there is none (no worker, a frame the worker has not seen).

import { ApiError } from "./errors.js";
import type { CommandAnswer, Link, LinkHandlers } from "./link.js";
import type { JoinDetails, LiveKitJoin, LiveKitViewer, StatusMessage } from "./types.js";

export type LiveKitModule = typeof import("livekit-client");

const OVER = new Set([1, 2, 4, 5, 10]); // DisconnectReason: CLIENT_INITIATED, DUPLICATE_IDENTITY, PARTICIPANT_REMOVED,
// ROOM_DELETED, ROOM_CLOSED: the session (or this tab's part in it) is over; do not rejoin.
const REJOIN_MS = [500, 1000, 2000, 4000];
// LiveKit's RPC errors after which a command goes as a packet instead: the service has no such method (an older one),
// the server no RPC, nobody acknowledged the call. Safe: every command is idempotent or deduplicated by its seq.
const PACKET_INSTEAD = new Set([1400, 1403, 1501]);

// livekit-client names each RPC call with crypto.randomUUID, which browsers offer in secure contexts only (https,
// localhost): a page served over plain http from another host (a LAN address, the tests' private network) would have
// every call fail with a TypeError. Such a page gets a version 4 UUID made from crypto.getRandomValues, which browsers
// offer everywhere.
function ensureRandomUuid(): void {
  const crypto = globalThis.crypto as Crypto | undefined;
  if (!crypto || typeof crypto.randomUUID === "function") return;
  (crypto as { randomUUID: () => string }).randomUUID = () => {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    bytes[6] = ((bytes[6] as number) & 0x0f) | 0x40;
    bytes[8] = ((bytes[8] as number) & 0x3f) | 0x80;
    const hex = Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  };
}

type Room = InstanceType<LiveKitModule["Room"]>;
type RemoteVideoTrack = InstanceType<LiveKitModule["RemoteVideoTrack"]>;

export class LiveKitLink implements Link {
  readonly kind = "livekit" as const;
  readonly generation = 0;
  room: Room | null = null;
  /** The service participant's attributes, as last read. */
  attributes: Record<string, string> = {};
  private track: RemoteVideoTrack | null = null;
  private worker: Worker | null = null;
  private closed = false;
  private rejoins = 0;
  private readonly encoder = new TextEncoder();
  private readonly decoder = new TextDecoder();

  constructor(
    private readonly load: () => Promise<LiveKitModule>,
    private details: LiveKitJoin | LiveKitViewer,
    private readonly refresh: () => Promise<JoinDetails>,
    private readonly handlers: LinkHandlers,
    private readonly makeWorker: (() => Worker | null) | null = null,
  ) {
    ensureRandomUuid();
  }

  get pc(): RTCPeerConnection | null {
    return null; // livekit-client owns its peer connections
  }

  async connect(): Promise<void> {
    const lk = await this.load();
    const details = this.details;
    const worker = this.frameMetadataWorker();
    const options: Record<string, unknown> = { adaptiveStream: false, dynacast: false };
    if (worker !== null) options.frameMetadata = { worker };
    const room = new lk.Room(options);
    const current = (): boolean => this.room === room && !this.closed;
    room.on(lk.RoomEvent.TrackSubscribed, (track, _publication, participant) => {
      if (current() && track.kind === lk.Track.Kind.Video && participant.identity === details.service_identity) {
        this.track = track as RemoteVideoTrack;
        this.handlers.onStream(new MediaStream([track.mediaStreamTrack]), track.receiver ?? null);
      }
    });
    room.on(lk.RoomEvent.DataReceived, (payload, participant, _kind, topic) => {
      if (!current() || topic !== details.status_topic) return;
      if (participant && participant.identity !== details.service_identity) return;
      let message: StatusMessage;
      try {
        message = JSON.parse(this.decoder.decode(payload)) as StatusMessage;
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
      if (reason !== undefined && OVER.has(reason)) {
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

  private stateFromAttributes(attributes: Readonly<Record<string, string>>): void {
    // The attributes as a `state` status: the session handles both the same way (the newest wins).
    const state = attributes["lingstream.state"];
    this.attributes = { ...attributes };
    if (state) this.handlers.onStatus({ v: 1, type: "state", state, detail: null, from: "attributes" });
  }

  // One worker for every room of this link (a rejoin makes a new room); null where workers cannot be had.
  private frameMetadataWorker(): Worker | null {
    if (this.worker !== null || this.makeWorker === null) return this.worker;
    try {
      this.worker = this.makeWorker();
    } catch (error) {
      console.warn("lingstream: no frame metadata worker; frames are matched by arrival", error);
    }
    return this.worker;
  }

  /** The service's frame id of the frame requestVideoFrameCallback presents (`meta`), or null. */
  frameId(meta: { rtpTimestamp?: number } | null): number | null {
    const track = this.track as (RemoteVideoTrack & { lookupFrameMetadata?: (q: { rtpTimestamp: number }) => unknown }) | null;
    if (track === null || !meta || typeof meta.rtpTimestamp !== "number" || !track.lookupFrameMetadata) return null;
    const found = track.lookupFrameMetadata({ rtpTimestamp: meta.rtpTimestamp }) as { frameId?: unknown } | undefined;
    return found && typeof found.frameId === "number" ? found.frameId : null;
  }

  private rejoinLater(): void {
    const delay = REJOIN_MS[Math.min(this.rejoins++, REJOIN_MS.length - 1)] as number;
    this.handlers.onState(`LiveKit: disconnected, joining again in ${delay} ms`);
    setTimeout(async () => {
      if (this.closed) return;
      try {
        const fresh = await this.refresh();
        if (fresh.kind === "livekit") this.details = fresh;
        await this.connect();
      } catch (error) {
        const status = error instanceof ApiError ? error.status : 0;
        if (status === 404 || status === 409) this.handlers.onFatal(error as Error);
        else if (!this.closed) this.rejoinLater();
      }
    }, delay);
  }

  send(message: unknown, reliable: boolean): boolean {
    const room = this.room;
    // A viewer's details name no control topic; what it sends goes untopiced and the service ignores it (a viewer
    // cannot control: docs/control-protocol.md), as it would anything a viewer sends.
    const topic = "control_topic" in this.details ? this.details.control_topic : undefined;
    if (room === null || room.state !== "connected") return false;
    const payload = this.encoder.encode(JSON.stringify(message));
    room.localParticipant
      .publishData(payload, { reliable, topic })
      .catch((error: unknown) => console.warn("lingstream: sending control failed", error));
    return true;
  }

  /**
   * A discrete command (pause, resume, reset_pose, stop, prompt) as the RPC method `lingstream.<type>` of the service
   * participant: resolves to the answer ({v, ok, state, applied}), or to null when it went as a packet instead;
   * rejects with livekit-client's RpcError (`code`, `message`, `data`: the stable code) when the session refuses it.
   */
  async command(message: { type: string }): Promise<CommandAnswer | null> {
    const room = this.room;
    if (room === null || room.state !== "connected") throw new Error("not connected to the room");
    try {
      const answer = await room.localParticipant.performRpc({
        destinationIdentity: this.details.service_identity,
        method: `lingstream.${message.type}`,
        payload: JSON.stringify(message),
      });
      return JSON.parse(answer) as CommandAnswer;
    } catch (error) {
      const code = (error as { code?: unknown }).code;
      if (typeof code === "number" && PACKET_INSTEAD.has(code) && this.send(message, true)) return null;
      throw error;
    }
  }

  /** livekit-client's fault drill (Room.simulateScenario) on the current room; false when there is none. */
  async simulate(scenario: string): Promise<boolean> {
    if (this.room === null || this.room.state !== "connected") return false;
    await this.room.simulateScenario(scenario as Parameters<Room["simulateScenario"]>[0]);
    return true;
  }

  async close(): Promise<void> {
    this.closed = true;
    const left = this.room ? this.room.disconnect() : Promise.resolve();
    if (this.worker !== null) this.worker.terminate();
    this.worker = null;
    await left;
  }
}
