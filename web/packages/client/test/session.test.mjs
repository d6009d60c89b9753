// The Session against fakes at its seams (fetch, livekit-client, the clock): queue → state → join → statuses →
// commands → the end, and the rules that a user's code cannot break it and close() is bounded.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ApiError, CLOSE_MS, createSession, tokenEndpoint } from "../dist/index.js";
import { EventStream, fakeFetch, fakeLiveKit, fastClock, jsonResponse, nextEvent, opened, snapshot } from "./fakes.mjs";

function service({ stream = new EventStream(), status = "running" } = {}) {
  return fakeFetch({
    "POST /v1/sessions": () => jsonResponse(201, snapshot("queued", { queue_position: 2, session_token: "sess-token" })),
    "GET /v1/sessions/s1": () => jsonResponse(200, snapshot(status)),
    "GET /v1/sessions/s1/events": () => new Response(stream.body, { status: 200 }),
    "DELETE /v1/sessions/s1": () => jsonResponse(200, snapshot("closed", { reason: "client_stop" })),
  });
}

const quiet = { warn() {}, error() {} };

test("a session follows its queue, joins once it runs, and reports chunks and the done reason", async () => {
  const stream = new EventStream();
  const { fetch, calls } = service({ stream });
  const livekit = fakeLiveKit();
  const session = await createSession({
    fetch,
    tokenProvider: async () => "client-token",
    livekitClient: livekit.load,
    clock: fastClock(),
    logger: quiet,
    config: { width: 128, height: 96 },
  });
  // The create carried the client token; everything after it the session token.
  assert.equal(calls[0].headers.Authorization, "Bearer client-token");
  assert.deepEqual(JSON.parse(calls[0].body), { config: { width: 128, height: 96 } });
  assert.equal(session.credential, "session_token");
  assert.equal(session.state, "queued");
  assert.equal(session.queuePosition, 2);

  const queue = [];
  const states = [];
  session.on("queue", ({ position }) => queue.push(position));
  session.on("state", ({ state }) => states.push(state));
  session.join(null);
  stream.push(snapshot("queued", { queue_position: 1 }));
  const open = opened(session);
  stream.push(snapshot("running"));
  await open;
  assert.deepEqual(queue, [1, null]);
  assert.ok(states.includes("running"));
  assert.equal(session.transport, "livekit");
  assert.equal(calls.at(-1).headers.Authorization, "Bearer sess-token");

  const room = livekit.rooms[0];
  assert.equal(room.token, "join-token");
  // On open the held keys go out at once (none yet), then each change, lossy on the control topic.
  assert.equal(room.published[0].message.type, "control_state");
  assert.equal(room.published[0].reliable, false);
  assert.ok(session.keys.hold("w"));
  assert.deepEqual(room.published.at(-1).message.keys, ["w"]);
  assert.equal(session.keys.hold("q"), false, "q is no control key");

  const chunk = nextEvent(session, "chunk");
  const seq = room.published.at(-1).message.seq;
  room.deliver({ v: 1, type: "chunk", index: 0, applied_seq: seq, keys: ["w"], first_frame_id: 10 });
  assert.equal((await chunk).index, 0);
  assert.ok(session.stats.latencyMs >= 0, "control → status measured from the applied seq's send time");
  room.deliver({ v: 1, type: "chunk", index: 1, applied_seq: seq, keys: ["w"] }, "someone-else");
  assert.equal(session.chunks.length, 1, "statuses come from the service participant only");

  const done = nextEvent(session, "done");
  room.deliver({ v: 1, type: "done", reason: "client_stop" });
  stream.push(snapshot("closed", { reason: "client_stop" }));
  assert.deepEqual(await done, { reason: "client_stop", state: "closed" });
  assert.ok(session.ended);
  assert.equal(room.disconnects, 1, "the link is let go once the session is over");
  await session.close();
});

