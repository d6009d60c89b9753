// Test doubles at the client's seams: a fetch that answers the REST API from a table and serves an event stream the
// test pushes snapshots into, a livekit-client module whose Room is driven by the test, a clock that runs fast.

export function jsonResponse(status, body, headers = {}) {
  return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json", ...headers } });
}

/** An event stream the test writes session snapshots into. */
export class EventStream {
  constructor() {
    this.encoder = new TextEncoder();
    this.body = new ReadableStream({ start: (controller) => (this.controller = controller) });
  }
  push(snapshot) {
    this.controller.enqueue(this.encoder.encode(`event: session\ndata: ${JSON.stringify(snapshot)}\n\n`));
  }
  end() {
    this.controller.close();
  }
}

/** fetch(url, init) answered by `routes[METHOD path]` (a function of (url, init) or a Response maker). */
export function fakeFetch(routes) {
  const calls = [];
  const fetch = async (url, init = {}) => {
    const method = init.method || "GET";
    const path = new URL(url, "http://service.test").pathname;
    calls.push({ method, path, url, headers: init.headers || {}, body: init.body });
    const route = routes[`${method} ${path}`];
    if (route === undefined) return jsonResponse(404, { error: { code: "not_found", message: `no ${method} ${path}` } });
    return route(url, init);
  };
  return { fetch, calls };
}

/** A clock whose timers run `factor` times faster (wall and now are real). */
export function fastClock(factor = 100) {
  return {
    now: () => performance.now(),
    wall: () => Date.now(),
    setTimeout: (fn, ms) => setTimeout(fn, ms / factor),
    clearTimeout: (handle) => clearTimeout(handle),
    setInterval: (fn, ms) => setInterval(fn, Math.max(1, ms / factor)),
    clearInterval: (handle) => clearInterval(handle),
  };
}

/** A manual clock: timers fire when the test advances it. */
export class ManualClock {
  constructor() {
    this.time = 0;
    this.timers = [];
    this.nextId = 1;
  }
  now() { return this.time; }
  wall() { return 1_700_000_000_000 + this.time; }
  setTimeout(fn, ms) { return this.add(fn, ms, null); }
  setInterval(fn, ms) { return this.add(fn, ms, ms); }
  clearTimeout(id) { this.timers = this.timers.filter((t) => t.id !== id); }
  clearInterval(id) { this.clearTimeout(id); }
  add(fn, ms, every) {
    const id = this.nextId++;
    this.timers.push({ id, at: this.time + ms, fn, every });
    return id;
  }
  advance(ms) {
    const until = this.time + ms;
    for (;;) {
      this.timers.sort((a, b) => a.at - b.at);
      const next = this.timers[0];
      if (!next || next.at > until) break;
      this.time = next.at;
      if (next.every !== null) next.at += next.every;
      else this.timers.shift();
      next.fn();
    }
    this.time = until;
  }
}

/** A livekit-client module whose one Room the test drives: `rooms[0].deliver(status)`, a disconnect that hangs. */
export function fakeLiveKit({ hangOnDisconnect = false } = {}) {
  const rooms = [];
  const RoomEvent = {
    TrackSubscribed: "trackSubscribed",
    DataReceived: "dataReceived",
    ParticipantAttributesChanged: "participantAttributesChanged",
    ConnectionStateChanged: "connectionStateChanged",
    Disconnected: "disconnected",
  };
  class Room {
    constructor(options) {
      this.options = options;
      this.handlers = new Map();
      this.state = "disconnected";
      this.published = [];
      this.calls = [];
      this.remoteParticipants = new Map([["svc", { identity: "svc", attributes: { "lingstream.state": "running" } }]]);
      this.localParticipant = {
        publishData: async (payload, options) => {
          this.published.push({ message: JSON.parse(new TextDecoder().decode(payload)), ...options });
        },
        performRpc: async (call) => {
          this.calls.push(call);
          const message = JSON.parse(call.payload);
          if (message.type === "pause") return JSON.stringify({ v: 1, ok: true, state: "paused", applied: true });
          const error = new Error("refused");
          error.code = 1500;
          error.data = "not_allowed";
          throw error;
        },
      };
      rooms.push(this);
    }
    on(name, handler) {
      this.handlers.set(name, handler);
      return this;
    }
    async connect(url, token) {
      this.url = url;
      this.token = token;
      this.state = "connected";
    }
    disconnect() {
      this.disconnects = (this.disconnects || 0) + 1;
      return hangOnDisconnect ? new Promise(() => {}) : Promise.resolve();
    }
    deliver(message, identity = "svc", topic = "lingstream.status") {
      const payload = new TextEncoder().encode(JSON.stringify(message));
      this.handlers.get(RoomEvent.DataReceived)(payload, { identity }, 0, topic);
    }
  }
  const module = { Room, RoomEvent, Track: { Kind: { Video: "video" } } };
  return { module, rooms, load: async () => module };
}

export const LIVEKIT_JOIN = {
  kind: "livekit",
  url: "ws://livekit.test",
  room: "room-1",
  token: "join-token",
  identity: "controller-1",
  service_identity: "svc",
  control_topic: "lingstream.control",
  status_topic: "lingstream.status",
};

export function snapshot(status, extra = {}) {
  return { id: "s1", status, queue_position: null, transport: LIVEKIT_JOIN, video: { fps: 16 }, ...extra };
}

export function nextEvent(session, name, wanted = () => true) {
  return new Promise((resolve) => {
    const off = session.on(name, (payload) => {
      if (!wanted(payload)) return;
      off();
      resolve(payload);
    });
  });
}

/** Resolves when the session's link opens (its control path). */
export function opened(session) {
  return nextEvent(session, "connection", (payload) => payload.phase === "open");
}
