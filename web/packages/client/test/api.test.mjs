// The REST `Api` covers the service's API: every operation of the OpenAPI document (web/openapi/openapi.json) has a
// call, checked by making each call against a fetch that records it and matching the request to the document's paths;
// then each newer call (lists, downloads, usage, client tokens, share revocation) and its typed errors.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Api, ApiError } from "../dist/index.js";
import { fakeFetch, jsonResponse } from "./fakes.mjs";

/** web/openapi/openapi.json, found by walking up (the tests also run from a private copy under web/.build/). */
function openapiDocument() {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const candidate = join(dir, "openapi", "openapi.json");
    if (existsSync(candidate)) return JSON.parse(readFileSync(candidate, "utf8"));
    const parent = dirname(dir);
    assert.notEqual(parent, dir, "web/openapi/openapi.json not found above the tests");
    dir = parent;
  }
}

/** The document's operations: {id, method, pattern} with each `{param}` of the path matching one segment. */
function operationsOf(document) {
  const operations = [];
  for (const [template, methods] of Object.entries(document.paths)) {
    const pattern = new RegExp(`^${template.replace(/\{[^}]+\}/g, "[^/]+")}$`);
    for (const [method, operation] of Object.entries(methods)) {
      operations.push({ id: operation.operationId, method: method.toUpperCase(), pattern });
    }
  }
  return operations;
}

// Operation id → a call of the `Api` that makes it (README and docs/typescript.md list the same).
const API_CALLS = {
  create_session: (api) => api.createSession({}),
  list_sessions: (api) => api.listSessions(),
  get_session: (api) => api.getSession("s1"),
  delete_session: (api) => api.deleteSession("s1"),
  pause_session: (api) => api.pauseSession("s1"),
  resume_session: (api) => api.resumeSession("s1"),
  session_events: (api) => api.events("s1").next(),
  get_recording: (api) => api.recording("s1"),
  get_recording_controls: (api) => api.recordingControls("s1"),
  list_recordings: (api) => api.listRecordings(),
  answer_webrtc_offer: (api) => api.offer("/v1/sessions/s1/webrtc", "v=0"),
  add_viewer: (api) => api.createViewer("s1"),
  answer_watch_offer: (api) => api.offer("/v1/sessions/s1/watch", "v=0", "viewer-token"),
  get_usage: (api) => api.usage(),
  create_client_token: (api) => api.createClientToken(),
  revoke_share: (api) => api.revokeShare("s1", "share-1"),
};
// Operations of the document no client calls, with the reason (the Python client's test excludes the same).
const NOT_FOR_CLIENTS = {
  livekit_webhook: "LiveKit's server calls it, signed with the LiveKit API secret",
  health: "a liveness probe for the orchestrator (Kubernetes), not for clients",
  ready: "a readiness probe for the orchestrator and load balancer; a client learns the same from a create's 503",
  metrics: "Prometheus scrapes it (text exposition), no client",
};

/** A fetch that answers every request 200 with what the call reads, recording (method, path). */
function recordingFetch() {
  const requests = [];
  const fetch = async (url, init = {}) => {
    const { pathname } = new URL(url, "http://service.test");
    requests.push({ method: init.method || "GET", path: pathname });
    if (pathname.endsWith("/events")) return new Response("", { status: 200 }); // a stream that ends at once
    if (pathname === "/v1/recordings") return jsonResponse(200, { recordings: [], next_cursor: null });
    return jsonResponse(200, {});
  };
  return { fetch, requests };
}

/**
 * What is wrong between the calls and the document: operations without a call, listed ids the document lacks, and
 * calls whose request is not their operation's. Empty when the `Api` covers the API.
 */
async function compare(document, calls, excluded) {
  const operations = operationsOf(document);
  const ids = new Set(operations.map((operation) => operation.id));
  const problems = [];
  for (const id of ids) {
    if (!(id in calls) && !(id in excluded)) problems.push(`${id} has no Api call (add one, then API_CALLS)`);
  }
  for (const id of [...Object.keys(calls), ...Object.keys(excluded)]) {
    if (!ids.has(id)) problems.push(`${id} is listed here but the document has no such operation`);
  }
  for (const [id, call] of Object.entries(calls)) {
    const { fetch, requests } = recordingFetch();
    await call(new Api({ fetch, apiKey: "key" }));
    const made = requests.map(({ method, path }) => {
      const operation = operations.find((op) => op.method === method && op.pattern.test(path));
      return operation ? operation.id : `${method} ${path}`;
    });
    if (made.length !== 1 || made[0] !== id) {
      problems.push(`the call listed for ${id} made ${made.join(", ") || "no request"}`);
    }
  }
  return problems;
}

