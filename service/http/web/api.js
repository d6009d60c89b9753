// The REST API and the session event stream. The event stream is read with fetch() and a streaming body reader
// rather than EventSource, because EventSource cannot send an Authorization header (API keys).
//
// The bearer credential is a token when the page has one (a client token to create, then the create's session
// token, or a share link's watch token: docs/integrate.md), else the API key the user typed (kept in
// sessionStorage). Tokens are never stored: a reload asks the app's token endpoint again.

export class ApiError extends Error {
  constructor(status, code, message, retryAfter) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

const KEY_STORAGE = "lingstream.apiKey";

export class Api {
  constructor() {
    this.key = sessionStorage.getItem(KEY_STORAGE) || "";
    this.token = null; // a client, session or watch token; wins over the key
  }

  // The credential every request carries: the token if any, else the API key.
  get credential() {
    return this.token || this.key;
  }

  useToken(token) {
    this.token = token || null;
  }

  // A client token from the app's own backend (LINGSTREAM_PAGE_TOKEN_URL): a POST with the page's cookies, answered
  // `{"token": "..."}` (the documented 20-line endpoint, docs/integrate.md).
  async fetchClientToken(url) {
    const response = await fetch(url, { method: "POST", credentials: "include", headers: { Accept: "application/json" } });
    let data = null;
    try {
      data = await response.json();
    } catch {
      data = null;
    }
    if (!response.ok || !data || typeof data.token !== "string") {
      throw new ApiError(response.status, "token_endpoint_failed", `the token endpoint answered ${response.status}`);
    }
    return data.token;
  }

  setKey(key) {
    this.key = key.trim();
    if (this.key) sessionStorage.setItem(KEY_STORAGE, this.key);
    else sessionStorage.removeItem(KEY_STORAGE);
  }

  headers(json, key = this.credential) {
    const headers = {};
    if (json) headers["Content-Type"] = "application/json";
    if (key) headers.Authorization = `Bearer ${key}`;
    return headers;
  }

  // `key`: the bearer credential (the API key unless given: a viewer's offer carries its viewer credential).
  async request(method, path, body, key = this.credential) {
    const response = await fetch(path, {
      method,
      headers: this.headers(body !== undefined, key),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try {
      data = await response.json();
    } catch {
      data = null;
    }
    if (!response.ok) {
      const error = (data && data.error) || {};
      throw new ApiError(
        response.status,
        error.code || `http_${response.status}`,
        error.message || response.statusText,
        response.headers.get("Retry-After"),
      );
    }
    return { status: response.status, body: data };
  }

  createSession(body) {
    return this.request("POST", "/v1/sessions", body);
  }

  getSession(id) {
    return this.request("GET", `/v1/sessions/${encodeURIComponent(id)}`);
  }

  deleteSession(id, mode = "drain") {
    return this.request("DELETE", `/v1/sessions/${encodeURIComponent(id)}?mode=${mode}`);
  }

  // Best effort while the page is being closed: `keepalive` lets the request outlive the page.
  endOnUnload(id) {
    fetch(`/v1/sessions/${encodeURIComponent(id)}?mode=cancel`, {
      method: "DELETE",
      headers: this.headers(false),
      keepalive: true,
    }).catch(() => {});
  }

  // Join details of one more viewer (a place among the session's MAX_VIEWERS): LiveKit, a watch-only token for a
  // new identity; embedded, a viewer credential and the watch URL.
  createViewer(id) {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/viewers`);
  }

  // A share link: a watch URL whose watch-only token admits one viewer per use (within MAX_VIEWERS).
  share(id) {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(id)}/viewers`, { share: true });
  }

  // An SDP offer; a viewer's goes with its viewer credential instead of the API key.
  offer(url, sdp, viewerToken = null) {
    return this.request("POST", url, { sdp, type: "offer" }, viewerToken === null ? this.credential : viewerToken);
  }

  // Yields every session snapshot of the event stream until it ends (after the terminal one) or `signal` aborts.
  async *events(id, signal) {
    const response = await fetch(`/v1/sessions/${encodeURIComponent(id)}/events`, {
      headers: this.headers(false),
      signal,
    });
    if (!response.ok) throw new ApiError(response.status, `http_${response.status}`, "the event stream failed");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let event = "message";
          let data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) event = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (event === "session" && data) yield JSON.parse(data);
        }
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }
}
