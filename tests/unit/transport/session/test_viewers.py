"""Viewer places and embedded viewer credentials (pure), and a viewer track that nobody reads."""

from __future__ import annotations

import numpy as np
import pytest

from transport.embedded.rtc import TRACK_QUEUE, PacedVideoTrack
from transport.errors import TooManyViewersError, ViewerTokenExpiredError, ViewerTokenInvalidError
from transport.session.pacing import PacedFrame
from transport.session.viewers import ViewerCredentials, ViewerSeats

NOW = 1_000.0


def test_places_are_taken_by_credentials_and_viewers_up_to_the_limit() -> None:
    seats = ViewerSeats("s", 2)
    seats.reserve("a", NOW + 60, NOW)
    seats.reserve("b", NOW + 60, NOW)
    with pytest.raises(TooManyViewersError, match="2 viewer"):
        seats.reserve("c", NOW + 60, NOW)
    assert seats.join("a", NOW) is True
    assert seats.join("a", NOW) is False  # a rejoin keeps its place
    stats = seats.statistics(NOW)
    assert (stats.watching, stats.pending, stats.refused_full, stats.joined_total) == (1, 1, 1, 1)


def test_an_unused_credential_frees_its_place_when_it_expires_and_a_leaver_frees_at_once() -> None:
    seats = ViewerSeats("s", 1)
    seats.reserve("a", NOW + 60, NOW)
    with pytest.raises(TooManyViewersError):
        seats.reserve("b", NOW + 60, NOW + 59)
    seats.reserve("b", NOW + 120, NOW + 60)
    seats.join("b", NOW + 61)
    with pytest.raises(TooManyViewersError):
        seats.reserve("c", NOW + 200, NOW + 62)
    seats.leave("b")
    seats.leave("b")  # idempotent
    seats.reserve("c", NOW + 200, NOW + 62)
    assert seats.statistics(NOW + 62).left == 1


def test_a_viewer_coming_back_after_leaving_needs_a_free_place() -> None:
    seats = ViewerSeats("s", 1)
    seats.reserve("a", NOW + 60, NOW)
    seats.join("a", NOW)
    seats.leave("a")
    seats.reserve("b", NOW + 60, NOW)
    with pytest.raises(TooManyViewersError):
        seats.join("a", NOW + 1)
    seats.admit("x")  # LiveKit reports a viewer after the fact: it counts even beyond the limit
    assert seats.statistics(NOW).watching == 1


def test_credentials_are_bound_to_their_session_and_expire() -> None:
    credentials = ViewerCredentials(60, key=b"k" * 32)
    credential = credentials.mint("session-1", NOW)
    assert credential.expires_at == NOW + 60
    assert credentials.verify(credential.token, "session-1", NOW + 59) == credential.viewer_id
    with pytest.raises(ViewerTokenExpiredError):
        credentials.verify(credential.token, "session-1", NOW + 60)
    with pytest.raises(ViewerTokenInvalidError):
        credentials.verify(credential.token, "session-2", NOW)
    with pytest.raises(ViewerTokenInvalidError):
        ViewerCredentials(60, key=b"o" * 32).verify(credential.token, "session-1", NOW)
    version, viewer, expires, signature = credential.token.split(".")
    forged = [
        f"{version}.{viewer}.{int(expires) + 3600}.{signature}",  # a later expiry under the old signature
        f"{version}.ffffffffffff.{expires}.{signature}",
        f"v2.{viewer}.{expires}.{signature}",
        f"{credential.token}.x",
        "",
        "v1.a.b.c",
        "v1." + "a" * 300,
        f"{version}.{viewer}.{expires}.{signature[:-1]}é",
    ]
    for token in forged:
        with pytest.raises(ViewerTokenInvalidError):
            credentials.verify(token, "session-1", NOW)


async def test_a_viewer_track_nobody_reads_keeps_the_newest_frames_and_counts_the_rest() -> None:
    track = PacedVideoTrack(16.0)
    image = np.zeros((16, 16, 3), np.uint8)
    for index in range(100):
        track.offer(PacedFrame(image=image, frame_index=index, chunk_index=0, media_index=index, deadline=0.0))
    assert track.dropped == 100 - TRACK_QUEUE
    frame = await track.recv()
    assert frame.pts == round((100 - TRACK_QUEUE) * 90_000 / 16)  # the oldest kept frame goes out first
    track.stop()
