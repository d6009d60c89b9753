"""Scale-out on Redis: one admission queue and session registry across replicas. `backend.py` is the runtime's
`AdmissionBackend` on Redis (`RedisAdmissionBackend`: adoption, hand-over, the status writers, the registry reads),
`admission.py` the shared admission itself (`RedisAdmission`), `registry.py` the session registry as the service
reads it, `lua/` the Lua scripts and their Python mirror. Nothing outside this package and the app's wiring imports
it: the base modules (`service.errors`, `service.runtime`) define what it raises and reports."""
