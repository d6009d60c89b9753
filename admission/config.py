"""The admission layer's configuration and its statistics record.

`service/settings.py` converts its validated settings into an `AdmissionConfig` once, at start. The values here
change only this layer: `max_sessions_per_worker` bounds retained sessions per worker and nothing else (not the
instance count, not the execution lease, not pipeline edge capacities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from admission.errors import AdmissionConfigError
from admission.quota import UNLIMITED, KeyQuota
from admission.summary import DurationSummary

__all__ = ["AdmissionConfig", "AdmissionStatistics"]


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Limits and estimates for session admission; every value is checked at construction.

    - `num_workers`: model workers on this instance (one per GPU group).
    - `max_sessions_per_worker`: retained (admitted, alive) sessions a worker may hold.
    - `queue_size`: bounded FIFO length; a create that finds it full is rejected. 0 means reject when full.
    - `queue_timeout`: seconds a ticket may wait before it becomes `expired`.
    - `queue_heartbeat_timeout`: seconds a waiting client may stay silent before it loses its place; None turns
      heartbeat expiry off (for callers that are not remote clients, e.g. offline generation).
    - `default_session_seconds`: the session length assumed for Retry-After before any session has ended.
    - `session_length_window`: how many recent session lengths the Retry-After estimate averages.
    - `wait_window`: how many recent queue waits `statistics().queue_wait` summarises.
    - `finished_history`: how many finished tickets stay readable by `get()` (overflow: forget the oldest).
    - `max_retry_after_s`: upper clamp of the Retry-After estimate.
    - `default_quota`: every owner's `KeyQuota` (see `admission.quota`) unless `key_quotas` names it;
      `key_quotas` holds `(owner, quota)` pairs, each owner at most once.
    """

    num_workers: int = 1
    max_sessions_per_worker: int = 1
    queue_size: int = 16
    queue_timeout: float = 300.0
    queue_heartbeat_timeout: float | None = 30.0
    default_session_seconds: float = 60.0
    session_length_window: int = 32
    wait_window: int = 1024
    finished_history: int = 1024
    max_retry_after_s: int = 3600
    default_quota: KeyQuota = UNLIMITED
    key_quotas: tuple[tuple[str, KeyQuota], ...] = ()

    def __post_init__(self) -> None:
        _at_least("num_workers", self.num_workers, 1)
        _at_least("max_sessions_per_worker", self.max_sessions_per_worker, 1)
        _at_least("queue_size", self.queue_size, 0)
        _positive_seconds("queue_timeout", self.queue_timeout)
        if self.queue_heartbeat_timeout is not None:
            _positive_seconds("queue_heartbeat_timeout", self.queue_heartbeat_timeout)
        _positive_seconds("default_session_seconds", self.default_session_seconds)
        _at_least("session_length_window", self.session_length_window, 1)
        _at_least("wait_window", self.wait_window, 1)
        _at_least("finished_history", self.finished_history, 0)
        _at_least("max_retry_after_s", self.max_retry_after_s, 1)
        if not isinstance(self.default_quota, KeyQuota):
            raise AdmissionConfigError(f"default_quota must be a KeyQuota, got {self.default_quota!r}")
        owners = [owner for owner, _ in self.key_quotas]
        if len(set(owners)) != len(owners):
            raise AdmissionConfigError("key_quotas names an owner twice")
        if any(not isinstance(quota, KeyQuota) for _, quota in self.key_quotas):
            raise AdmissionConfigError("every quota in key_quotas must be a KeyQuota")

    def quota_of(self, owner: str) -> KeyQuota:
        """The owner's quota: its own entry in `key_quotas`, else `default_quota`."""
        for named, quota in self.key_quotas:
            if named == owner:
                return quota
        return self.default_quota

    @property
    def has_quotas(self) -> bool:
        """Whether any owner is bounded at all."""
        return not self.default_quota.unlimited or any(not quota.unlimited for _, quota in self.key_quotas)

    @property
    def capacity(self) -> int:
        """Slots on the whole instance: `num_workers * max_sessions_per_worker`."""
        return self.num_workers * self.max_sessions_per_worker


def _at_least(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AdmissionConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _positive_seconds(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise AdmissionConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class AdmissionStatistics:
    """A snapshot of the admission controller, read by metrics, health and tests.

    `retained[i]` is the number of admitted sessions on worker i; `healthy[i]` whether it admits. Totals count
    since start: `queued_total` tickets that entered the queue, `admitted_total` admissions (at once or from the
    queue), `rejected_total` refused creates (of which `rejected_draining_total` while draining and
    `quota_rejected_total` for an owner's quota), `expired_total` queue expiries (of which `heartbeat_lost_total`
    for missed heartbeats), `cancelled_total` queued tickets cancelled, `released_total` admitted sessions that
    ended. `queue_wait` summarises the time from create to admission (0.0 for sessions admitted at once);
    `session_length` the time from admission to release.
    """

    retained: tuple[int, ...]
    healthy: tuple[bool, ...]
    max_sessions_per_worker: int
    queue_depth: int
    queue_size: int
    draining: bool
    queued_total: int
    admitted_total: int
    rejected_total: int
    rejected_draining_total: int
    expired_total: int
    heartbeat_lost_total: int
    cancelled_total: int
    released_total: int
    queue_wait: DurationSummary
    session_length: DurationSummary
    quota_rejected_total: int = 0

    @property
    def retained_total(self) -> int:
        return sum(self.retained)

    @property
    def free_slots(self) -> int:
        """Free slots on healthy workers: what a new create could use right now."""
        return sum(
            self.max_sessions_per_worker - count
            for count, healthy in zip(self.retained, self.healthy, strict=True)
            if healthy
        )
