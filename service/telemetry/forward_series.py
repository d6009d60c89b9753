"""The forwarded transport routes' series: `lingstream_forwarded_requests_total{route, outcome}`, one per request a
replica forwarded, or would have, to the replica that runs the session (`service.scaleout.forwarding`). No replica,
address or session is a label."""

from __future__ import annotations

from opentelemetry.metrics import Meter

from service.scaleout.forwarding import ForwardedRoute, ForwardOutcome, ResultHook

__all__ = ["forward_results"]


def forward_results(meter: Meter) -> ResultHook:
    """The forwarder's `on_result`, counting on `meter`."""
    requests = meter.create_counter(
        "lingstream.forwarded.requests",
        unit="{request}",
        description="Transport routes of sessions run by another replica, by route (webrtc, viewers, watch) and "
        "outcome: answered (the owner's answer returned), loop, no_url, unreachable, timeout (409 here).",
    )

    def count(route: ForwardedRoute, outcome: ForwardOutcome) -> None:
        requests.add(1, {"route": route.value, "outcome": outcome.value})

    return count
