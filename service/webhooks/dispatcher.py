"""`WebhookDispatcher`: the task that sends what the outbox holds, signed, with bounded retries.

Problem: a session's moments must reach the integrator's endpoints at least once, without a slow or dead endpoint
ever holding up a session, and without unbounded memory. The emitter hands deliveries to `offer` (synchronous,
never waits: a bounded intake, overflow policy *refuse the newest*, counted `dropped`); the dispatcher's one loop
moves them into the `Outbox`, claims what is due (at most `concurrency` in flight), and sends each from a task of
its own with a `timeout_s` bound; the retry schedule (`service.webhooks.schedule.RetryPolicy`) decides what an
answer means. Example::

    dispatcher = WebhookDispatcher(MemoryOutbox(10_000, time.time), secret=b"...", policy=RetryPolicy())
    await dispatcher.start()
    dispatcher.offer([delivery])     # from the event loop; returns at once
    await dispatcher.aclose(grace_s=2)

Ordering: none promised. Deliveries are sent as they come due and concurrently, and a retried one comes after
later events; receivers order by the event's `created_at` and de-duplicate by its `id`. Cancellation: `aclose`
lets pending deliveries go out for up to `grace_s` (with Redis, they are first written there, so another replica
sends them if this one cannot), then cancels the sends in flight (a cancelled send is tried again: in memory it is
lost with the process, in Redis its lease runs out and another claimant takes it). Logs name an endpoint by scheme,
host and port only, never its path, query or the secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from service.errors import WebhookUrlRefusedError
from service.runtime.tasks import TaskSet
from service.webhooks.outbox import Delivery, Outbox, OutboxStatistics
from service.webhooks.schedule import Decision, RetryPolicy, Verdict
from service.webhooks.targets import check_public, redact_url
from transport.webhook_signature import SIGNATURE_HEADER, sign

__all__ = ["DeliveryResult", "DispatcherStatistics", "WebhookDispatcher"]

logger = logging.getLogger(__name__)

DeliveryResult = Callable[[str, float | None], None]
"""Told of each attempt's result (`delivered`, `retried`, `failed`, `dropped`) and, when delivered, the seconds from
the event to its delivery (the metrics' histogram)."""

_USER_AGENT = "lingstream-webhooks/1"


@dataclass(frozen=True, slots=True)
class DispatcherStatistics:
    """`incoming`: offered, not yet in the outbox; `in_flight`: attempts under way; `results`: attempts by result
    since start; `outbox`: the outbox's own figures."""

    incoming: int
    in_flight: int
    results: dict[str, int]
    outbox: OutboxStatistics


class WebhookDispatcher:
    """Sends the outbox's deliveries (see the module docstring). Life: `start()`, `offer(...)`, `aclose()`.

    `clock` is wall-clock seconds (due times are shared by replicas through Redis); `draw` the jitter source;
    `client` an `httpx.AsyncClient` (tests inject one; by default it makes and owns its own); `poll_s` how often
    it looks at the outbox when nothing woke it (other replicas' retries and leases in Redis come due silently).
    """

    def __init__(
        self,
        outbox: Outbox,
        *,
        secret: bytes,
        policy: RetryPolicy | None = None,
        timeout_s: float = 10.0,
        concurrency: int = 32,
        intake: int = 10_000,
        poll_s: float = 1.0,
        allow_private: bool = False,
        clock: Callable[[], float] = time.time,
        draw: Callable[[], float] = random.random,
        client: httpx.AsyncClient | None = None,
        on_result: DeliveryResult | None = None,
    ) -> None:
        self._outbox = outbox
        self._secret = secret
        self._policy = policy or RetryPolicy()
        self._timeout_s = timeout_s
        self._concurrency = concurrency
        self._intake_cap = intake
        self._poll_s = poll_s
        self._allow_private = allow_private
        self._clock = clock
        self._draw = draw
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(follow_redirects=False, trust_env=False)
        self._on_result = on_result
        self._incoming: deque[Delivery] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._sends: set[asyncio.Task[None]] = set()
        self._tasks = TaskSet("webhooks")
        self._results: dict[str, int] = {}
        self._closing = False

    # -- the emitter's side

    def offer(self, deliveries: Sequence[Delivery]) -> None:
        """Queue deliveries for sending (on the event loop; never waits). Past the intake's bound the newest are
        dropped (counted)."""
        for delivery in deliveries:
            if len(self._incoming) >= self._intake_cap:
                self._count("dropped", None)
                logger.warning("webhooks: the intake is full; an event for %s is dropped", redact_url(delivery.url))
                continue
            self._incoming.append(delivery)
        self._idle.clear()
        self._wake.set()

    def statistics(self) -> DispatcherStatistics:
        return DispatcherStatistics(
            incoming=len(self._incoming),
            in_flight=len(self._sends),
            results=dict(self._results),
            outbox=self._outbox.statistics(),
        )

    # -- life

    async def start(self) -> None:
        self._tasks.spawn(self._run(), name="webhook-dispatcher")

    async def wait_idle(self) -> None:
        """Until nothing is offered, in the outbox's due part as this loop last saw it, or in flight (tests)."""
        await self._idle.wait()

    async def aclose(self, grace_s: float = 2.0) -> None:
        """Let pending deliveries go out for up to `grace_s`, then stop (see the module docstring)."""
        if self._closing:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self._idle.wait()
        self._closing = True
        self._wake.set()
        await self._tasks.aclose()
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._flush()  # what was offered at the very end: into Redis, for another replica to send
        await self._outbox.aclose()
        if self._own_client:
            await self._client.aclose()

    # -- the loop

    async def _run(self) -> None:
        failures = 0
        while not self._closing:
            self._wake.clear()
            try:
                await self._flush()
                free = self._concurrency - len(self._sends)
                claimed = await self._outbox.claim(free) if free > 0 else []
                failures = 0
            except Exception:
                failures += 1
                if failures == 1 or failures % 60 == 0:
                    logger.exception("webhooks: the outbox cannot be reached (%d time(s) in a row)", failures)
                claimed = []
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(5.0, 0.2 * failures)):
                        await self._wake.wait()
                continue
            if claimed:
                self._idle.clear()
            for delivery in claimed:
                task = asyncio.get_running_loop().create_task(self._send(delivery), name="webhook-send")
                self._sends.add(task)
                task.add_done_callback(self._sent)
            if not claimed and not self._sends and not self._incoming and self._nothing_due():
                self._idle.set()
            if claimed:
                continue  # more may be due
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._wait_s()):
                    await self._wake.wait()

    def _nothing_due(self) -> bool:
        due = self._outbox.next_due()
        return due is None or due > self._clock()

    def _wait_s(self) -> float:
        due = self._outbox.next_due()
        if due is None:
            return self._poll_s
        return max(0.0, min(self._poll_s, due - self._clock()))

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sends.discard(task)
        self._wake.set()

    async def _flush(self) -> None:
        if not self._incoming:
            return
        batch = list(self._incoming)
        dropped = await self._outbox.put(batch)
        for _ in batch:
            self._incoming.popleft()
        for _ in range(dropped):
            self._count("dropped", None)
        if dropped:
            logger.warning("webhooks: the outbox is full; %d delivery(ies) dropped", dropped)

    async def _send(self, delivery: Delivery) -> None:
        attempt = delivery.tried()
        status: int | None = None
        try:
            if attempt.guarded and not self._allow_private:
                await check_public(attempt.url)
            timestamp = int(self._clock())
            headers = {
                "Content-Type": "application/json",
                "User-Agent": _USER_AGENT,
                SIGNATURE_HEADER: sign(self._secret, attempt.body, timestamp),
                "Lingstream-Event-Id": attempt.event_id,
            }
            request = self._client.build_request(
                "POST", attempt.url, content=attempt.body, headers=headers, timeout=self._timeout_s
            )
            async with asyncio.timeout(self._timeout_s):  # the whole attempt (httpx bounds each phase)
                response = await self._client.send(request, stream=True)  # the answer's body is never read
                status = response.status_code
                await response.aclose()
        except WebhookUrlRefusedError as exc:
            logger.warning("webhooks: %s", exc)
            status = 410  # an endpoint that became internal is not tried again
        except (httpx.HTTPError, OSError) as exc:  # OSError includes the attempt's TimeoutError
            logger.info("webhooks: %s did not answer: %s", redact_url(attempt.url), type(exc).__name__)
        except Exception:  # anything else counts as a failed attempt: the delivery is settled either way
            logger.exception("webhooks: an attempt to %s failed unexpectedly", redact_url(attempt.url))
        now = self._clock()
        decision = self._policy.decide(attempt.attempts, status, now, self._draw())
        try:
            await self._settle(attempt, decision, status, now)
        except Exception:
            # Redis unreachable: the delivery stays claimed until its lease runs out, then it is tried again.
            logger.exception("webhooks: recording the result of event %s failed", attempt.event_id)

    async def _settle(self, attempt: Delivery, decision: Decision, status: int | None, now: float) -> None:
        if decision.verdict is Verdict.DELIVERED:
            await self._outbox.done(attempt)
            self._count("delivered", max(0.0, now - attempt.created_at))
        elif decision.verdict is Verdict.RETRY and decision.retry_at is not None:
            await self._outbox.retry(attempt, decision.retry_at)
            self._count("retried", None)
        else:
            await self._outbox.done(attempt)
            self._count("failed", None)
            logger.warning(
                "webhooks: gave up on event %s for %s after %d attempt(s) (last answer: %s)",
                attempt.event_id,
                redact_url(attempt.url),
                attempt.attempts,
                status if status is not None else "none",
            )

    def _count(self, result: str, seconds: float | None) -> None:
        self._results[result] = self._results.get(result, 0) + 1
        if self._on_result is not None:
            try:
                self._on_result(result, seconds)
            except Exception:
                logger.exception("webhooks: counting a result failed")
