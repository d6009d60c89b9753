"""The control protocol's discrete commands as RPC methods: answers, refusals and the one table of error codes."""

from __future__ import annotations

import json

import pytest

from pipeline.bidirectional import Pause, ResetPose, Resume, SetPrompt, Stop
from tests.support.fakes.clock import FakeClock
from tests.support.fakes.transport_port import FakeSessionPort
from transport.base import StatusMessage
from transport.errors import ControlRejectedError
from transport.livekit.room import RpcFailure
from transport.livekit.rpc import (
    NOT_CONTROLLER,
    RPC_ERROR_CODES,
    RPC_METHODS,
    UNLISTED_RPC_ERROR,
    ControlRpc,
    rpc_error_code,
)
from transport.protocol import ProtocolErrorCode
from transport.session.control import ControlIntake

CONTROLLER = "ctl-s1-abc"


def _rpc() -> tuple[ControlRpc, FakeSessionPort, ControlIntake, list[StatusMessage]]:
    port = FakeSessionPort()
    replies: list[StatusMessage] = []
    intake = ControlIntake(port, replies.append, clock=FakeClock())
    return ControlRpc(intake, CONTROLLER), port, intake, replies


def _ok(answer: str | RpcFailure) -> dict[str, object]:
    assert isinstance(answer, str), answer
    body = json.loads(answer)
    assert isinstance(body, dict)
    return body


def _refused(answer: str | RpcFailure, code: str) -> RpcFailure:
    assert isinstance(answer, RpcFailure), answer
    assert answer.data == code
    assert answer.code == RPC_ERROR_CODES[code]
    assert answer.message
    return answer


def test_every_stable_code_a_call_can_get_has_its_own_rpc_code_outside_livekits_range() -> None:
    for code in ProtocolErrorCode:
        assert code.value in RPC_ERROR_CODES, f"add {code.value!r} to transport.livekit.rpc.RPC_ERROR_CODES"
    for other in ("session_not_running", "session_queued", NOT_CONTROLLER):
        assert other in RPC_ERROR_CODES
    numbers = list(RPC_ERROR_CODES.values())
    assert len(set(numbers)) == len(numbers)
    assert all(2001 <= number <= 2099 for number in numbers)  # 1001-1999 are LiveKit's own
    assert UNLISTED_RPC_ERROR not in numbers
    assert rpc_error_code("something_new") == UNLISTED_RPC_ERROR


def test_pause_resume_stop_answer_the_state_they_leave_the_session_in() -> None:
    rpc, port, intake, replies = _rpc()
    assert _ok(rpc.handle("lingstream.pause", CONTROLLER, "")) == {
        "v": 1,
        "ok": True,
        "state": "paused",
        "applied": True,
    }
    assert _ok(rpc.handle("lingstream.pause", CONTROLLER, '{"v":1,"type":"pause"}'))["state"] == "paused"  # twice
    assert _ok(rpc.handle("lingstream.resume", CONTROLLER, ""))["state"] == "running"
    assert _ok(rpc.handle("lingstream.reset_pose", CONTROLLER, '{"v":1,"type":"reset_pose"}'))["state"] == "running"
    assert _ok(rpc.handle("lingstream.stop", CONTROLLER, " "))["state"] == "draining"
    assert port.controls == [Pause(), Pause(), Resume(), ResetPose(), Stop()]
    assert replies == []  # answers go back as the call's answer, never as status messages
    assert intake.statistics().calls == 5
    assert intake.statistics().forwarded == 5


def test_a_prompt_takes_its_v1_json_and_a_stale_seq_is_answered_not_applied() -> None:
    rpc, port, _, _ = _rpc()
    body = _ok(rpc.handle("lingstream.prompt", CONTROLLER, '{"v":1,"type":"prompt","seq":7,"text":"a snowy night"}'))
    assert body == {"v": 1, "ok": True, "state": "running", "applied": True}
    stale = _ok(rpc.handle("lingstream.prompt", CONTROLLER, '{"v":1,"type":"prompt","seq":7,"text":"again"}'))
    assert stale["applied"] is False
    assert port.controls == [SetPrompt(7, "a snowy night")]


def test_a_participant_that_is_not_the_controller_is_refused() -> None:
    rpc, port, intake, _ = _rpc()
    _refused(rpc.handle("lingstream.pause", "agent-7", ""), NOT_CONTROLLER)
    assert port.controls == []
    assert rpc.foreign_calls == 1
    assert intake.statistics().ignored == 1


@pytest.mark.parametrize(
    ("method", "payload", "code"),
    [
        ("lingstream.pause", "{", ProtocolErrorCode.MALFORMED_JSON),
        ("lingstream.pause", '{"v":1,"type":"resume"}', ProtocolErrorCode.INVALID_MESSAGE),  # not this method's
        ("lingstream.pause", '{"v":1,"type":"control_state","seq":1,"keys":[]}', ProtocolErrorCode.INVALID_MESSAGE),
        ("lingstream.pause", '{"v":2,"type":"pause"}', ProtocolErrorCode.UNSUPPORTED_VERSION),
        ("lingstream.pause", '{"v":1,"type":"jump"}', ProtocolErrorCode.UNKNOWN_TYPE),
        ("lingstream.prompt", "", ProtocolErrorCode.INVALID_MESSAGE),  # a prompt needs its seq and text
        ("lingstream.prompt", '{"v":1,"type":"prompt","seq":-1,"text":"x"}', ProtocolErrorCode.INVALID_SEQ),
        ("lingstream.prompt", '{"v":1,"type":"prompt","seq":1,"text":"' + "x" * 600 + '"}', "prompt_too_large"),
        ("lingstream.prompt", '{"v":1,"type":"prompt","seq":1,"text":5}', ProtocolErrorCode.INVALID_PROMPT),
        ("lingstream.stop", "x" * 5000, ProtocolErrorCode.MESSAGE_TOO_LARGE),
        ("lingstream.jump", "", ProtocolErrorCode.UNKNOWN_TYPE),
    ],
)
def test_bad_payloads_are_refused_with_the_protocols_code(method: str, payload: str, code: str) -> None:
    rpc, port, intake, replies = _rpc()
    _refused(rpc.handle(method, CONTROLLER, payload), str(code))
    assert port.controls == []
    assert replies == []
    if method in RPC_METHODS:
        assert intake.statistics().rejected_by_code[str(code)] == 1


def test_prompts_over_the_rate_are_refused_rate_limited() -> None:
    rpc, port, _, _ = _rpc()
    answers = [
        rpc.handle("lingstream.prompt", CONTROLLER, json.dumps({"v": 1, "type": "prompt", "seq": seq, "text": "p"}))
        for seq in range(1, 8)
    ]
    assert all(isinstance(answer, str) for answer in answers[:5])  # the burst
    for answer in answers[5:]:
        _refused(answer, ProtocolErrorCode.RATE_LIMITED.value)
    assert len(port.controls) == 5


def test_the_sessions_own_refusal_carries_its_code() -> None:
    rpc, port, intake, _ = _rpc()
    port.reject_control = ControlRejectedError("session_not_running", "the session is closing")
    failure = _refused(rpc.handle("lingstream.resume", CONTROLLER, ""), "session_not_running")
    assert "closing" in failure.message
    assert intake.statistics().refused == 1
    port.reject_control = ControlRejectedError("session_whatever", "a code the table does not list")
    unlisted = rpc.handle("lingstream.pause", CONTROLLER, "")
    assert isinstance(unlisted, RpcFailure)
    assert (unlisted.code, unlisted.data) == (UNLISTED_RPC_ERROR, "session_whatever")
