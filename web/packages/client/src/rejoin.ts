// Deciding how the embedded link finds its way back after losing its peer connection, apart from doing it: a pure
// core (no timers, no fetch; the time is passed in) that `EmbeddedLink` asks what to do next.
//
// A peer connection dies for a network blip or because the replica that ran the session died (issue #33,
// docs/continuity.md): another replica adopts the session from its checkpoint under the same id, and the client joins
// again through the service with the same session id and credential (any replica routes it). The client cannot tell
// the two apart, so both take one path: ask the service for the session (`GET /v1/sessions/{id}`), offer a new peer
// connection while it is not over, and back off between tries. Until the service has adopted the session the offer
// is refused (409: the registry still names the dead replica, or the session is not attached to a transport yet) or
// the service is unreachable (the front door has not noticed yet): both are tried again. The outage ends when the new
// link's control path opens; it gives up when the session is over (the service says why: `replica_lost`,
// `time_limit`, ...), when the service refuses the session outright (404, 401, 403: its stable code), or when the
// budget runs out (`connection_lost`).
//
//   CONNECTED ──lost──► PROBING ──session not over──► OFFERING ──opened──► CONNECTED
//                         ▲  │                          │
//                         │  └──over / refused / budget─┼──► ENDED
//                         └──────refused, unreachable, no open within OPEN_TIMEOUT_MS (after a backoff)

import { TERMINAL_STATES } from "./types.js";

/**
 * How long an outage may last before the client gives up: the service's default REPLICA_TTL (10 s: when a dead
 * replica is noticed) plus its adoption wait (30 s: how long an orphan waits for a replica with room, after which the
 * service fails it `replica_lost` and the client hears so) plus the adopter's rebuild and a new peer connection.
 */
export const REJOIN_BUDGET_MS = 60_000;
/** The waits before the 1st, 2nd, ... probe of an outage; the last repeats. */
export const REJOIN_BACKOFF_MS: readonly number[] = [0, 500, 1000, 2000, 3000];
/** How long an answered offer may take to open its control path before it counts as lost too. */
export const OPEN_TIMEOUT_MS = 10_000;

/** The phases of the link, as the table above draws them. */
export type RejoinPhase = "connected" | "probing" | "offering" | "ended";

/** What the service said when asked. */
export type RejoinAnswer =
  /** `GET /v1/sessions/{id}` answered: the session's state and, when over, why. */
  | { kind: "session"; status: string; reason?: string | null }
  /** A request (the GET or the offer) was refused with this HTTP status and stable code. */
  | { kind: "refused"; status: number; code: string; message: string }
  /** A request did not reach the service (or its answer did not come back). */
  | { kind: "unreachable"; message: string };

/** What the link does next. */
export type RejoinStep =
  /** Ask the service for the session after `afterMs`. */
  | { action: "probe"; afterMs: number }
  /** Offer a new peer connection now; count it lost unless it opens within `openWithinMs`. */
  | { action: "offer"; openWithinMs: number }
  /** The session is over on the service: let its snapshot end it (the `done` reason is the service's). */
  | { action: "over" }
  /** Give up: the session cannot be rejoined (`code`: the service's refusal or `connection_lost`). */
  | { action: "give_up"; code: string; message: string }
  /** Nothing to do (no outage, or one already being handled). */
  | { action: "none" };

/** Refusals that no retry can change: the session is gone, or this credential may not reach it. */
const FINAL_REFUSALS: ReadonlySet<number> = new Set([401, 403, 404]);

export class Rejoin {
  phase: RejoinPhase = "probing";
  /** Outages so far, and tries in the current one (probes). */
  outages = 0;
  tries = 0;
  private since: number;

  /** A link that has never connected starts in an outage at `now`: its first connection takes the same path. */
  constructor(
    now: number,
    readonly budgetMs: number = REJOIN_BUDGET_MS,
    readonly backoffMs: readonly number[] = REJOIN_BACKOFF_MS,
  ) {
    this.since = now;
  }

  /** How long the current outage has lasted (0 when connected). */
  outageMs(now: number): number {
    return this.phase === "connected" || this.phase === "ended" ? 0 : now - this.since;
  }

  /** The first connection: offer at once (the session streams: that is why it is joined). */
  start(): RejoinStep {
    this.phase = "offering";
    return { action: "offer", openWithinMs: OPEN_TIMEOUT_MS };
  }

  /** The control path opened: the outage (if any) is over. */
  opened(): void {
    if (this.phase === "ended") return;
    this.phase = "connected";
    this.tries = 0;
  }

  /**
   * The peer connection failed, its data channel closed, or an offer did not open in time. From CONNECTED this
   * starts an outage (probe at once); while OFFERING it is one more failed try (probe after the backoff); while
   * PROBING nothing changes (a probe is already due).
   */
  lost(now: number): RejoinStep {
    if (this.phase === "ended" || this.phase === "probing") return { action: "none" };
    if (this.phase === "connected") {
      this.outages += 1;
      this.since = now;
    }
    return this.probeLater(now);
  }

  /** The service's answer to a probe or an offer. */
  answered(now: number, answer: RejoinAnswer): RejoinStep {
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
    return this.probeLater(now); // 409 (not attached yet, on another replica), 429, 5xx, unreachable: again
  }

  /** The caller lets go (the session ends or closes): nothing more is asked. */
  end(): void {
    this.phase = "ended";
  }

  private probeLater(now: number): RejoinStep {
    const left = this.since + this.budgetMs - now;
    if (left <= 0) {
      this.phase = "ended";
      return {
        action: "give_up",
        code: "connection_lost",
        message: `not reconnected within ${Math.round(this.budgetMs / 1000)} s`,
      };
    }
    const wait = this.backoffMs[Math.min(this.tries, this.backoffMs.length - 1)] ?? 0;
    this.tries += 1;
    this.phase = "probing";
    return { action: "probe", afterMs: Math.min(wait, left) };
  }
}
