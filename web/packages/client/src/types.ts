// The shapes this client reads from the REST API and the control protocol (docs/api.md, docs/control-protocol.md).
// Only the fields the client uses are named; the service may send more. When the types generated from the OpenAPI
// document land in web/openapi/, the REST shapes here are to be taken from there.

/** A session's lifecycle state, as the REST API and the `state` status name it. */
export type SessionState =
  | "queued"
  | "admitted"
  | "running"
  | "paused"
  | "recovering"
  | "draining"
  | "closed"
  | "expired"
  | "failed"
  | "cancelled";

export const TERMINAL_STATES: ReadonlySet<string> = new Set(["closed", "expired", "failed", "cancelled"]);
export const STREAMING_STATES: ReadonlySet<string> = new Set(["running", "paused", "recovering", "draining"]);

/** Join details on the embedded transport (direct WebRTC with the service). */
export interface EmbeddedJoin {
  kind: "embedded";
  offer_url: string;
  data_channel?: string;
  /** A viewer's credential for its offer (viewers only). */
  viewer_token?: string;
  [extra: string]: unknown;
}

/** Join details on LiveKit: the room, this participant's token and the service participant. */
export interface LiveKitJoin {
  kind: "livekit";
  url: string;
  room: string;
  token: string;
  identity: string;
  service_identity: string;
  control_topic: string;
  status_topic: string;
  [extra: string]: unknown;
}

export type JoinDetails = EmbeddedJoin | LiveKitJoin;

/** A session as `GET /v1/sessions/{id}` and the event stream describe it. */
export interface SessionSnapshot {
  id: string;
  status: string;
  queue_position: number | null;
  transport?: JoinDetails | null;
  video?: { width?: number; height?: number; fps?: number } | null;
  reason?: string | null;
  error?: { code: string; message: string } | null;
  session_token?: string | null;
  [extra: string]: unknown;
}

/** What `POST /v1/sessions` takes (docs/api.md). */
export interface CreateSessionBody {
  config?: { width?: number; height?: number; fps?: number; seed?: number; hud?: boolean; [extra: string]: unknown };
  prompt?: string;
  /** A reference image, base64 (PNG, JPEG or WebP). */
  image?: string;
  [extra: string]: unknown;
}

/** The answer to `POST /v1/sessions/{id}/viewers`. */
export interface ViewerAnswer {
  watch_url?: string;
  [extra: string]: unknown;
}

export type ControlKey = "w" | "a" | "s" | "d" | "i" | "j" | "k" | "l";

// -- control protocol v1, service → client ------------------------------------------------------------------------

export interface StateStatus {
  v: 1;
  type: "state";
  state: string;
  detail?: string | null;
  /** Set by this client when the state was read from the LiveKit service participant's attributes. */
  from?: string;
}

export interface ChunkStatus {
  v: 1;
  type: "chunk";
  index: number;
  applied_seq: number;
  keys: string[];
  prompt?: string;
  prompt_seq?: number;
  /** The 90 kHz presentation timestamp of the chunk's first frame (embedded transport). */
  first_frame_pts?: number;
  /** The service's frame id of the chunk's first frame (LiveKit frame metadata). */
  first_frame_id?: number;
  timings?: Record<string, number>;
  [extra: string]: unknown;
}

export interface WarningStatus {
  v: 1;
  type: "warning";
  code: string;
  message: string;
  ends_in_s: number;
}

export interface ErrorStatus {
  v: 1;
  type: "error";
  code: string;
  message: string;
}

export interface DoneStatus {
  v: 1;
  type: "done";
  reason: string;
}

export type StatusMessage = StateStatus | ChunkStatus | WarningStatus | ErrorStatus | DoneStatus;

// -- control protocol v1, client → service ------------------------------------------------------------------------

export interface ControlStateMessage {
  v: 1;
  type: "control_state";
  seq: number;
  keys: string[];
}

export interface PromptMessage {
  v: 1;
  type: "prompt";
  seq: number;
  text: string;
}

export interface CommandMessage {
  v: 1;
  type: "pause" | "resume" | "reset_pose" | "stop";
}

export type ControlMessage = ControlStateMessage | PromptMessage | CommandMessage;
