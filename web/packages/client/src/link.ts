// What a session asks of a transport link (embedded WebRTC or LiveKit): connect, send control, close; and what a link
// tells the session through its handlers.

import type { SessionSnapshot, StatusMessage } from "./types.js";

export interface LinkHandlers {
  /** The control path opened (again): the session sends its held keys. */
  onOpen(): void;
  onStatus(message: StatusMessage): void;
  onStream(stream: MediaStream, receiver: RTCRtpReceiver | null): void;
  /** A line on the connection's state, for people. */
  onState(text: string): void;
  /** The link cannot be restored: `code` is the service's refusal (`session_not_found`, ...) or `connection_lost`. */
  onFatal(error: Error, code?: string): void;
  /** The link lost its connection while the session may go on: it is reconnecting (embedded: `Rejoin`). */
  onLost?(why: string): void;
  /** The session as the service described it while the link reconnected (at the reopen, or when it is over). */
  onSnapshot?(snapshot: SessionSnapshot): void;
}

/** A refusal of a discrete command by the service (LiveKit RPC): its stable code and message. */
export interface CommandAnswer {
  v?: number;
  ok?: boolean;
  state?: string;
  applied?: unknown;
}

export interface Link {
  readonly kind: "embedded" | "livekit";
  /** The peer connection's generation (embedded: each rebind is a new one). */
  readonly generation: number;
  readonly pc: RTCPeerConnection | null;
  connect(): Promise<void>;
  send(message: unknown, reliable: boolean): boolean;
  /** A discrete command as a call answered with the session's state (LiveKit), or null when it went as a packet. */
  command?(message: { type: string }): Promise<CommandAnswer | null>;
  /** The frame id of a presented frame, where the transport carries one. */
  frameId?(meta: { rtpTimestamp?: number } | null): number | null;
  /** Closes the link; resolves within the caller's bound or when done. */
  close(): Promise<void>;
}
