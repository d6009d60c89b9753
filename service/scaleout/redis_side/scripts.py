"""The Lua scripts of shared admission, as one table. Each runs atomically in Redis, so no decision ever races another.

`SCRIPTS` maps a script's name to its full source: the usage constants and the shared prelude
(`prelude.py`), then its body: the ticket scripts in `ticket_scripts.py`, the maintenance, drain, overview and
usage scripts in `maintenance_scripts.py`, adoption's in `adoption_scripts.py`.

Calling convention (every script): no KEYS (every key is derived from the prefix, see the package docstring); the
first six ARGV are a header, the script's own arguments follow from ARGV[7]:

    ARGV[1] key prefix    ARGV[2] calling replica id (BY)    ARGV[3] TTL of finished tickets (ms)
    ARGV[4] event stream MAXLEN (approximate)    ARGV[5] the caller's replica info ("workers|slots|mask|draining|
    reserved|generation"; the generation grows with every change, so an older info never replaces a newer one)
    ARGV[6] how long a payload outlives admission (ms)

Every script returns `{code, result, events, queue_depth, taken}`: `code` is "ok" or a script-specific outcome,
`events` the ticket events it appended to the stream (the caller delivers them locally at once), `taken` the
`id, payload` pairs it admitted onto BY. Time is Redis `TIME` (ms): deadlines never depend on replicas' clocks.

Invariants every script keeps (tests read Redis to check them after each step):

- a ticket is in `queue` (and `qdl`, and `hbdl` when heartbeats are on) iff its state is `queued`;
- a ticket is in `held:<r>` with worker w iff its state is `admitted` on replica r, worker w, and it is not in
  `orphans` (an admitted session whose replica was lost, or handed it off, waiting for an adopter: in no `held`);
- no worker of a replica holds more than its slots (only `pick` chooses a worker, and only for BY itself);
- `live` holds exactly the queued and admitted tickets; finished ones carry a TTL and no payload;
- `kq:<owner>` / `kr:<owner>` hold exactly the owner's queued / admitted tickets (the quota counts);
- usage is counted once per transition: a session at its create, its wait when it leaves the queue, its running
  time up to the mark `um` (moved by every count) at the owner's heartbeats and at its release, which happens once.
- the queue is strict FIFO: only its head is ever admitted, and expiry takes the earliest deadline first.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from service.scaleout.redis_side.adoption_scripts import ADOPTION_SCRIPTS
from service.scaleout.redis_side.maintenance_scripts import MAINTENANCE_SCRIPTS
from service.scaleout.redis_side.prelude import PRELUDE, USAGE_CONSTANTS
from service.scaleout.redis_side.ticket_scripts import TICKET_SCRIPTS

__all__ = ["SCRIPTS"]

SCRIPTS: Mapping[str, str] = MappingProxyType(
    {
        name: USAGE_CONSTANTS + PRELUDE + body
        for name, body in {**TICKET_SCRIPTS, **MAINTENANCE_SCRIPTS, **ADOPTION_SCRIPTS}.items()
    }
)
"""Script name -> full Lua source (the usage constants, the shared prelude, then the body)."""
