"""What the service reports: OpenTelemetry providers, exporters and session traces (`otel.py`), the metric
instruments (`metrics.py`) and the process heap under glibc (`memory.py`)."""
