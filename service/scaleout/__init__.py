"""Scale-out on Redis: one admission queue and session registry across replicas. `admission.py` is the shared
admission, `registry.py` the session registry as the service reads it, `runtime.py` the runtime on that admission,
`lua/` the Lua scripts and their Python mirror."""
