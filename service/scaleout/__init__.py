"""Scale-out on Redis: one admission queue and session registry across replicas. `backend.py` is the runtime's
`AdmissionBackend` on Redis (`RedisAdmissionBackend`: events, hand-over, the registry reads), `ownership.py` the
sessions it runs (adoption, the status writers, the releases); `admission.py` the shared admission itself
(`RedisAdmission`), with its ticket calls in `tickets.py`, its script plumbing and contact state in `link.py` and
its background loops in `maintenance.py`; `registry.py` the session registry as the service reads it;
`redis_side/` the Lua scripts (Python modules holding Lua) and their Python mirror. Nothing outside this package
and the app's wiring imports it: the base modules (`service.errors`, `service.runtime`) define what it raises
and reports."""