test("every operation of the OpenAPI document has an Api call that makes it", async () => {
  const document = openapiDocument();
  assert.ok(operationsOf(document).length >= 20, "the document has its operations");
  assert.deepEqual(await compare(document, API_CALLS, NOT_FOR_CLIENTS), []);
});

test("the comparison fails when a call is missing or makes another operation's request", async () => {
  const document = openapiDocument();
  const { revoke_share: _removed, ...withoutOne } = API_CALLS;
  assert.deepEqual(await compare(document, withoutOne, NOT_FOR_CLIENTS), [
    "revoke_share has no Api call (add one, then API_CALLS)",
  ]);
  const wrong = { ...API_CALLS, get_usage: (api) => api.listSessions() };
  assert.deepEqual(await compare(document, wrong, NOT_FOR_CLIENTS), [
    "the call listed for get_usage made list_sessions",
  ]);
  const gone = { ...document, paths: { ...document.paths } };
  delete gone.paths["/v1/usage"];
  assert.deepEqual(await compare(gone, API_CALLS, NOT_FOR_CLIENTS), [
    "get_usage is listed here but the document has no such operation",
    "the call listed for get_usage made GET /v1/usage",
  ]);
});

test("the lists: sessions, and recordings page by page with since, cursor and limit", async () => {
  const session = { id: "s1", status: "closed" };
  const { fetch, calls } = fakeFetch({
    "GET /v1/sessions": () => jsonResponse(200, { sessions: [session] }),
    "GET /v1/recordings": (url) => {
      const cursor = new URL(url, "http://service.test").searchParams.get("cursor");
      return cursor === null
        ? jsonResponse(200, { recordings: [{ session_id: "a" }, { session_id: "b" }], next_cursor: "c2" })
        : jsonResponse(200, { recordings: [{ session_id: "c" }], next_cursor: null });
    },
  });
  const api = new Api({ fetch, apiKey: "key", baseUrl: "http://service.test/" });
  assert.deepEqual((await api.listSessions()).body.sessions, [session]);
  assert.equal(calls[0].url, "http://service.test/v1/sessions");
  assert.equal(calls[0].headers.Authorization, "Bearer key");

  const page = await api.listRecordings({ since: new Date(Date.UTC(2026, 11, 1, 18)), limit: 2 });
  assert.equal(page.body.next_cursor, "c2");
  const asked = new URL(calls.at(-1).url).searchParams;
  assert.equal(asked.get("since"), "2026-12-01T18:00:00.000Z");
  assert.equal(asked.get("limit"), "2");
  assert.equal(asked.get("cursor"), null);

  const all = [];
  for await (const item of api.recordings({ since: 1764612000, limit: 2 })) all.push(item.session_id);
  assert.deepEqual(all, ["a", "b", "c"]);
  const last = new URL(calls.at(-1).url).searchParams;
  assert.deepEqual([last.get("since"), last.get("cursor"), last.get("limit")], ["1764612000", "c2", "2"]);
});

test("a recording and its control trace download as a Response: blob, bytes or a stream", async () => {
  const mp4 = new Uint8Array([0, 0, 0, 24, 102, 116, 121, 112]);
  const trace = '{"seq":1,"keys":["w"]}\n{"seq":2,"keys":[]}\n';
  const { fetch, calls } = fakeFetch({
    "GET /v1/sessions/s%201/recording": () => new Response(mp4, { headers: { "Content-Type": "video/mp4" } }),
    "GET /v1/sessions/s%201/recording/controls": () =>
      new Response(trace, { headers: { "Content-Type": "application/x-ndjson" } }),
  });
  const api = new Api({ fetch, token: "sess-token" });
  const recording = await api.recording("s 1");
  assert.equal(recording.headers.get("Content-Type"), "video/mp4");
  const blob = await recording.blob();
  assert.equal(blob.size, mp4.length);
  assert.deepEqual(new Uint8Array(await blob.arrayBuffer()), mp4);
  assert.equal(calls[0].headers.Authorization, "Bearer sess-token");

  const controls = await api.recordingControls("s 1");
  const chunks = [];
  for await (const chunk of controls.body) chunks.push(Buffer.from(chunk));
  const lines = Buffer.concat(chunks).toString("utf8").trim().split("\n").map((line) => JSON.parse(line));
  assert.deepEqual(lines.map((line) => line.seq), [1, 2]);
});

