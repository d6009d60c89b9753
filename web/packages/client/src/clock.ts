// Time as the client reads it: injectable, so the deterministic parts (control seqs and their resends, the
// control → photon figures) are tested without waiting.

export interface Clock {
  /** Milliseconds on a monotonic clock (performance.now()). */
  now(): number;
  /** Milliseconds since the epoch (Date.now()): seqs start above anything an earlier page load sent. */
  wall(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  setInterval(fn: () => void, ms: number): unknown;
  clearInterval(handle: unknown): void;
}

export const systemClock: Clock = {
  now: () => performance.now(),
  wall: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
  setInterval: (fn, ms) => setInterval(fn, ms),
  clearInterval: (handle) => clearInterval(handle as ReturnType<typeof setInterval>),
};