test("a listener that throws is logged once and the session goes on", async () => {
  const stream = new EventStream();
  const { fetch } = service({ stream });
  const livekit = fakeLiveKit();
  const logged = [];
  const logger = { warn() {}, error: (...args) => logged.push(args) };
  const session = await createSession({ fetch, apiKey: "key", livekitClient: livekit.load, clock: fastClock(), logger });
  session.on("chunk", () => {
    throw new TypeError("a bug in the app");
  });
  const seen = [];
  session.on("chunk", (message) => seen.push(message.index));
  const open = opened(session);
  session.join(null);
  stream.push(snapshot("running"));
  await open;
  const room = livekit.rooms[0];
  for (const index of [0, 1, 2]) room.deliver({ v: 1, type: "chunk", index, applied_seq: 1, keys: [] });
  assert.deepEqual(seen, [0, 1, 2], "the other listener heard every chunk");
  assert.equal(session.chunks.length, 3);
  assert.equal(session.listenerErrors, 3);
  assert.equal(logged.length, 1, "logged once");
  assert.match(String(logged[0][0]), /'chunk' listener threw/);
  const state = nextEvent(session, "warning");
  room.deliver({ v: 1, type: "warning", code: "time_limit", message: "ends in 30 s", ends_in_s: 30 });
  assert.equal((await state).code, "time_limit", "the link still carries statuses");
  await session.close();
});

test("close() returns within its bound when the link never finishes closing", async () => {
  const stream = new EventStream();
  const { fetch } = service({ stream });
  const livekit = fakeLiveKit({ hangOnDisconnect: true });
  const session = await createSession({ fetch, apiKey: "key", livekitClient: livekit.load, clock: fastClock(50), logger: quiet });
  const open = opened(session);
  session.join(null);
  stream.push(snapshot("running"));
  await open;
  const started = performance.now();
  await session.close();
  const took = performance.now() - started;
  assert.equal(livekit.rooms[0].disconnects, 1);
  assert.ok(took < CLOSE_MS, `close() took ${took} ms with a disconnect that never ends (bound ${CLOSE_MS} ms / 50)`);
  await session.close(); // twice is fine
});

test("commands on LiveKit are calls answered with the state; a refusal is an error event with its code", async () => {
  const stream = new EventStream();
  const { fetch } = service({ stream });
  const livekit = fakeLiveKit();
  const session = await createSession({ fetch, apiKey: "key", livekitClient: livekit.load, clock: fastClock(), logger: quiet });
  const open = opened(session);
  session.join(null);
  stream.push(snapshot("running"));
  await open;
  assert.equal(await session.pause(), "answered");
  assert.equal(session.state, "paused");
  const refused = nextEvent(session, "error");
  assert.equal(await session.resetPose(), false);
  assert.deepEqual(await refused, { v: 1, type: "error", code: "not_allowed", message: "refused" });
  assert.deepEqual(
    livekit.rooms[0].calls.map((call) => call.method),
    ["lingstream.pause", "lingstream.reset_pose"],
  );
  await assert.rejects(session.prompt("x".repeat(513)), RangeError);
  await session.close();
});

test("a refused create is an ApiError with the service's code and Retry-After", async () => {
  const { fetch } = fakeFetch({
    "POST /v1/sessions": () =>
      jsonResponse(429, { error: { code: "queue_full", message: "every slot is taken" } }, { "Retry-After": "7" }),
  });
  const error = await createSession({ fetch, apiKey: "key" }).catch((caught) => caught);
  assert.ok(error instanceof ApiError);
  assert.equal(error.status, 429);
  assert.equal(error.code, "queue_full");
  assert.equal(error.retryAfter, "7");
});

test("a token endpoint that does not answer a token fails with token_endpoint_failed", async () => {
  const { fetch: good } = fakeFetch({ "POST /app/token": () => jsonResponse(200, { token: "t1" }) });
  assert.equal(await tokenEndpoint("/app/token", good)(), "t1");
  const { fetch: bad } = fakeFetch({ "POST /app/token": () => jsonResponse(403, { detail: "log in first" }) });
  await assert.rejects(tokenEndpoint("/app/token", bad)(), (error) => error.code === "token_endpoint_failed");
});
