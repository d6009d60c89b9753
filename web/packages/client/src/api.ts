// The REST API and the session event stream. The event stream is read with fetch() and a streaming body reader
// rather than EventSource, because EventSource cannot send an Authorization header (API keys, tokens).
//
// The bearer credential is a token when there is one (a client token to create, then the create's session token, or
// a share link's watch token: docs/integrate.md), else the API key. Nothing is stored here: a page that keeps a key
// across reloads does so itself.

import { ApiError } from "./errors.js";
import type {
  ClientToken,
  ClientTokenRequest,
  CreateSessionBody,
  EmbeddedViewer,
  LiveKitViewer,
  RecordingItem,
  RecordingList,
  SessionList,
  SessionSnapshot,
  ShareLink,
  ShareRevoked,
  Usage,
} from "./types.js";

export type FetchLike = (input: string, init?: RequestInit) => Promise<Response>;

/** Resolves to a client token (docs/integrate.md): called once per create. */
export type TokenProvider = () => Promise<string>;

export interface ApiOptions {
  /** Where the service is ("" or omitted: this page's origin). */
  baseUrl?: string;
  apiKey?: string;
  token?: string | null;
  fetch?: FetchLike;
}

/**
 * A token provider that asks the app's own backend (`url`) for a client token: a POST with the page's cookies,
 * answered `{"token": "..."}` (the documented 20-line endpoint, docs/integrate.md).
 */
export function tokenEndpoint(url: string, fetchImpl?: FetchLike): TokenProvider {
  return async () => {
    const doFetch = fetchImpl ?? ((input: string, init?: RequestInit) => fetch(input, init));
    const response = await doFetch(url, {
      method: "POST",
      credentials: "include",
      headers: { Accept: "application/json" },
    });
    const data = (await readJson(response)) as { token?: unknown } | null;
    if (!response.ok || data === null || typeof data.token !== "string") {
      throw new ApiError(response.status, "token_endpoint_failed", `the token endpoint answered ${response.status}`);
    }
    return data.token;
  };
}

async function readJson(response: Response): Promise<unknown> {
  try {
    return await response.json();
  } catch {
    return null;
  }
}

/** The `ApiError` of a refusal: its stable code and message from the service's error body when it has one. */
function refusal(response: Response, data: unknown): ApiError {
  const error = ((data as { error?: { code?: string; message?: string } } | null)?.error ?? {}) as {
    code?: string;
    message?: string;
  };
  return new ApiError(
    response.status,
    error.code || `http_${response.status}`,
    error.message || response.statusText || `HTTP ${response.status}`,
    response.headers.get("Retry-After"),
  );
}

/** `?name=value&...` of the parameters given (none: ""). */
function query(params: Record<string, string | number | null | undefined>): string {
  const given = Object.entries(params).filter(([, value]) => value !== null && value !== undefined);
  if (given.length === 0) return "";
  return `?${new URLSearchParams(given.map(([name, value]) => [name, String(value)])).toString()}`;
}

/** A time for `since`: RFC 3339 with an offset, Unix seconds, or a Date. */
export type Since = string | number | Date;

function sinceParam(since: Since | undefined): string | undefined {
  if (since === undefined) return undefined;
  return since instanceof Date ? since.toISOString() : String(since);
}

const path = (id: string) => `/v1/sessions/${encodeURIComponent(id)}`;

export class Api {
  readonly baseUrl: string;
  key: string;
  /** A client, session or watch token; wins over the key. */
  token: string | null;
  private readonly doFetch: FetchLike;

  constructor(options: ApiOptions = {}) {
    this.baseUrl = (options.baseUrl ?? "").replace(/\/+$/, "");
    this.key = options.apiKey ?? "";
    this.token = options.token ?? null;
    this.doFetch = options.fetch ?? ((input: string, init?: RequestInit) => fetch(input, init));
  }

  /** The credential every request carries: the token if any, else the API key. */
  get credential(): string {
    return this.token || this.key;
  }

