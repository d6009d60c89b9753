"""The embedded transport: direct WebRTC between the browser and the service (aiortc), for machines without LiveKit.

The browser POSTs an SDP offer (a receive-only video transceiver and a data channel labelled "control") to the
session's offer URL; the REST route calls `EmbeddedTransport.answer`, which creates a peer connection, attaches a
video track fed by the session's frame pacer, and returns the answer (candidates included: aiortc gathers before
answering, no trickle). The data channel carries control protocol v1 both ways. Every offer for the same session
*rebinds*: a new peer connection takes over the same pacer, control intake and status stream, and the previous one
is closed; the session (pose, chunk index, sequence numbers) never notices. A peer connection that fails or
closes starts the `reconnect_grace` timer; a new offer that connects within it resumes, expiry ends the session.

Each session's binding, its lifecycle and its peer connections are `transport.embedded.binding`.

Viewers: `EmbeddedTransport.viewer_details` takes one of the session's `max_viewers` places and mints a short-lived
viewer credential bound to the session; the viewer POSTs its offer with it to the watch URL, and
`EmbeddedTransport.answer_viewer` gives it a receive-only peer connection of its own beside the controller's
(`transport.embedded.viewers`): the same frames and status messages, no control.

Host candidates are gathered where `EmbeddedConfig.ice_host_addresses` says (loopback only by default; see
`transport.embedded.rtc.ice_host_addresses`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from pipeline.clock import Clock
from transport.base import (
    BindingStatistics,
    ReconnectKind,
    SessionPort,
    ViewerFigures,
)
from transport.embedded.binding import EmbeddedBindingStatistics, EmbeddedSessionBinding
from transport.embedded.config import EmbeddedConfig
from transport.embedded.rtc import install_host_address_hook
from transport.errors import (
    SessionAlreadyAttachedError,
    SessionNotAttachedError,
    SignalingError,
    TransportClosedError,
)
from transport.session.timers import LoopTimers, Timers
from transport.session.viewers import ViewerCredentials

__all__ = ["EmbeddedTransport", "EmbeddedTransportStatistics"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EmbeddedTransportStatistics:
    sessions: int
    attached_total: int
    offers_total: int
    offers_rejected: int


class EmbeddedTransport:
    """`Transport` over direct WebRTC. `attach` returns `{"kind": "embedded", "offer_url": ..., "data_channel":
    "control"}`; the REST route passes each offer to `answer`, and each viewer's offer to `answer_viewer`.

    `wall` is the wall clock (Unix seconds) viewer credentials expire on; a seam for tests.
    """

    def __init__(
        self,
        config: EmbeddedConfig | None = None,
        *,
        timers: Timers | None = None,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._config = config if config is not None else EmbeddedConfig()
        self._timers: Timers = timers if timers is not None else LoopTimers()
        self._clock = clock
        self._wall = wall
        self._credentials = ViewerCredentials(self._config.viewer_join_ttl)
        self._bindings: dict[str, EmbeddedSessionBinding] = {}
        self._running = False
        self._attached_total = 0
        self._offers_total = 0
        self._offers_rejected = 0

    @property
    def kind(self) -> str:
        return "embedded"

    @property
    def reports_delivery(self) -> bool:
        """Its bindings say when each chunk's frames left the pacer (`transport.base.ReportsDelivery`)."""
        return True

    @property
    def config(self) -> EmbeddedConfig:
        return self._config

    async def start(self) -> None:
        install_host_address_hook()
        self._running = True

    async def aclose(self) -> None:
        """Detach every session (closing its peer connection). Idempotent."""
        self._running = False
        for session_id in tuple(self._bindings):
            await self.detach(session_id, "the transport is stopping")

    async def attach(self, port: SessionPort) -> Mapping[str, object]:
        if not self._running:
            raise TransportClosedError("the embedded transport is not started")
        session_id = port.session_id
        if session_id in self._bindings:
            raise SessionAlreadyAttachedError(session_id)
        binding = EmbeddedSessionBinding(
            port, config=self._config, timers=self._timers, clock=self._clock, wall=self._wall
        )
        self._bindings[session_id] = binding
        binding.start()
        self._attached_total += 1
        return self._details(session_id)

    def _details(self, session_id: str) -> Mapping[str, object]:
        return {
            "kind": "embedded",
            "offer_url": self._config.offer_path.format(session_id=quote(session_id, safe="")),
            "data_channel": self._config.control_label,
        }

    def join_details(self, session_id: str) -> Mapping[str, object]:
        """The join details again (they do not expire: every offer to the URL rebinds)."""
        self.binding(session_id)
        return self._details(session_id)

    async def answer(self, session_id: str, offer_sdp: str, offer_type: str) -> tuple[str, str]:
        """Answer the browser's SDP offer for the session: `(answer_sdp, "answer")`.

        Raises `SessionNotAttachedError` (unknown or closed session) or `SignalingError` (not an offer, too big,
        malformed, or no video section).
        """
        binding = self._offered(session_id, offer_sdp, offer_type)
        try:
            return await binding.answer(offer_sdp)
        except SignalingError:
            self._offers_rejected += 1
            raise

    def _offered(self, session_id: str, offer_sdp: str, offer_type: str) -> EmbeddedSessionBinding:
        binding = self._bindings.get(session_id)
        if binding is None:
            raise SessionNotAttachedError(session_id)
        self._offers_total += 1
        if offer_type != "offer":
            self._offers_rejected += 1
            raise SignalingError(f"expected an SDP of type 'offer', got {offer_type[:32]!r}")
        if (
            len(offer_sdp) > self._config.max_offer_bytes
            or len(offer_sdp.encode("utf-8")) > self._config.max_offer_bytes
        ):
            self._offers_rejected += 1
            raise SignalingError(f"the offer is over {self._config.max_offer_bytes} bytes")
        return binding

    def viewer_details(self, session_id: str) -> Mapping[str, object]:
        """Take a viewer's place in the session and mint its credential: `{"kind": "embedded", "role": "viewer",
        "offer_url", "data_channel", "viewer_token", "expires_at"}`. The place is held until the viewer leaves, or
        until `expires_at` if the credential is never used. Raises `TooManyViewersError` when every place is taken.
        """
        binding = self.binding(session_id)
        now = self._wall()
        credential = self._credentials.mint(session_id, now)
        binding.viewers.seats.reserve(credential.viewer_id, credential.expires_at, now)
        return {
            "kind": "embedded",
            "role": "viewer",
            "offer_url": self._config.watch_path.format(session_id=quote(session_id, safe="")),
            "data_channel": self._config.control_label,
            "viewer_token": credential.token,
            "expires_at": credential.expires_at,
        }

    def verify_viewer(self, session_id: str, token: str) -> str:
        """The viewer id of a credential good for `session_id` now; raises `ViewerTokenInvalidError` or
        `ViewerTokenExpiredError` (also for a session that is not attached here: it has no credentials)."""
        return self._credentials.verify(token, session_id, self._wall())

    async def answer_viewer(self, session_id: str, token: str, offer_sdp: str, offer_type: str) -> tuple[str, str]:
        """Answer a viewer's offer: a receive-only peer connection of its own. Raises `ViewerTokenInvalidError` /
        `ViewerTokenExpiredError` for a credential that is not good for this session now, `TooManyViewersError`,
        `SessionNotAttachedError` or `SignalingError` (as `answer`)."""
        viewer_id = self.verify_viewer(session_id, token)
        binding = self._offered(session_id, offer_sdp, offer_type)
        try:
            return await binding.viewers.answer(viewer_id, offer_sdp)
        except SignalingError:
            self._offers_rejected += 1
            raise

    async def detach(self, session_id: str, reason: str) -> None:
        binding = self._bindings.pop(session_id, None)
        if binding is not None:
            await binding.aclose(reason)

    def binding(self, session_id: str) -> EmbeddedSessionBinding:
        binding = self._bindings.get(session_id)
        if binding is None:
            raise SessionNotAttachedError(session_id)
        return binding

    async def client_connected(self, session_id: str) -> None:
        """`transport.base.WaitsForClient`: once the session's client has connected a peer connection."""
        await self.binding(session_id).wait_connected()

    def session_statistics(self, session_id: str) -> EmbeddedBindingStatistics:
        return self.binding(session_id).statistics()

    def binding_statistics(self, session_id: str) -> BindingStatistics:
        stats = self.session_statistics(session_id)
        return BindingStatistics(
            pacer=stats.pacer,
            frames_unsent=stats.frames_unsent,
            track_dropped=stats.track_dropped,
            reconnects={ReconnectKind.PEER_RETURN: stats.peer_returns},
            viewers=ViewerFigures(
                watching=stats.viewers.seats.watching,
                frames_dropped=stats.viewers.frames_dropped,
                controls_refused=stats.viewers.controls_refused,
            ),
            controls=stats.control.forwarded_by,
        )

    @property
    def sessions(self) -> int:
        return len(self._bindings)

    def statistics(self) -> EmbeddedTransportStatistics:
        return EmbeddedTransportStatistics(
            sessions=len(self._bindings),
            attached_total=self._attached_total,
            offers_total=self._offers_total,
            offers_rejected=self._offers_rejected,
        )
