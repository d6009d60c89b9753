"""The session runtime: the service's sessions wired to admission, the model workers and the transport.

`runtime.py` is `ServiceRuntime`, which owns the sessions' records; `backend.py` the seam to session admission
(`AdmissionBackend`, and `AdmissionHost`, the runtime as a backend sees it); `memory.py` the default backend, this
instance's own admission in memory (`service.scaleout` holds the one shared by replicas); `runner.py` each admitted
session's life on its worker (`SessionRunner`); `sessions.py` the session record and its lifecycle; `port.py` what a
transport attaches to; `records.py` the runtime's records (tuning, statistics, readiness, the observer protocol);
`recordings.py` the recordings of sessions created with `"record": true` (`RecordingStore`);
`workers.py` building the model workers and `transports.py` the transport; and the small parts they use
(`fanout.py`, `tasks.py`, `images.py`, `config_view.py`). Nothing here imports `service.scaleout`.
"""
