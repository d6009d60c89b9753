"""The server-sent event stream: every change of state and position, keep-alives, and the queue heartbeat."""

from __future__ import annotations

import json

from tests.support.fakes.clock import FakeClock
from tests.support.service_harness import SseStream, running_service
from tests.support.waits import until


async def test_the_stream_shows_position_changes_then_admission_then_the_end() -> None:
    async with running_service(queue_size=4) as svc:
        first = (await svc.create()).json()["id"]
        second = (await svc.create()).json()["id"]
        third = (await svc.create()).json()["id"]
        async with SseStream(svc.app, f"/v1/sessions/{third}/events") as stream:
            assert stream.status == 200
            seen = [await stream.next_event()]
            await svc.client.delete(f"/v1/sessions/{first}")
            seen.append(await stream.next_event())
            await svc.client.delete(f"/v1/sessions/{second}")
            seen.append(await stream.next_event())
            seen.append(await stream.next_event())
            await svc.client.delete(f"/v1/sessions/{third}")
            while (event := await stream.next_event()) is not None:
                seen.append(event)
        steps = [(event["status"], event["queue_position"]) for event in seen if event is not None]
        assert steps == [
            ("queued", 2),
            ("queued", 1),
            ("admitted", None),
            ("running", None),
            ("draining", None),
            ("closed", None),
        ]


async def test_an_open_stream_keeps_the_place_and_closing_it_stops_the_heartbeat() -> None:
    clock = FakeClock()
    async with running_service(clock=clock, queue_heartbeat_timeout=3, queue_timeout=1000) as svc:
        await svc.create()
        waiting = (await svc.create()).json()["id"]
        async with SseStream(svc.app, f"/v1/sessions/{waiting}/events") as stream:
            assert (await stream.next_event() or {})["status"] == "queued"
            for _ in range(4):
                clock.advance(2)  # 8 s in all, more than twice the heartbeat timeout
                # The stream's next keep-alive is a heartbeat: the deadline moves to now + timeout.
                await until(
                    lambda: svc.controller.get(waiting).heartbeat_deadline == clock.now() + 3,
                    "the heartbeat deadline 3 s ahead",
                    every=0,
                )
            assert stream.status == 200
            body = (await svc.client.get("/v1/sessions")).json()["sessions"][1]
            assert body["status"] == "queued"
        clock.advance(3.5)
        body = (await svc.client.get("/v1/sessions")).json()["sessions"][1]
        assert (body["status"], body["reason"]) == ("expired", "heartbeat_lost")


async def test_a_finished_session_streams_its_final_state_and_ends() -> None:
    async with running_service() as svc:
        session = (await svc.create()).json()["id"]
        await svc.client.delete(f"/v1/sessions/{session}")
        async with SseStream(svc.app, f"/v1/sessions/{session}/events") as stream:
            event = await stream.next_event()
            assert event is not None
            assert event["status"] == "closed"
            assert await stream.next_event() is None


async def test_the_stream_needs_the_key_and_hides_other_keys_sessions() -> None:
    key_a, key_b = "key-a-0123456789abcdef", "key-b-0123456789abcdef"
    async with running_service(api_keys=f"{key_a},{key_b}") as svc:
        session = (await svc.create(headers={"Authorization": f"Bearer {key_a}"})).json()["id"]
        path = f"/v1/sessions/{session}/events"
        async with SseStream(svc.app, path) as anonymous:
            assert anonymous.status == 401
            assert json.loads(await anonymous.body())["error"]["code"] == "unauthorized"
        async with SseStream(svc.app, path, {"Authorization": f"Bearer {key_b}"}) as other:
            assert other.status == 404
            assert json.loads(await other.body())["error"]["code"] == "session_not_found"
        async with SseStream(svc.app, path, {"Authorization": f"Bearer {key_a}"}) as mine:
            assert mine.status == 200
            assert (await mine.next_event() or {})["status"] == "running"
