"""The FastAPI service: REST, settings, wiring of the layers, auth, telemetry, CLI, the browser page.

Modules at the top: `settings` (the flat environment contract, `Settings`, and `load_settings`), `config_file` (the
optional YAML/JSON file), `config_records` (`ServiceConfig` and the records `Settings` becomes, once, at start),
`errors` (the one exception → HTTP table), `api_keys`, `logs`, `app` (`create_app`, the composition root) with
`workers` and `transports` beside it (which model worker and transport implementations are built), `server`
(uvicorn with SIGTERM → drain), `cli` and `play`. Subpackages: `runtime/` (sessions wired to admission, model
workers and the transport; drain), `http/` (routes, schemas, auth, middleware, the page), `scaleout/` (admission
and the session registry shared through Redis), `usage/` (metering), `telemetry/` (metrics, traces, the heap) and
`offline/` (generation without a server). Importing the package imports nothing else, so `lingstream drain` (a
preStop hook) starts fast.
"""
