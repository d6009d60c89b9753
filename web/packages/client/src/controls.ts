// Held keys → control protocol v1 snapshots. A snapshot of the held keys goes out on every change and again every
// RESEND_MS while keys are held (each with a new, larger seq: newest wins on the service). The send time of each seq
// is kept (bounded) so control-to-output latency can be measured from a chunk's `applied_seq`.

import { type Clock, systemClock } from "./clock.js";
import type { ControlKey, ControlStateMessage } from "./types.js";

export const RESEND_MS = 250;
const REMEMBERED_SEQS = 256;

/** The control keys, and the keyboard's names for them (`KeyboardEvent.key`, letters lower-cased). */
export const CONTROL_KEYS: readonly ControlKey[] = ["w", "a", "s", "d", "i", "j", "k", "l"];
export const KEY_MAP: Readonly<Record<string, ControlKey>> = {
  w: "w", a: "a", s: "s", d: "d", i: "i", j: "j", k: "k", l: "l",
  ArrowUp: "w", ArrowDown: "s", ArrowLeft: "j", ArrowRight: "l",
};

/** send(message, reliable) → whether it went out. */
export type SendControl = (message: ControlStateMessage, reliable: boolean) => boolean;

export class Controls {
  readonly held = new Set<ControlKey>();
  /** Sequence numbers belong to the session; the wall clock starts above anything an earlier page load sent. */
  seq: number;
  lastSent: ControlStateMessage | null = null;
  active = false;
  private readonly sentAt = new Map<number, number>();
  private timer: unknown = null;

  constructor(
    private readonly send: SendControl,
    private readonly onChange: () => void = () => {},
    private readonly clock: Clock = systemClock,
  ) {
    this.seq = clock.wall();
  }

  /** Press `key` (a control key or a keyboard name for one); false when it means nothing or the controls are off. */
  hold(key: string): boolean {
    return this.change(key, true);
  }

  release(key: string): boolean {
    return this.change(key, false);
  }

  private change(name: string, down: boolean): boolean {
    const key = KEY_MAP[name] ?? null;
    if (!this.active || key === null) return false;
    if (down === this.held.has(key)) return true; // auto-repeat, or a release never seen pressed
    if (down) this.held.add(key);
    else this.held.delete(key);
    this.snapshot();
    return true;
  }

  releaseAll(): void {
    if (this.held.size === 0) return;
    this.held.clear();
    if (this.active) this.snapshot();
  }

  /** Send the held keys now (also when a connection opens: the service then knows the current state). */
  snapshot(): void {
    const seq = ++this.seq;
    const message: ControlStateMessage = { v: 1, type: "control_state", seq, keys: [...this.held].sort() };
    if (this.send(message, false)) {
      this.sentAt.set(seq, this.clock.now());
      if (this.sentAt.size > REMEMBERED_SEQS) this.sentAt.delete(this.sentAt.keys().next().value as number);
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
  sentTime(seq: number): number | null {
    return this.sentAt.get(seq) ?? null;
  }

  /** Milliseconds since `seq` was sent from here, or null. */
  since(seq: number): number | null {
    const sent = this.sentAt.get(seq);
    return sent === undefined ? null : this.clock.now() - sent;
  }

  start(): void {
    this.active = true;
  }

  stop(): void {
    this.active = false;
    this.held.clear();
    if (this.timer !== null) this.clock.clearInterval(this.timer);
    this.timer = null;
  }
}
