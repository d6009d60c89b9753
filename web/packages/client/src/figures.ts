// What the viewer sees and how fast: frames presented, frames a second, control → status (the chunk left the model)
// and control → photon (the first presented frame generated from a control snapshot). Pure: fed the chunk statuses,
// the send times of the snapshots and each presented frame's metadata, with times from the caller's clock.
//
// Embedded transport: a chunk status carries `first_frame_pts`, the 90 kHz presentation timestamp of the chunk's first
// frame; the RTP timestamp of that frame is the same plus an offset the sender picked at random. The offset is learnt
// once per peer connection from the first frame presented after a stamped status arrived (the status leaves the
// service with that frame), and from then on each chunk's first frame is found exactly by its `rtpTimestamp`.
// Keep-warm repeats (docs/control-protocol.md): while the session has nothing new, the service sends the last frame
// again every LINGSTREAM_IDLE_FRAME_INTERVAL_MS, REPEAT_TICKS off the grid generated frames sit on. Once the offset is
// known such a frame is told apart (`isRepeat`) and neither counted as a frame nor taken for a chunk's first frame.
//
// The frame the offset is learnt from may itself be a repeat: a page that (re)connects while the session idles or is
// paused gets only repeats, and when the next chunk comes, repeats sent just before its first frame may still be
// presented after its status (the video takes the longer way). Learnt from a repeat, the offset is REPEAT_TICKS too
// high: generated frames would lie REPEAT_TICKS *before* the grid and be taken for repeats, and repeats would be
// counted. Nothing lies there when the offset is right (generated frames are on the grid, repeats after it), so the
// first frame presented there shows it and is the first generated frame since: the offset is learnt again from it
// (the pacer sends the frame that ends the repeats at once, so it is the first frame of the chunk the status named,
// unless generation fell behind within that chunk: then it is a later one, as when the offset is learnt from a
// generated frame), and what was done on the repeats since the first learning is undone (`learnt`): their frame
// counts and photon samples are taken back and the chunk starts they were taken for wait for their frames.
//
// LiveKit: the RTP timestamps are the SFU's sender's, but every frame carries the service's frame id (LiveKit frame
// metadata) and every chunk status its first frame's (`first_frame_id`): a chunk starts at the first frame presented
// whose id is at least its `first_frame_id`, exactly, and a frame whose id was presented already is a keep-warm
// repeat (a repeat carries the id of the frame it repeats).

import type { ChunkStatus } from "./types.js";

export const REPEAT_TICKS = 90; // transport.session.pacing.REPEAT_PTS_OFFSET: 1 ms of the 90 kHz clock
const GRID_SLACK = 2; // ticks: a phase combines four timestamps (frame, origin's frame and status, reference), each rounded
const SAMPLES = 20;
const PENDING = 16;

/** What requestVideoFrameCallback tells of a presented frame (the part read here). */
export interface FrameMeta {
  rtpTimestamp?: number;
}

/** The figures at one moment (the `stats` event). */
export interface Stats {
  /** Video frames presented over the whole session (keep-warm repeats not counted where they can be told apart). */
  frames: number;
  framesThisConnection: number;
  /** Frames presented in the last second. */
  fps: number;
  /** Control → the chunk status of the newest applied snapshot (ms): the chunk left the model. */
  latencyMs: number | null;
  latencyMedianMs: number | null;
  /** Control → the first presented frame generated from it (ms). */
  photonMs: number | null;
  photonMedianMs: number | null;
  /** Frames matched to their chunks by their frame id (LiveKit frame metadata). */
  framesById: number;
  /** Keep-warm repeats told apart by their frame id. */
  repeatsById: number;
}

interface Pending {
  pts: number;
  sent: number | null;
}

interface Learnt {
  pts: number;
  frames: number;
  samples: number;
  consumed: Pending[];
}

export function median(values: readonly number[]): number | null {
  if (values.length === 0) return null;
  const sorted = values.slice().sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? null;
}

export class Figures {
  frames = 0;
  framesThisConnection = 0;
  fps = 0;
  latencyMs: number | null = null;
  latenciesMs: number[] = [];
  photonMs: number | null = null;
  photonsMs: number[] = [];
  framesById = 0;
  repeatsById = 0;
  /** The session's frame rate (from its snapshot): the spacing of the grid generated frames sit on. */
  videoFps: number | null = null;
  private frameTimes: number[] = [];
  private generation: number | null = null;
  private origin: number | null = null;
  private pending: Pending[] = [];
  private reference: number | null = null;
  private learnt: Learnt | null = null;
  private newestId: number | null = null;
  private pendingById: Array<{ id: number; sent: number }> = [];

