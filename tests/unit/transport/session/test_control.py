"""The control intake shared by both bindings: the error-reply and prompt rate limits over time, on a fake clock,
and the session refusing a message in its state."""

from __future__ import annotations

import json

from pipeline.bidirectional import ControlState, SetPrompt
from tests.support.fakes.clock import FakeClock
from tests.support.fakes.transport_port import FakeSessionPort
from transport.base import ErrorStatus, StatusMessage
from transport.errors import ControlRejectedError
from transport.session.control import PROMPT_BURST, PROMPT_RATE, CallAnswer, CallRefusal, ControlIntake

# docs/control-protocol.md: error replies come in bursts of 10, then 5 per second.
BURST = 10
RATE = 5.0


def _intake(clock: FakeClock) -> tuple[ControlIntake, list[StatusMessage]]:
    replies: list[StatusMessage] = []
    return ControlIntake(FakeSessionPort(), replies.append, clock=clock), replies


def _garbage(intake: ControlIntake, count: int) -> None:
    for _ in range(count):
        intake.receive(b"{not json")


def test_the_error_reply_burst_stays_capped_after_a_long_idle_and_refills_at_the_documented_rate() -> None:
    clock = FakeClock(1000.0)
    intake, replies = _intake(clock)

    _garbage(intake, 50)
    assert len(replies) == BURST  # a fresh intake starts with one full burst
    assert all(isinstance(r, ErrorStatus) and r.code == "malformed_json" for r in replies)

    # An hour of silence would refill 18 000 tokens at 5/s: the bucket still holds one burst at most.
    clock.advance(3600.0)
    _garbage(intake, 50)
    assert len(replies) == 2 * BURST

    # Empty now. Refill is 5 per second: half a token after 0.1 s (no reply), one and a half after 0.3 s.
    clock.advance(0.1)
    _garbage(intake, 3)
    assert len(replies) == 2 * BURST
    clock.advance(0.2)
    _garbage(intake, 3)
    assert len(replies) == 2 * BURST + 1
    # 0.5 token left over + 1 s at 5/s = 5.5 tokens: five replies out of twenty.
    clock.advance(1.0)
    _garbage(intake, 20)
    assert len(replies) == 2 * BURST + 1 + 5

    stats = intake.statistics()
    assert stats.rejected == 50 + 50 + 3 + 3 + 20
    assert stats.error_replies == len(replies)
    assert stats.error_replies + stats.error_replies_suppressed == stats.rejected


def test_a_configured_rate_and_burst_are_used() -> None:
    clock = FakeClock()
    replies: list[StatusMessage] = []
    intake = ControlIntake(FakeSessionPort(), replies.append, clock=clock, error_rate=1.0, error_burst=2)
    _garbage(intake, 5)
    assert len(replies) == 2
    clock.advance(0.5)
    _garbage(intake, 5)
    assert len(replies) == 2
    clock.advance(0.5)
    _garbage(intake, 5)
    assert len(replies) == 3


def _wire(seq: int, *keys: str) -> str:
    return json.dumps({"v": 1, "type": "control_state", "seq": seq, "keys": list(keys)})


def test_every_message_is_counted_once_by_its_outcome() -> None:
    port = FakeSessionPort()
    replies: list[StatusMessage] = []
    intake = ControlIntake(port, replies.append, clock=FakeClock())
    intake.receive(_wire(1, "w"))  # forwarded
    intake.receive(_wire(1, "w"))  # duplicate
    intake.receive(_wire(0, "s"))  # stale
    intake.receive('{"v":1,"type":"reset_pose"}')  # a command: forwarded
    intake.ignore()
    intake.ignore()
    port.refuse_control = True
    intake.receive(_wire(2, "a"))  # the session refuses it
    intake.receive(_wire(3, "a"))  # and this one too
    intake.receive(b"\x00")  # rejected
    stats = intake.statistics()
    assert (stats.received, stats.forwarded, stats.push_failures, stats.ignored, stats.rejected) == (7, 2, 2, 2, 1)
    assert (stats.inbox.accepted, stats.inbox.stale, stats.inbox.duplicates, stats.inbox.commands) == (3, 1, 1, 1)
    assert len(port.controls) == 2


