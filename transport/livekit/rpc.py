"""The control protocol's discrete commands as LiveKit RPC methods of the service participant.

A LiveKit developer `await`s a command and gets its outcome (`performRpc` in livekit-client, `perform_rpc` in the
Python SDK) instead of sending a packet and watching for a later `state` or `error` status. The service participant
registers one method per discrete command of control protocol v1 (`RPC_METHODS`); the payload is that command's v1
JSON (or empty: the bare command; a prompt needs its `seq` and `text`). The call goes through the session's
`ControlIntake.call`, so it obeys the same rules as the packet (bounds, newest-wins `seq`, the prompt rate, the
session's refusals) and counts in the same statistics. Key snapshots stay lossy packets: they are continuous, and an
answer per snapshot would only add load.

Only the controller identity is answered; anyone else gets `not_controller`. The answer is
`{"v": 1, "ok": true, "state": "<the session's state after it>", "applied": true}` (`applied` false: a prompt
whose `seq` was not newer than the newest one, dropped as on the packet path). A refusal raises the SDK's
`RpcError` on the caller's side with `code` from `RPC_ERROR_CODES` (LiveKit reserves 1001-1999 for its own errors;
ours are 2001-2099), `message` a sentence, and `data` the stable string code of the control protocol or the REST
error table (`invalid_message`, `rate_limited`, `session_not_running`, ...). `RPC_ERROR_CODES` is the one table;
docs/livekit.md prints it.

This module is pure: `ControlRpc.handle` takes the caller's identity and the payload and returns the answer or an
`RpcFailure`; the room adapter (`transport.livekit.room`) turns a failure into the SDK's `RpcError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType

from transport.livekit.room import RpcFailure
from transport.protocol import PROTOCOL_VERSION, ProtocolErrorCode
from transport.session.control import CallAnswer, ControlIntake

__all__ = [
    "NOT_CONTROLLER",
    "RPC_ERROR_CODES",
    "RPC_METHODS",
    "UNLISTED_RPC_ERROR",
    "ControlRpc",
    "rpc_error_code",
]

RPC_METHODS: Mapping[str, str] = MappingProxyType(
    {
        "lingstream.pause": "pause",
        "lingstream.resume": "resume",
        "lingstream.reset_pose": "reset_pose",
        "lingstream.stop": "stop",
        "lingstream.prompt": "prompt",
    }
)
"""The RPC methods the service participant answers, each with the control protocol v1 message type it takes."""

NOT_CONTROLLER = "not_controller"
"""The stable code of a call from a participant that is not the session's controller (RPC only)."""

RPC_ERROR_CODES: Mapping[str, int] = MappingProxyType(
    {
        ProtocolErrorCode.MESSAGE_TOO_LARGE.value: 2001,
        ProtocolErrorCode.MALFORMED_JSON.value: 2002,
        ProtocolErrorCode.INVALID_MESSAGE.value: 2003,
        ProtocolErrorCode.UNSUPPORTED_VERSION.value: 2004,
        ProtocolErrorCode.UNKNOWN_TYPE.value: 2005,
        ProtocolErrorCode.INVALID_SEQ.value: 2006,
        ProtocolErrorCode.INVALID_KEYS.value: 2007,
        ProtocolErrorCode.PROMPT_TOO_LARGE.value: 2008,
        ProtocolErrorCode.INVALID_PROMPT.value: 2009,
        ProtocolErrorCode.RATE_LIMITED.value: 2010,
        "session_not_running": 2011,
        "session_queued": 2012,
        NOT_CONTROLLER: 2013,
    }
)
"""Stable code → the RPC error code a refusal carries (its `data` is the stable code itself)."""

UNLISTED_RPC_ERROR = 2099
"""The RPC error code of a refusal whose stable code the table does not list (its `data` still names it)."""


def rpc_error_code(code: str) -> int:
    """The RPC error code for a stable code (`UNLISTED_RPC_ERROR` for one the table does not list)."""
    return RPC_ERROR_CODES.get(code, UNLISTED_RPC_ERROR)


def _failure(code: str, message: str) -> RpcFailure:
    return RpcFailure(rpc_error_code(code), message, code)


def _answer(answer: CallAnswer) -> str:
    body = {"v": PROTOCOL_VERSION, "ok": True, "state": answer.state, "applied": answer.applied}
    return json.dumps(body, separators=(",", ":"))


class ControlRpc:
    """The RPC face of one session's control intake (see the module docstring). Pure and synchronous: the SDK runs
    `handle` on the event loop, as it runs data callbacks; nothing here blocks."""

    def __init__(self, intake: ControlIntake, controller_identity: str) -> None:
        self._intake = intake
        self._controller = controller_identity
        self._foreign = 0

    @property
    def foreign_calls(self) -> int:
        """Calls refused because their caller is not the controller."""
        return self._foreign

    def handle(self, method: str, caller_identity: str, payload: str) -> str | RpcFailure:
        """Answer one call of `method` (a name of `RPC_METHODS`) from `caller_identity`."""
        kind = RPC_METHODS.get(method)
        if kind is None:
            return _failure(ProtocolErrorCode.UNKNOWN_TYPE.value, f"no method {method[:64]!r} here")
        if caller_identity != self._controller:
            self._foreign += 1
            self._intake.ignore()
            return _failure(NOT_CONTROLLER, "only the session's controller may call this")
        if not payload.strip():
            payload = json.dumps({"v": PROTOCOL_VERSION, "type": kind}, separators=(",", ":"))
        outcome = self._intake.call(payload, kind)
        if isinstance(outcome, CallAnswer):
            return _answer(outcome)
        return _failure(outcome.code, outcome.message)
