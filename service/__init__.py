"""The FastAPI service: REST, settings, wiring of the layers, auth, telemetry, CLI, the browser page.

Modules: `settings` (environment and config file → `ServiceConfig`), `errors` (the one exception → HTTP table),
`sessions` (the session lifecycle and record), `fanout` (bounded drop-oldest broadcasts), `port` (`SessionPort`
for transports), `runtime` (sessions wired to admission, model workers and the transport; drain), `api` (routes),
`app` (`create_app`), `middleware` (body size bound), `auth`, `images`, `metrics`, `logs`, `tasks`, `workers`
(which model worker and transport implementations are built), `server` (uvicorn with SIGTERM → drain) and `cli`.
Importing the package imports nothing else, so `lingstream drain` (a preStop hook) starts fast.
"""