  useToken(token: string | null): void {
    this.token = token || null;
  }

  url(path: string): string {
    return /^[a-z]+:\/\//i.test(path) ? path : `${this.baseUrl}${path}`;
  }

  headers(json: boolean, key: string = this.credential): Record<string, string> {
    const headers: Record<string, string> = {};
    if (json) headers["Content-Type"] = "application/json";
    if (key) headers.Authorization = `Bearer ${key}`;
    return headers;
  }

  /** `key`: the bearer credential (the current one unless given: a viewer's offer carries its viewer credential). */
  async request<T = unknown>(
    method: string,
    path: string,
    body?: unknown,
    key: string = this.credential,
  ): Promise<{ status: number; body: T }> {
    const response = await this.doFetch(this.url(path), {
      method,
      headers: this.headers(body !== undefined, key),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = (await readJson(response)) as T;
    if (!response.ok) throw refusal(response, data);
    return { status: response.status, body: data };
  }

  createSession(body: CreateSessionBody): Promise<{ status: number; body: SessionSnapshot }> {
    return this.request("POST", "/v1/sessions", body);
  }

  getSession(id: string): Promise<{ status: number; body: SessionSnapshot }> {
    return this.request("GET", `/v1/sessions/${encodeURIComponent(id)}`);
  }

  deleteSession(id: string, mode: "drain" | "cancel" = "drain"): Promise<{ status: number; body: SessionSnapshot }> {
    return this.request("DELETE", `/v1/sessions/${encodeURIComponent(id)}?mode=${mode}`);
  }

  pauseSession(id: string): Promise<{ status: number; body: SessionSnapshot }> {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/pause`);
  }

  resumeSession(id: string): Promise<{ status: number; body: SessionSnapshot }> {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/resume`);
  }

  /** `GET /v1/sessions`: this credential's live and remembered sessions, oldest first. */
  listSessions(): Promise<{ status: number; body: SessionList }> {
    return this.request("GET", "/v1/sessions");
  }

  /**
   * `GET /v1/recordings`: one page of this key's recordings started at `since` or later (default: every one kept),
   * oldest first; pass the page's `next_cursor` as `cursor` for the next (null on the last page).
   */
  listRecordings(
    options: { since?: Since; cursor?: string | null; limit?: number } = {},
  ): Promise<{ status: number; body: RecordingList }> {
    const params = { since: sinceParam(options.since), cursor: options.cursor, limit: options.limit };
    return this.request("GET", `/v1/recordings${query(params)}`);
  }

  /** Every recording `listRecordings` pages through, one page (`limit` each) per request. */
  async *recordings(options: { since?: Since; limit?: number } = {}): AsyncGenerator<RecordingItem> {
    let cursor: string | null = null;
    do {
      const page: RecordingList = (await this.listRecordings({ ...options, cursor })).body;
      yield* page.recordings;
      cursor = page.next_cursor;
    } while (cursor);
  }

  /**
   * `GET /v1/sessions/{id}/recording`: the ended session's MP4 as the fetch `Response` (its body not yet read:
   * `.blob()` in a page, `.arrayBuffer()`, or `.body`, a stream, to write a file in Node). A recording in an object
   * store answers a redirect to a presigned URL, which fetch follows (a cross-origin redirect drops our
   * Authorization header, as it should). 409 `recording_not_ready` while it is still being finished: retry.
   */
  recording(id: string): Promise<Response> {
    return this.download(`${path(id)}/recording`);
  }

  /** `GET /v1/sessions/{id}/recording/controls`: the recording's control trace (JSON Lines), as `recording` does. */
  recordingControls(id: string): Promise<Response> {
    return this.download(`${path(id)}/recording/controls`);
  }

  /** A GET whose answer is a file: the `Response` when it is one, else the refusal as an `ApiError`. */
  async download(target: string): Promise<Response> {
    const response = await this.doFetch(this.url(target), { method: "GET", headers: this.headers(false) });
    if (!response.ok) throw refusal(response, await readJson(response));
    return response;
  }

  /**
   * `GET /v1/usage`: this key's usage since `since` (counted from the start of its hour; default: the 35 days kept)
   * and its quota.
   */
  usage(since?: Since): Promise<{ status: number; body: Usage }> {
    return this.request("GET", `/v1/usage${query({ since: sinceParam(since) })}`);
  }

  /**
   * `POST /v1/client_tokens`, with the API key whatever token this `Api` holds: for an app's backend (Node) that
   * mints short-lived client tokens for its browsers (docs/integrate.md); a browser never holds the key. 404
   * `tokens_not_configured` without LINGSTREAM_TOKEN_SECRET.
   */
  createClientToken(body: ClientTokenRequest = {}): Promise<{ status: number; body: ClientToken }> {
    return this.request("POST", "/v1/client_tokens", body, this.key);
  }

  /** `DELETE /v1/sessions/{id}/viewers/{share_id}`: the share link's watch token is refused from now on. */
  revokeShare(id: string, shareId: string): Promise<{ status: number; body: ShareRevoked }> {
    return this.request("DELETE", `${path(id)}/viewers/${encodeURIComponent(shareId)}`);
  }

  /** Best effort while a page is being closed: `keepalive` lets the request outlive the page. */
  endOnUnload(id: string): void {
    this.doFetch(this.url(`/v1/sessions/${encodeURIComponent(id)}?mode=cancel`), {
      method: "DELETE",
      headers: this.headers(false),
      keepalive: true,
    }).catch(() => {});
  }

  /**
   * Join details of one more viewer (a place among the session's MAX_VIEWERS): LiveKit, a watch-only token for a new
   * identity; embedded, a viewer credential and the watch URL.
   */
  createViewer(id: string): Promise<{ status: number; body: EmbeddedViewer | LiveKitViewer }> {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/viewers`);
  }

  /** A share link: a watch URL whose watch-only token admits one viewer per use (within MAX_VIEWERS). */
  share(id: string): Promise<{ status: number; body: ShareLink }> {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/viewers`, { share: true });
  }

