"""What the service reports: OpenTelemetry providers, exporters and session traces (`otel.py`), the metric
instruments (`metrics.py`, with the runtime's series in `runtime_series.py` and the process's in
`process_series.py`) and the process heap under glibc (`memory.py`)."""
