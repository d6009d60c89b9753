"""Usage metering per API key: session-seconds running and queued, sessions, chunks and frames.

`ledger.py` holds the counts in time buckets (`UsageLedger`, pure) and the record they are read as
(`UsageTotals`); `meter.py` turns one instance's admission events and generated chunks into them (`UsageMeter`,
pure, for the in-memory admission); `query.py` parses and checks `GET /v1/usage?since=`. With the redis backend the
counts live in Redis instead, written by the admission scripts (`service.scaleout.redis_side`); docs/scale-out.md, §12.
"""

from __future__ import annotations

from service.usage.ledger import USAGE_BUCKET_S, USAGE_RETENTION_S, UsageLedger, UsageReport, UsageTotals
from service.usage.meter import UsageMeter
from service.usage.query import parse_since

__all__ = [
    "USAGE_BUCKET_S",
    "USAGE_RETENTION_S",
    "UsageLedger",
    "UsageMeter",
    "UsageReport",
    "UsageTotals",
    "parse_since",
]
