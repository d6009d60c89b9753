// The shapes this client reads from the REST API and the control protocol: the types generated from the OpenAPI
// document (web/openapi/lingstream.d.ts, copied into ./openapi.gen.ts at build time by web/scripts/openapi-types.mjs),
// so a change to the API that the SDK does not follow fails its type-check. Only what the service's schema cannot say
// is added here: a LiveKit state read from the service participant's attributes is marked `from`.

import type { components } from "./openapi.gen.js";

type Schemas = components["schemas"];

/** A session's lifecycle state, as the REST API and the `state` status name it. */
export type SessionState = Schemas["SessionBody"]["status"];

export const TERMINAL_STATES: ReadonlySet<string> = new Set(["closed", "expired", "failed", "cancelled"]);
export const STREAMING_STATES: ReadonlySet<string> = new Set(["running", "paused", "recovering", "draining"]);

export type EmbeddedJoin = Schemas["EmbeddedJoin"];
export type LiveKitJoin = Schemas["LiveKitJoin"];
export type EmbeddedViewer = Schemas["EmbeddedViewer"];
export type LiveKitViewer = Schemas["LiveKitViewer"];
/** Join details: the controller's (in the session) or a viewer's (`POST /v1/sessions/{id}/viewers`). */
export type JoinDetails = EmbeddedJoin | LiveKitJoin | EmbeddedViewer | LiveKitViewer;

/** A session as `GET /v1/sessions/{id}` and the event stream describe it (the create's adds its session token). */
export type SessionSnapshot = Schemas["SessionBody"] & {
  session_token?: string | null;
  session_token_expires_at?: number | null;
};

/** What `POST /v1/sessions` takes (every field has a default). */
export type CreateSessionBody = Partial<Schemas["CreateSessionRequest"]>;

/** The answer to `POST /v1/sessions/{id}/viewers` with `{"share": true}`. */
export type ShareLink = Schemas["ShareLink"];
/** The answer to `DELETE /v1/sessions/{id}/viewers/{share_id}`. */
export type ShareRevoked = Schemas["ShareRevokedBody"];

/** `GET /v1/sessions`: the key's live and remembered sessions. */
export type SessionList = Schemas["SessionList"];
/** `GET /v1/recordings`: one page of the key's recordings (`next_cursor` for the next). */
export type RecordingList = Schemas["RecordingList"];
export type RecordingItem = Schemas["RecordingItem"];
/** `GET /v1/usage`: the key's usage and quota. */
export type Usage = Schemas["UsageBody"];
/** What `POST /v1/client_tokens` takes (every field has a default) and answers. */
export type ClientTokenRequest = Partial<Schemas["ClientTokenRequest"]>;
export type ClientToken = Schemas["ClientTokenBody"];

export type ControlKey = "w" | "a" | "s" | "d" | "i" | "j" | "k" | "l";

// -- control protocol v1, service → client ------------------------------------------------------------------------

export type StateStatus = Schemas["StateMessage"] & {
  /** Set by this client when the state was read from the LiveKit service participant's attributes. */
  from?: string;
};
export type ChunkStatus = Schemas["ChunkMessage"];
export type WarningStatus = Schemas["WarningMessage"];
export type ErrorStatus = Schemas["ErrorMessage"];
export type DoneStatus = Schemas["DoneMessage"];
export type StatusMessage = StateStatus | ChunkStatus | WarningStatus | ErrorStatus | DoneStatus;

// -- control protocol v1, client → service ------------------------------------------------------------------------

export type ControlStateMessage = Schemas["ControlStateMessage"];
export type PromptMessage = Schemas["PromptMessage"];
export type ControlMessage = Schemas["ControlMessage"];