  /** An SDP offer; a viewer's goes with its viewer credential instead of the current one. */
  offer(
    url: string,
    sdp: string,
    viewerToken: string | null = null,
  ): Promise<{ status: number; body: RTCSessionDescriptionInit }> {
    return this.request("POST", url, { sdp, type: "offer" }, viewerToken === null ? this.credential : viewerToken);
  }

  /** Yields every session snapshot of the event stream until it ends (after the terminal one) or `signal` aborts. */
  async *events(id: string, signal?: AbortSignal): AsyncGenerator<SessionSnapshot> {
    const response = await this.doFetch(this.url(`/v1/sessions/${encodeURIComponent(id)}/events`), {
      headers: this.headers(false),
      signal,
    });
    if (!response.ok) throw refusal(response, await readJson(response));
    if (response.body === null) {
      throw new ApiError(response.status, `http_${response.status}`, "the event stream has no body");
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new EventStreamParser();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        for (const event of parser.push(value)) {
          if (event.event === "session" && event.data) yield JSON.parse(event.data) as SessionSnapshot;
        }
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }
}

/** Server-sent events, as blocks of `event:` and `data:` lines ended by a blank line. */
export class EventStreamParser {
  private buffer = "";

  push(text: string): Array<{ event: string; data: string }> {
    this.buffer += text.replace(/\r\n/g, "\n");
    const events: Array<{ event: string; data: string }> = [];
    let cut: number;
    while ((cut = this.buffer.indexOf("\n\n")) >= 0) {
      const block = this.buffer.slice(0, cut);
      this.buffer = this.buffer.slice(cut + 2);
      let event = "message";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trimStart();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      events.push({ event, data: data.join("\n") });
    }
    return events;
  }
}
