// @lingstream/client: run a lingstream world in a web page (docs/client.md, "TypeScript").

export { Api, EventStreamParser, tokenEndpoint } from "./api.js";
export type { ApiOptions, FetchLike, Since, TokenProvider } from "./api.js";
export { systemClock } from "./clock.js";
export type { Clock } from "./clock.js";
export { CONTROL_KEYS, Controls, KEY_MAP, RESEND_MS } from "./controls.js";
export { EmbeddedLink } from "./embedded.js";
export type { EmbeddedOptions } from "./embedded.js";
export { Emitter } from "./emitter.js";
export type { Logger } from "./emitter.js";
export { ApiError, LingstreamError } from "./errors.js";
export { Figures, REPEAT_TICKS, median } from "./figures.js";
export type { FrameMeta, Stats } from "./figures.js";
export { gamepadController, gamepadKeys, keyboardController } from "./input.js";
export type { InputController } from "./input.js";
export type { CommandAnswer, Link, LinkHandlers } from "./link.js";
export { LiveKitLink } from "./livekit.js";
export { OPEN_TIMEOUT_MS, REJOIN_BACKOFF_MS, REJOIN_BUDGET_MS, Rejoin } from "./rejoin.js";
export type { RejoinAnswer, RejoinPhase, RejoinStep } from "./rejoin.js";
export type { LiveKitModule } from "./livekit.js";
export { CLOSE_MS, MAX_PROMPT_BYTES, Session, createSession, utf8Bytes, watchSession } from "./session.js";
export type {
  CallRecord,
  ChunkRecord,
  CommandOutcome,
  CreateOptions,
  Credential,
  Role,
  SessionEvents,
  SessionOptions,
  WatchOptions,
} from "./session.js";
export * from "./types.js";
export { VERSION } from "./version.js";
