// Rejoining after a lost connection (the embedded transport, issue #33): the pure core `Rejoin`, stepped with the
// time passed in, then the whole path through a Session over a scripted RTCPeerConnection: the replica that ran the
// session dies, the link asks the service and offers again, the session says `recovering` then goes on.
import assert from "node:assert/strict";
import { test } from "node:test";

import { OPEN_TIMEOUT_MS, REJOIN_BACKOFF_MS, REJOIN_BUDGET_MS, Rejoin, createSession } from "../dist/index.js";
import { EventStream, ManualClock, fakeFetch, jsonResponse, nextEvent } from "./fakes.mjs";

const running = { kind: "session", status: "running" };
const unreachable = { kind: "unreachable", message: "fetch failed" };
const elsewhere = { kind: "refused", status: 409, code: "session_on_other_replica", message: "runs on r1" };

test("an outage probes at once, backs off while the offer cannot be taken, and ends when the link opens", () => {
  const rejoin = new Rejoin(0);
  assert.deepEqual(rejoin.start(), { action: "offer", openWithinMs: OPEN_TIMEOUT_MS });
  rejoin.opened();
  assert.equal(rejoin.phase, "connected");
  assert.equal(rejoin.outages, 0, "the first connection is no outage");

  assert.deepEqual(rejoin.lost(1000), { action: "probe", afterMs: 0 });
  assert.equal(rejoin.outages, 1);
  assert.deepEqual(rejoin.lost(1001), { action: "none" }, "a second signal of the same loss changes nothing");
  // The front door has not noticed yet, then the registry still names the dead replica, then it is an orphan.
  assert.deepEqual(rejoin.answered(1100, unreachable), { action: "probe", afterMs: REJOIN_BACKOFF_MS[1] });
  assert.deepEqual(rejoin.answered(1700, { kind: "session", status: "running" }), {
    action: "offer",
    openWithinMs: OPEN_TIMEOUT_MS,
  });
  assert.deepEqual(rejoin.answered(1800, elsewhere), { action: "probe", afterMs: REJOIN_BACKOFF_MS[2] });
  assert.deepEqual(rejoin.answered(2900, { kind: "session", status: "recovering", reason: "replica_lost" }), {
    action: "offer",
    openWithinMs: OPEN_TIMEOUT_MS,
  });
  // Answered, but its ICE never completed: lost again, after the next backoff.
  assert.deepEqual(rejoin.lost(2900 + OPEN_TIMEOUT_MS), { action: "probe", afterMs: REJOIN_BACKOFF_MS[3] });
  assert.equal(rejoin.answered(15_000, running).action, "offer");
  assert.equal(rejoin.outageMs(15_000), 14_000);
  rejoin.opened();
  assert.equal(rejoin.phase, "connected");
  assert.equal(rejoin.outageMs(16_000), 0);

  // The next outage starts its backoff over.
  assert.deepEqual(rejoin.lost(100_000), { action: "probe", afterMs: 0 });
  assert.equal(rejoin.outages, 2);
  assert.deepEqual(rejoin.answered(100_010, unreachable), { action: "probe", afterMs: REJOIN_BACKOFF_MS[1] });
});

test("the backoff's last wait repeats; a queued session is asked again", () => {
  const rejoin = new Rejoin(0, 1_000_000);
  rejoin.start();
  rejoin.opened();
  const waits = [rejoin.lost(0).afterMs];
  for (let i = 0; i < 7; i++) waits.push(rejoin.answered(i * 10, unreachable).afterMs);
  const last = REJOIN_BACKOFF_MS.at(-1);
  assert.deepEqual(waits, [...REJOIN_BACKOFF_MS, last, last, last]);
  assert.equal(rejoin.answered(100, { kind: "session", status: "queued" }).action, "probe");
});

test("a session over on the service ends the outage with the service's reason, not a retry", () => {
  for (const status of ["closed", "expired", "failed", "cancelled"]) {
    const rejoin = new Rejoin(0);
    rejoin.start();
    rejoin.opened();
    rejoin.lost(10);
    assert.deepEqual(rejoin.answered(20, { kind: "session", status, reason: "replica_lost" }), { action: "over" });
    assert.equal(rejoin.phase, "ended");
    assert.deepEqual(rejoin.lost(30), { action: "none" });
    assert.deepEqual(rejoin.answered(40, running), { action: "none" });
  }
});

