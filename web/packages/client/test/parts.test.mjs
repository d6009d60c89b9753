// The deterministic parts: control snapshots and their resends, the figures (control → photon by frame id and by
// RTP timestamp, keep-warm repeats), the event stream parser, the gamepad mapping, the version.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { Controls, EventStreamParser, Figures, REPEAT_TICKS, RESEND_MS, VERSION, gamepadKeys } from "../dist/index.js";
import { ManualClock } from "./fakes.mjs";

test("held keys go out on each change and again every RESEND_MS, each with a larger seq", () => {
  const clock = new ManualClock();
  const sent = [];
  const controls = new Controls((message) => (sent.push(message), true), () => {}, clock);
  assert.equal(controls.hold("w"), false, "inactive controls hold nothing");
  controls.start();
  controls.hold("w");
  controls.hold("ArrowLeft");
  controls.hold("w"); // auto-repeat: nothing new
  assert.deepEqual(sent.map((m) => m.keys), [["w"], ["j", "w"]]);
  clock.advance(RESEND_MS * 2);
  assert.equal(sent.length, 4);
  assert.ok(sent.every((m, i) => i === 0 || m.seq > sent[i - 1].seq));
  controls.releaseAll();
  clock.advance(RESEND_MS * 4);
  assert.equal(sent.length, 5, "no resends once nothing is held");
  assert.deepEqual(sent.at(-1).keys, []);
  assert.equal(controls.sentTime(sent[1].seq), 0);
  controls.stop();
});

test("control → photon on LiveKit: the first frame whose id reaches the chunk's first_frame_id; repeats told apart", () => {
  const figures = new Figures();
  const chunk = { v: 1, type: "chunk", index: 3, applied_seq: 7, keys: ["w"], first_frame_id: 42 };
  figures.chunk(chunk, null, 1000, 1100);
  assert.equal(figures.latencyMs, 100);
  const at = (now, frameId) => figures.presented(now, {}, { embedded: false, generation: 0, frameId });
  at(1200, 41);
  assert.equal(figures.photonMs, null, "frame 41 is before the chunk");
  at(1250, 41);
  assert.equal(figures.repeatsById, 1);
  at(1300, 42);
  assert.equal(figures.photonMs, 300);
  assert.equal(figures.frames, 2);
  // The same applied seq again (a later chunk of the same snapshot) measures nothing new.
  figures.chunk({ ...chunk, index: 4, first_frame_id: 46 }, chunk, 1000, 1400);
  at(1500, 46);
  assert.equal(figures.photonsMs.length, 1);
});

test("control → photon on the embedded transport: by RTP timestamp, keep-warm repeats neither counted nor matched", () => {
  const figures = new Figures();
  figures.videoFps = 10; // 9000 ticks a frame
  const offset = 123456;
  const frame = (now, pts) => figures.presented(now, { rtpTimestamp: (pts + offset) >>> 0 }, { embedded: true, generation: 1, frameId: null });
  figures.chunk({ v: 1, type: "chunk", index: 0, applied_seq: 1, keys: [], first_frame_pts: 0 }, null, 0, 50);
  frame(100, 0); // learns the offset
  frame(200, 9000);
  assert.equal(figures.frames, 2);
  figures.chunk({ v: 1, type: "chunk", index: 1, applied_seq: 2, keys: ["w"], first_frame_pts: 18000 }, null, 250, 300);
  frame(350, 9000 + REPEAT_TICKS); // a keep-warm repeat: off the grid
  assert.equal(figures.frames, 2);
  assert.equal(figures.photonMs, 100, "the first chunk's only sample: sent at 0, its first frame presented at 100");
  frame(400, 18000);
  assert.equal(figures.frames, 3);
  assert.equal(figures.photonMs, 150, "sent at 250, its first frame presented at 400");
});

test("the event stream parser yields whole events across chunk boundaries", () => {
  const parser = new EventStreamParser();
  assert.deepEqual(parser.push("event: session\ndata: {\"a\""), []);
  assert.deepEqual(parser.push(":1}\n\n: keep-alive\n\nevent: session\r\ndata: 2\r\n\r\n"), [
    { event: "session", data: '{"a":1}' },
    { event: "message", data: "" },
    { event: "session", data: "2" },
  ]);
});

test("a standard gamepad's sticks and D-pad hold the movement and look keys", () => {
  const button = (pressed) => ({ pressed });
  const idle = { axes: [0, 0, 0, 0], buttons: Array.from({ length: 16 }, () => button(false)) };
  assert.deepEqual([...gamepadKeys(idle)], []);
  const pad = { axes: [0.9, -0.8, -0.7, 0.2], buttons: idle.buttons.map((b, i) => button(i === 13)) };
  assert.deepEqual([...gamepadKeys(pad)].sort(), ["d", "j", "s", "w"]);
});

test("the package's version is the one its package.json declares", () => {
  const manifest = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
  assert.equal(VERSION, manifest.version);
});
