// Keyboard → control protocol v1 snapshots. A snapshot of the held keys goes out on every change and again every
// RESEND_MS while keys are held (each with a new, larger seq: newest wins on the service). The send time of each
// seq is kept (bounded) so the page can measure control-to-output latency from a chunk's `applied_seq`.

const KEYS = {
  w: "w", a: "a", s: "s", d: "d", i: "i", j: "j", k: "k", l: "l",
  ArrowUp: "w", ArrowDown: "s", ArrowLeft: "j", ArrowRight: "l",
};
export const RESEND_MS = 250;
const REMEMBERED_SEQS = 256;

function isEditable(target) {
  return (
    target instanceof HTMLInputElement ||
    target instanceof HTMLTextAreaElement ||
    target instanceof HTMLSelectElement ||
    (target instanceof HTMLElement && target.isContentEditable)
  );
}

export class Controls {
  // send(message, reliable) -> boolean (whether it went out); onChange() after every snapshot.
  constructor(send, onChange) {
    this.send = send;
    this.onChange = onChange;
    this.held = new Set();
    // Sequence numbers belong to the session; Date.now() starts above anything an earlier page load sent.
    this.seq = Date.now();
    this.lastSent = null;
    this.sentAt = new Map();
    this.timer = null;
    this.active = false;
  }

  attach(target = window) {
    target.addEventListener("keydown", (event) => this.onKey(event, true));
    target.addEventListener("keyup", (event) => this.onKey(event, false));
    window.addEventListener("blur", () => this.releaseAll());
  }

  keyOf(event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return null;
    const name = event.key.length === 1 ? event.key.toLowerCase() : event.key;
    return KEYS[name] ?? null;
  }

  onKey(event, down) {
    if (!this.active || isEditable(event.target)) return;
    const key = this.keyOf(event);
    if (key === null) return;
    event.preventDefault();
    if (down === this.held.has(key)) return; // auto-repeat, or a release we never saw pressed
    if (down) this.held.add(key);
    else this.held.delete(key);
    this.snapshot();
  }

  releaseAll() {
    if (this.held.size === 0) return;
    this.held.clear();
    if (this.active) this.snapshot();
  }

  // Send the held keys now (also when a connection opens: the service then knows the current state).
  snapshot() {
    const seq = ++this.seq;
    const message = { v: 1, type: "control_state", seq, keys: [...this.held].sort() };
    if (this.send(message, false)) {
      this.sentAt.set(seq, performance.now());
      if (this.sentAt.size > REMEMBERED_SEQS) this.sentAt.delete(this.sentAt.keys().next().value);
      this.lastSent = message;
    }
    if (this.held.size > 0 && this.timer === null) {
      this.timer = setInterval(() => this.snapshot(), RESEND_MS);
    } else if (this.held.size === 0 && this.timer !== null) {
      clearInterval(this.timer);
      this.timer = null;
    }
    this.onChange();
  }

  // When (performance.now()) `seq` was sent by this page, or null if it was not (or is forgotten).
  sentTime(seq) {
    const sent = this.sentAt.get(seq);
    return sent === undefined ? null : sent;
  }

  // Milliseconds since `seq` was sent by this page, or null if it was not (or is forgotten).
  since(seq) {
    const sent = this.sentAt.get(seq);
    return sent === undefined ? null : performance.now() - sent;
  }

  start() {
    this.active = true;
  }

  stop() {
    this.active = false;
    this.held.clear();
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }
}