test("a refusal no retry can change gives up with its stable code; others are retried", () => {
  for (const [status, code] of [
    [404, "session_not_found"],
    [401, "unauthorized"],
    [403, "forbidden_origin"],
  ]) {
    const rejoin = new Rejoin(0);
    rejoin.start();
    const step = rejoin.answered(5, { kind: "refused", status, code, message: `refused ${status}` });
    assert.deepEqual(step, { action: "give_up", code, message: `refused ${status}` });
  }
  for (const status of [409, 429, 500, 502, 503]) {
    const rejoin = new Rejoin(0);
    rejoin.start();
    const step = rejoin.answered(5, { kind: "refused", status, code: `http_${status}`, message: "" });
    assert.equal(step.action, "probe", `${status} is retried`);
  }
});

test("an outage longer than the budget gives up with connection_lost; the last wait is cut to the deadline", () => {
  assert.equal(REJOIN_BUDGET_MS, 60_000);
  const rejoin = new Rejoin(0, 5000, [0, 1000, 3000]);
  rejoin.start();
  rejoin.opened();
  let now = 1000;
  let step = rejoin.lost(now);
  const waits = [];
  while (step.action === "probe") {
    waits.push(step.afterMs);
    now += step.afterMs;
    step = rejoin.answered(now, unreachable);
  }
  assert.deepEqual(waits, [0, 1000, 3000, 1000], "the probe before the deadline waits only until it");
  assert.equal(now, 6000);
  assert.deepEqual(step, { action: "give_up", code: "connection_lost", message: "not reconnected within 5 s" });
  assert.equal(rejoin.phase, "ended");
});

test("a link that never connected rejoins too, within the budget counted from its start", () => {
  const rejoin = new Rejoin(0, 10_000);
  rejoin.start();
  // The first offer was refused (the session was not attached to the transport yet): asked again, then offered.
  assert.deepEqual(rejoin.answered(100, { kind: "refused", status: 409, code: "session_not_streaming", message: "" }), {
    action: "probe",
    afterMs: 0,
  });
  assert.equal(rejoin.answered(200, running).action, "offer");
  assert.equal(rejoin.outages, 0);
  assert.equal(rejoin.answered(10_000, unreachable).action, "give_up");
});

// -- the path through a Session ------------------------------------------------------------------------------------

/** RTCPeerConnection and MediaStream as a page has them, scripted: the test fails a connection or opens one. */
function fakeWebRTC() {
  const pcs = [];
  class FakeChannel {
    constructor(label) {
      this.label = label;
      this.readyState = "connecting";
      this.sent = [];
    }
    send(data) {
      this.sent.push(JSON.parse(data));
    }
    open() {
      this.readyState = "open";
      this.onopen?.();
    }
    closeByPeer() {
      this.readyState = "closed";
      this.onclose?.();
    }
  }
  class FakePeerConnection {
    constructor() {
      this.connectionState = "new";
      this.iceGatheringState = "complete";
      this.localDescription = null;
      this.closed = false;
      pcs.push(this);
    }
    addTransceiver() {}
    createDataChannel(label) {
      this.channel = new FakeChannel(label);
      return this.channel;
    }
    async createOffer() {
      return { type: "offer", sdp: `offer-${pcs.indexOf(this)}` };
    }
    async setLocalDescription(description) {
      this.localDescription = description;
    }
    async setRemoteDescription(description) {
      this.remote = description;
    }
    addEventListener() {}
    close() {
      this.closed = true;
    }
    become(state) {
      this.connectionState = state;
      this.onconnectionstatechange?.();
    }
    connect() {
      this.become("connected");
      this.ontrack?.({ streams: [{ id: `stream-${pcs.indexOf(this)}` }], track: {}, receiver: null });
      this.channel.open();
    }
  }
  const saved = { RTCPeerConnection: globalThis.RTCPeerConnection, MediaStream: globalThis.MediaStream };
  globalThis.RTCPeerConnection = FakePeerConnection;
  globalThis.MediaStream = class {};
  return { pcs, restore: () => Object.assign(globalThis, saved) };
}

const EMBEDDED = { kind: "embedded", offer_url: "/v1/sessions/s1/webrtc", data_channel: "control" };

function snapshotOf(status, extra = {}) {
  return { id: "s1", status, queue_position: null, transport: EMBEDDED, video: { fps: 16 }, ...extra };
}

/** Lets every pending promise (fetch answers, awaits in the link) settle. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

async function advance(clock, ms) {
  for (let step = 0; step < ms; step += 50) {
    clock.advance(Math.min(50, ms - step));
    await settle();
  }
}

/** A service the test scripts: what GET /v1/sessions/s1 says and whether offers are answered. */
function scriptedService(stream) {
  const script = { status: "running", reason: null, offers: "answer" };
  const { fetch, calls } = fakeFetch({
    "POST /v1/sessions": () => jsonResponse(201, snapshotOf("running", { session_token: "sess-token" })),
    "GET /v1/sessions/s1": () => {
      if (script.status === "unreachable") throw new TypeError("fetch failed");
      return jsonResponse(200, snapshotOf(script.status, { reason: script.reason }));
    },
    "GET /v1/sessions/s1/events": () => new Response(stream.body, { status: 200 }),
    "POST /v1/sessions/s1/webrtc": () =>
      script.offers === "answer"
        ? jsonResponse(200, { type: "answer", sdp: "answer" })
        : jsonResponse(409, { error: { code: "session_on_other_replica", message: "runs on r1" } }),
  });
  return { fetch, calls, script };
}

