// The REST API and the session event stream. The event stream is read with fetch() and a streaming body reader
// rather than EventSource, because EventSource cannot send an Authorization header (API keys, tokens).
//
// The bearer credential is a token when there is one (a client token to create, then the create's session token, or
// a share link's watch token: docs/integrate.md), else the API key. Nothing is stored here: a page that keeps a key
// across reloads does so itself.

import { ApiError } from "./errors.js";
import type { CreateSessionBody, EmbeddedViewer, LiveKitViewer, SessionSnapshot, ShareLink } from "./types.js";

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
    if (!response.ok) {
      const error = ((data as { error?: { code?: string; message?: string } } | null)?.error ?? {}) as {
        code?: string;
        message?: string;
      };
      throw new ApiError(
        response.status,
        error.code || `http_${response.status}`,
        error.message || response.statusText || `HTTP ${response.status}`,
        response.headers.get("Retry-After"),
      );
    }
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
  offer(url: string, sdp: string, viewerToken: string | null = null): Promise<{ status: number; body: RTCSessionDescriptionInit }> {
    return this.request("POST", url, { sdp, type: "offer" }, viewerToken === null ? this.credential : viewerToken);
  }

  /** Yields every session snapshot of the event stream until it ends (after the terminal one) or `signal` aborts. */
  async *events(id: string, signal?: AbortSignal): AsyncGenerator<SessionSnapshot> {
    const response = await this.doFetch(this.url(`/v1/sessions/${encodeURIComponent(id)}/events`), {
      headers: this.headers(false),
      signal,
    });
    if (!response.ok || response.body === null) {
      throw new ApiError(response.status, `http_${response.status}`, "the event stream failed");
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
