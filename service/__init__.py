"""The FastAPI service: REST, settings, wiring of the layers, auth, telemetry, CLI, the browser page."""
