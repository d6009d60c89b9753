"""Capabilities at the seam: each transport says what it can do beyond `Transport` through the protocols of
`transport.base`, and the service's routes ask for those, never for a transport class."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from transport.base import (
    AnswersOffers,
    AnswersViewerOffers,
    ChecksCallerRooms,
    IssuesViewers,
    ReceivesWebhooks,
    RenewsJoinDetails,
)
from transport.embedded.transport import EmbeddedTransport
from transport.livekit.transport import LiveKitTransport

ROOT = Path(__file__).resolve().parents[3]
CAPABILITIES = (
    AnswersOffers,
    AnswersViewerOffers,
    IssuesViewers,
    RenewsJoinDetails,
    ChecksCallerRooms,
    ReceivesWebhooks,
)


@pytest.mark.parametrize(
    ("transport", "has"),
    [
        (EmbeddedTransport, {AnswersOffers, AnswersViewerOffers, IssuesViewers}),
        (LiveKitTransport, {IssuesViewers, RenewsJoinDetails, ChecksCallerRooms, ReceivesWebhooks}),
    ],
)
def test_each_transport_has_exactly_its_capabilities(transport: type[object], has: set[type[object]]) -> None:
    assert {capability for capability in CAPABILITIES if issubclass(transport, capability)} == has


def test_an_object_without_the_methods_has_no_capability() -> None:
    assert not any(isinstance(object(), capability) for capability in CAPABILITIES)
    assert not any(isinstance(None, capability) for capability in CAPABILITIES)


def test_the_http_routes_name_no_transport_implementation() -> None:
    tree = ast.parse((ROOT / "service" / "http" / "routes.py").read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.module.startswith("transport")
    }
    named = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert imported <= {"transport.base", "transport.errors"}, (
        f"the routes import {sorted(imported)}: ask the transport for a capability (transport.base) instead"
    )
    assert not named & {"LiveKitTransport", "EmbeddedTransport"}
