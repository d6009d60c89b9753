"""A LiveKit-signalling stand-in, for tests only: the real `livekit` Python SDK and the real `livekit-client` meet
through it, so the product's LiveKit path carries frames and data between two real LiveKit clients where no LiveKit
server can run.

It speaks LiveKit's v0 signalling (two peer connections per participant) on one port, beside the Twirp RoomService
the service calls and a few test controls; it verifies tokens with livekit-api's verifier, sends signed webhooks,
and relays media and data with aiortc. It is small and keeps no secrets of the real server: what it does not do
(simulcast, dynacast, adaptive stream, congestion control, token refresh, the real server's resume and webhook
timing) the README's LiveKit section lists, and the opt-in live suite covers against a real `livekit-server`.
`lingstream serve` never uses it.

- `server.py`: `StandIn`, the routes, joins, resumes and the test controls
- `rooms.py`: rooms, participants, permissions, updates, data forwarding
- `signal.py`: one websocket's signalling; `media.py`: the two aiortc peer connections; `twirp.py`: the
  RoomService; `webhooks.py`: the signed webhooks
- `process.py`: `StandInProcess`, how tests and the bench run it (`python -m tests.support.livekit_server`) and drive
its
  controls

Facts it rests on, measured here: ../shared/research/livekit-signalling.md (not in the repository) and the public
sources it names (livekit/livekit, rust-sdks, client-sdk-js).
"""