test("a refused download is an ApiError with the service's stable code and Retry-After", async () => {
  const { fetch } = fakeFetch({
    "GET /v1/sessions/s1/recording": () =>
      jsonResponse(
        409,
        { error: { code: "recording_not_ready", message: "the recording is being finished" } },
        { "Retry-After": "2" },
      ),
  });
  const api = new Api({ fetch, apiKey: "key" });
  await assert.rejects(api.recording("s1"), (error) => {
    assert.ok(error instanceof ApiError);
    assert.deepEqual([error.status, error.code, error.message, error.retryAfter], [
      409,
      "recording_not_ready",
      "the recording is being finished",
      "2",
    ]);
    return true;
  });
  // No such route here: the fake's 404 not_found; a body that is not the service's error: http_<status>.
  await assert.rejects(api.recordingControls("s1"), { name: "ApiError", status: 404, code: "not_found" });
  const { fetch: bare } = fakeFetch({ "GET /v1/usage": () => new Response("upstream down", { status: 502 }) });
  await assert.rejects(new Api({ fetch: bare }).usage(), { name: "ApiError", status: 502, code: "http_502" });
});

test("usage since a time, as RFC 3339 or Unix seconds", async () => {
  const body = { key: "k1", since: "2026-12-01T18:00:00Z", sessions: 2, running_seconds: 61.5 };
  const { fetch, calls } = fakeFetch({ "GET /v1/usage": () => jsonResponse(200, body) });
  const api = new Api({ fetch, apiKey: "key" });
  assert.deepEqual((await api.usage()).body, body);
  assert.equal(new URL(calls[0].url, "http://service.test").search, "");
  await api.usage("2026-12-01T18:00:00Z");
  assert.equal(new URL(calls[1].url, "http://service.test").searchParams.get("since"), "2026-12-01T18:00:00Z");
  await api.usage(1764612000);
  assert.equal(new URL(calls[2].url, "http://service.test").searchParams.get("since"), "1764612000");
});

test("a client token is minted with the API key, whatever token the Api holds", async () => {
  const minted = { token: "ct", token_id: "t1", expires_at: 1, max_creates: 2, max_seconds: 60, record: false };
  const { fetch, calls } = fakeFetch({
    "POST /v1/client_tokens": (_url, init) =>
      init.headers.Authorization === "Bearer key"
        ? jsonResponse(201, minted)
        : jsonResponse(403, { error: { code: "forbidden", message: "client tokens are minted with an API key" } }),
  });
  const api = new Api({ fetch, apiKey: "key", token: "sess-token" });
  const answer = await api.createClientToken({ max_creates: 2, max_seconds: 60, origins: ["https://app.test"] });
  assert.equal(answer.status, 201);
  assert.equal(answer.body.token, "ct");
  assert.deepEqual(JSON.parse(calls[0].body), { max_creates: 2, max_seconds: 60, origins: ["https://app.test"] });
  // Without a key (a browser holding only its session token) the service refuses, and the code comes through.
  await assert.rejects(new Api({ fetch, token: "sess-token" }).createClientToken(), {
    name: "ApiError",
    status: 403,
    code: "forbidden",
  });
});

test("a share link is revoked by its id; the event stream's refusal carries its code", async () => {
  const { fetch, calls } = fakeFetch({
    "DELETE /v1/sessions/s1/viewers/share%2F1": () => jsonResponse(200, { share_id: "share/1", revoked: true }),
    "GET /v1/sessions/gone/events": () =>
      jsonResponse(404, { error: { code: "session_not_found", message: "no session gone" } }),
  });
  const api = new Api({ fetch, apiKey: "key" });
  assert.equal((await api.revokeShare("s1", "share/1")).body.revoked, true);
  assert.equal(calls[0].method, "DELETE");
  await assert.rejects(api.events("gone").next(), { name: "ApiError", status: 404, code: "session_not_found" });
});