  /**
   * A chunk status arrived. `sentTime`: when its `applied_seq` was sent from here (null: not by us, or forgotten);
   * `now`: the clock's time now.
   */
  chunk(message: ChunkStatus, previous: ChunkStatus | null, sentTime: number | null, now: number): void {
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
  newConnection(): void {
    this.framesThisConnection = 0;
  }

  /**
   * A frame was presented at `now`. `embedded`: whether its RTP timestamps are the service's (the embedded
   * transport); `generation`: the peer connection it came on; `frameId`: its frame id where the transport carries one.
   */
  presented(now: number, meta: FrameMeta | null, options: { embedded: boolean; generation: number; frameId: number | null }): void {
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
  shown(now: number, count: number): void {
    this.frames += count;
    this.framesThisConnection += count;
    for (let i = 0; i < count; i++) this.frameTimes.push(now);
    this.tick(now);
  }

  /** Forget frames older than a second (call it now and then: the fps figure falls when frames stop). */
  tick(now: number): void {
    while (this.frameTimes.length && (this.frameTimes[0] as number) < now - 1000) this.frameTimes.shift();
    this.fps = this.frameTimes.length;
  }

  stats(): Stats {
    return {
      frames: this.frames,
      framesThisConnection: this.framesThisConnection,
      fps: this.fps,
      latencyMs: this.latencyMs,
      latencyMedianMs: median(this.latenciesMs),
      photonMs: this.photonMs,
      photonMedianMs: median(this.photonsMs),
      framesById: this.framesById,
      repeatsById: this.repeatsById,
    };
  }

  private presentedById(now: number, id: number): void {
    if (this.newestId !== null && id <= this.newestId) {
      this.repeatsById += 1;
      return;
    }
    this.newestId = id;
    this.framesById += 1;
    this.shown(now, 1);
    while (this.pendingById.length && id >= (this.pendingById[0] as { id: number }).id) {
      const next = this.pendingById.shift() as { id: number; sent: number };
      this.photon(now - next.sent);
    }
  }

  private photon(ms: number): void {
    this.photonMs = ms;
    push(this.photonsMs, ms);
  }

  /** How many ticks a frame lies off the grid of generated frames (signed, within half a frame), or null. */
  private gridPhase(meta: FrameMeta | null, embedded: boolean): number | null {
    // LiveKit's sender stamps RTP from its own capture clock: the grid is the service's only on the embedded transport.
    if (!embedded) return null;
    if (!meta || typeof meta.rtpTimestamp !== "number" || this.origin === null || this.reference === null) return null;
    if (this.videoFps === null || !(this.videoFps > 0)) return null;
    const ticks = 90000 / this.videoFps;
    const delta = (meta.rtpTimestamp - ((this.origin + this.reference) >>> 0)) | 0; // signed, modulo 2^32
    return delta - Math.round(Math.round(delta / ticks) * ticks);
  }

  private isRepeat(meta: FrameMeta | null, embedded: boolean): boolean {
    const phase = this.gridPhase(meta, embedded);
    return phase !== null && Math.abs(phase) > GRID_SLACK;
  }

  // Checks the learnt offset against a frame: a frame REPEAT_TICKS before the grid proves that it was learnt from a
  // repeat, and it is learnt again from this frame; a repeat where repeats lie proves it right.
  private checkOrigin(meta: FrameMeta | null, embedded: boolean): void {
    const learnt = this.learnt;
    const phase = this.gridPhase(meta, embedded);
    if (learnt === null || phase === null || !meta || typeof meta.rtpTimestamp !== "number") return;
    if (Math.abs(phase - REPEAT_TICKS) <= GRID_SLACK) {
      this.learnt = null;
    } else if (Math.abs(phase + REPEAT_TICKS) <= GRID_SLACK) {
      this.learnt = null;
      this.origin = (meta.rtpTimestamp - learnt.pts) >>> 0;
      this.frames -= learnt.frames;
      this.framesThisConnection = Math.max(0, this.framesThisConnection - learnt.frames);
      this.frameTimes.splice(Math.max(0, this.frameTimes.length - learnt.frames));
      this.photonsMs.splice(Math.max(0, this.photonsMs.length - learnt.samples));
      this.photonMs = this.photonsMs.length ? (this.photonsMs[this.photonsMs.length - 1] as number) : null;
      this.pending.unshift(...learnt.consumed);
    }
  }

  private matchPts(now: number, meta: FrameMeta | null): void {
    if (!meta || typeof meta.rtpTimestamp !== "number") return;
    const rtp = meta.rtpTimestamp;
    if (this.learnt !== null) this.learnt.frames += 1;
    while (this.pending.length) {
      const next = this.pending[0] as Pending;
      if (this.origin === null) {
        this.origin = (rtp - next.pts) >>> 0;
        this.learnt = { pts: next.pts, frames: 1, samples: 0, consumed: [] }; // what to undo if this was a repeat
      }
      const ahead = (rtp - ((this.origin + next.pts) >>> 0)) | 0; // signed, modulo 2^32
      if (ahead < 0) break;
      this.pending.shift();
      if (this.learnt !== null && this.learnt.consumed.length < PENDING) this.learnt.consumed.push(next);
      if (next.sent === null) continue; // only learnt the offset from it
      this.photon(now - next.sent);
      if (this.learnt !== null) this.learnt.samples += 1;
    }
  }
}

function push(values: number[], value: number): void {
  values.push(value);
  if (values.length > SAMPLES) values.shift();
}