const quiet = { warn() {}, error() {} };

test("after its replica dies the session is recovering, rejoins with the same id and credential, goes on", async () => {
  const webrtc = fakeWebRTC();
  try {
    const clock = new ManualClock();
    const stream = new EventStream();
    const { fetch, calls, script } = scriptedService(stream);
    const session = await createSession({ fetch, apiKey: "key", clock, logger: quiet });
    const states = [];
    const errors = [];
    const streams = [];
    session.on("state", ({ state, detail }) => states.push([state, detail]));
    session.on("error", (error) => errors.push(error.code));
    session.on("stream", (s) => streams.push(s.id));
    await session.join(null);
    await settle();
    const [first] = webrtc.pcs;
    first.connect();
    assert.equal(session.link.rejoin.phase, "connected");
    assert.ok(session.keys.hold("w"));
    assert.deepEqual(first.channel.sent.at(-1).keys, ["w"]);

    // The replica is SIGKILLed: the peer connection fails. The service is not reachable at first (the front door
    // still tries the dead replica), then the registry names the dead replica (409), then it is adopted.
    script.status = "unreachable";
    first.become("failed");
    assert.deepEqual(states.at(-1)[0], "recovering");
    assert.match(states.at(-1)[1], /reconnecting: the peer connection failed/);
    await advance(clock, 100);
    script.status = "recovering";
    script.reason = "replica_lost";
    script.offers = "refuse";
    await advance(clock, 1000);
    assert.ok(webrtc.pcs.length >= 2, "it offered once the service answered");
    script.status = "running";
    script.reason = null;
    script.offers = "answer";
    await advance(clock, 4000);
    const last = webrtc.pcs.at(-1);
    assert.equal(last.remote?.sdp, "answer", "the new offer was answered");
    last.connect();
    await settle();

    assert.equal(session.state, "running");
    assert.deepEqual(states.at(-1), ["running", null]);
    assert.deepEqual(errors, [], "a hiccup, not an error");
    assert.equal(session.link.rejoin.phase, "connected");
    assert.equal(session.id, "s1");
    assert.deepEqual(streams, ["stream-0", `stream-${webrtc.pcs.length - 1}`], "the video gets the new track");
    // The held key goes out at once on the new channel; every request after the create kept the same credential.
    assert.deepEqual(last.channel.sent[0].keys, ["w"]);
    assert.ok(last.channel.sent[0].seq > first.channel.sent.at(-1).seq);
    assert.ok(calls.slice(1).every((call) => call.headers.Authorization === "Bearer sess-token"));
    assert.equal(calls.filter((call) => call.method === "POST" && call.path === "/v1/sessions").length, 1);
    await session.close();
  } finally {
    webrtc.restore();
  }
});

test("a session ending while the link is down ends with its reason; a spent budget with connection_lost", async () => {
  const webrtc = fakeWebRTC();
  try {
    const clock = new ManualClock();
    const stream = new EventStream();
    const { fetch, script } = scriptedService(stream);
    const session = await createSession({ fetch, apiKey: "key", clock, logger: quiet });
    await session.join(null);
    await settle();
    webrtc.pcs[0].connect();
    script.status = "failed";
    script.reason = "replica_lost";
    const done = nextEvent(session, "done");
    webrtc.pcs[0].channel.closeByPeer();
    await advance(clock, 3000);
    assert.deepEqual(await done, { reason: "replica_lost", state: "failed" });
    assert.deepEqual(session.errors, [], "the service's ending is no client error");
    assert.equal(webrtc.pcs.length, 1, "nothing offered to an ended session");

    const other = await createSession({ fetch, apiKey: "key", clock, logger: quiet, rejoinBudgetMs: 5000 });
    script.status = "running";
    await other.join(null);
    await settle();
    webrtc.pcs.at(-1).connect();
    script.status = "unreachable";
    const error = nextEvent(other, "error");
    webrtc.pcs.at(-1).become("failed");
    await advance(clock, 6000);
    const lost = await error;
    assert.equal(lost.code, "connection_lost");
    assert.match(lost.message, /not reconnected within 5 s/);
    await other.close();
  } finally {
    webrtc.restore();
  }
});
