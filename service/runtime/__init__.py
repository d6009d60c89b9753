"""The session runtime: the service's sessions wired to admission, the model workers and the transport.

`runtime.py` is `ServiceRuntime`, the facade the routes call, over parts that each hold one idea: `state.py` its
own lifecycle (`RuntimeState` and its transition table), `session_table.py` the sessions' records (`SessionTable`),
`intake.py` the create path (`SessionIntake`), `conductor.py` what happens to live sessions (`SessionConductor`:
admission's decisions, close, pause, deadlines, the drain), `directory.py` the answers about sessions, here or
through the backend (`SessionDirectory`), `health.py` the model workers' start and readiness (`WorkerHealth`),
`drain.py` the drain (`Drain`) and `host.py` the runtime as its admission backend sees it (`RuntimeHost`).
`backend.py` is the seam to session admission (`AdmissionBackend`, and `AdmissionHost`, its way back);
`memory_backend.py` the default backend, this instance's own admission in memory (`service.scaleout` holds the one
shared by replicas); `runner.py` each admitted session's life on its worker (`SessionRunner`); `sessions.py` the
session record and its lifecycle; `limits.py` the deadlines of running sessions, `pausing.py` pause and resume;
`port.py` what a transport attaches to; `records.py` the runtime's records (tuning, statistics, readiness, the
observer protocol); `recordings.py` the recordings of sessions created with `"record": true` (`RecordingStore`);
and the small parts they use (`fanout.py`, `tasks.py`, `images.py`, `config_view.py`). Which model workers and
transport are built is decided beside the app (`service.workers`, `service.transports`). Nothing here imports
`service.scaleout`.
"""