def test_forwarded_messages_are_counted_by_the_path_they_came_and_their_type() -> None:
    port = FakeSessionPort()
    intake = ControlIntake(port, lambda _: None, clock=FakeClock())
    intake.receive(_wire(1, "w"))
    intake.receive(_wire(2, "w", "a"))
    intake.receive(_wire(2, "w", "a"))  # a duplicate: not forwarded, not counted
    intake.receive('{"v":1,"type":"stop"}')
    assert isinstance(intake.call('{"v":1,"type":"prompt","seq":1,"text":"fog"}', "prompt"), CallAnswer)
    assert isinstance(intake.call('{"v":1,"type":"reset_pose"}', "reset_pose"), CallAnswer)
    assert isinstance(intake.call('{"v":1,"type":"reset_pose"}', "pause"), CallRefusal)  # refused: not counted
    assert isinstance(intake.call('{"v":1,"type":"stop"}', "stop"), CallAnswer)
    stats = intake.statistics()
    assert dict(stats.forwarded_by) == {
        ("packet", "control_state"): 2,
        ("packet", "stop"): 1,
        ("rpc", "prompt"): 1,
        ("rpc", "reset_pose"): 1,
        ("rpc", "stop"): 1,
    }
    assert sum(stats.forwarded_by.values()) == stats.forwarded


def test_the_configured_size_limit_is_applied() -> None:
    replies: list[StatusMessage] = []
    intake = ControlIntake(FakeSessionPort(), replies.append, clock=FakeClock(), max_bytes=40)
    intake.receive(_wire(1, "w", "a", "s", "d"))  # valid, but over 40 bytes
    assert [r.code for r in replies if isinstance(r, ErrorStatus)] == ["message_too_large"]


def test_an_intake_without_a_clock_limits_on_the_monotonic_clock() -> None:
    replies: list[StatusMessage] = []
    intake = ControlIntake(FakeSessionPort(), replies.append)
    _garbage(intake, BURST + 5)
    # A full burst, and the rest held back: refilling at 5/s, the 5 extra would need a second (a slow machine might
    # earn one token meanwhile).
    assert BURST <= len(replies) < BURST + 5


def _prompt(seq: int, text: str = "dusk") -> str:
    return json.dumps({"v": 1, "type": "prompt", "seq": seq, "text": text})


def test_a_prompt_flood_over_the_rate_is_dropped_and_answered_rate_limited() -> None:
    clock = FakeClock()
    port = FakeSessionPort()
    replies: list[StatusMessage] = []
    intake = ControlIntake(port, replies.append, clock=clock)
    for seq in range(PROMPT_BURST + 3):
        intake.receive(_prompt(seq))
    assert [m.seq for m in port.controls if isinstance(m, SetPrompt)] == list(range(PROMPT_BURST))
    assert [r.code for r in replies if isinstance(r, ErrorStatus)] == ["rate_limited"] * 3
    intake.receive(_wire(1, "w"))  # key snapshots are not held to the prompt rate
    assert port.controls[-1] == ControlState(1, frozenset({"w"}))
    clock.advance(1.0 / PROMPT_RATE)  # one more prompt's worth
    intake.receive(_prompt(100))
    intake.receive(_prompt(101))
    assert [m.seq for m in port.controls if isinstance(m, SetPrompt)][-1] == 100
    stats = intake.statistics()
    assert stats.prompts_rate_limited == 4
    assert stats.inbox.prompts == PROMPT_BURST + 1
    assert stats.rejected_by_code["rate_limited"] == 4


def test_a_message_the_session_refuses_is_answered_with_the_sessions_code() -> None:
    port = FakeSessionPort()
    replies: list[StatusMessage] = []
    intake = ControlIntake(port, replies.append, clock=FakeClock())
    port.reject_control = ControlRejectedError("session_not_running", "session 's1' is closing; it cannot be paused")
    intake.receive(b'{"v":1,"type":"pause"}')
    assert replies == [ErrorStatus("session_not_running", "session 's1' is closing; it cannot be paused")]
    stats = intake.statistics()
    assert (stats.refused, stats.rejected, stats.forwarded) == (1, 0, 0)
    assert stats.rejected_by_code == {"session_not_running": 1}
