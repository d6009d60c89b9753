"""The session runtime: the service's sessions wired to admission, the model workers and the transport
(`runtime.py`), each admitted session's life (`runner.py`), the session record and its lifecycle (`sessions.py`), what
a transport attaches to (`port.py`), the runtime's records (`records.py`), building the workers (`workers.py`), and
the small parts they use (`fanout.py`, `tasks.py`, `images.py`, `config_view.py`)."""
