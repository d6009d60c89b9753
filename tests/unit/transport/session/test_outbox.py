"""The status outbox: a link that ends under a message is counted and said without a stack; other failures keep
theirs."""

from __future__ import annotations

import asyncio
import logging

import pytest

from transport.errors import LinkLostError
from transport.session.outbox import Outbound, StatusOutbox


class _Link:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.attempts = 0

    @property
    def link_ready(self) -> bool:
        return True

    async def wait_link_ready(self) -> None:
        return None

    async def send_status(self, message: Outbound) -> None:
        self.attempts += 1
        raise self.error


async def _send_one(error: Exception) -> tuple[StatusOutbox, _Link]:
    outbox, link = StatusOutbox(), _Link(error)
    outbox.put(Outbound(b"{}", reliable=True))
    runner = asyncio.create_task(outbox.run(link))
    try:
        async with asyncio.timeout(5):
            await outbox.wait_idle()
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
    return outbox, link


async def test_a_link_lost_mid_send_is_counted_and_logged_without_a_stack(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="transport.session.outbox")
    outbox, link = await _send_one(LinkLostError("data not published: engine is closed"))
    assert link.attempts == 1
    assert outbox.statistics().send_failures == 1
    assert outbox.statistics().sent == 0
    [record] = [r for r in caplog.records if r.name == "transport.session.outbox"]
    assert record.levelno == logging.INFO
    assert record.exc_info is None
    assert "engine is closed" in record.getMessage()


async def test_an_unexpected_send_failure_keeps_its_stack(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="transport.session.outbox")
    outbox, _ = await _send_one(RuntimeError("bug"))
    assert outbox.statistics().send_failures == 1
    [record] = [r for r in caplog.records if r.name == "transport.session.outbox"]
    assert record.levelno == logging.WARNING
    assert record.exc_info is not None
