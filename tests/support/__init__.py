"""The one package `tests/` and `bench/` share (as `trio.testing` is trio's): what more than one test folder needs.

- `fakes/`: hand-written fakes at the package seams (clock, actors, transport port and timers, LiveKit rooms, a
  WebRTC peer, recording writers, a throwaway redis-server, a TCP proxy that loses traffic, fake model workers).
- `livekit_server_real.py`: the real `livekit-server` (the pinned release setup builds); `livekit_server/`: the
  LiveKit-signalling stand-in, for the faults only it injects; `livekit_stack.py` and `livekit_client.py` run one of
  them, the service and an SDK participant in a private network namespace (`netns.py`).
- `browser/`: Chromium and its flags, the pages and the Playwright fixtures of the browser tests.
- `serving.py` (a real `lingstream serve`), `service_harness.py` (the app in-process with fake workers),
  `reliability.py` (the fault tests' harnesses), `redis_cluster.py` (replicas against one redis-server),
  `seaweedfs.py` (a real S3-compatible server, SeaweedFS, for recordings in object storage), `server_process.py`.
- Model and pipeline helpers: `tiny_model.py`, `lingbot.py`, `lingbot_models.py`, `graphs.py`, `worker_stages.py`,
  `admission.py`, and the worlds with faults injected (`worlds.py`, `process_world.py`, `sharded_world.py`,
  `gated_world.py`).
- `waits.py`: `until`, the one way to poll for a state that has no event (sync twin `until_sync`);
  `process_tree.py`: a process's descendants and the shared memory they hold, from /proc.

A test imports a helper of its own folder directly; anything used from another folder (or from `bench/`) lives here
(`tests/unit/test_layering.py` checks it).
"""
