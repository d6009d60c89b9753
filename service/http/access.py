"""The routes' view of who calls: FastAPI dependencies over `service.http.auth.Authenticator`.

`AnyCaller` is the caller of any `/v1` route (an API key or a token, from `Authorization`); `EventCaller` also
reads `?access_token=` (the event stream only). `session_access(need)` is the dependency every route under
`/v1/sessions/{session_id}` authenticates with: it answers the owner to look the session up with, after the caller's
`session_owner` check (404 for a session a token does not name, 403 for a kind of token that may not do `need`); for
a token it also looks the session up and refuses it once the session ended longer than the reconnect grace ago.
A test walks every route of the app with another session's token, so a new route cannot forget it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.http.auth import Authenticator
from service.runtime.runtime import ServiceRuntime
from service.tokens import Caller, Need

__all__ = ["AnyCaller", "EventCaller", "authenticator", "bearer_scheme", "session_access"]

bearer_scheme = HTTPBearer(
    auto_error=False,
    description="An API key (when the service is configured with keys), or a client, session or watch token.",
)


def authenticator(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.authenticator
    return auth


async def _caller(
    request: Request, _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> Caller:
    return await authenticator(request).caller(request.headers.get("authorization"), request.headers.get("origin"))


async def _event_caller(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    access_token: Annotated[
        str | None,
        Query(
            max_length=4096,
            description="A session or watch token, for clients that cannot send headers (a browser's EventSource); "
            "never an API key.",
        ),
    ] = None,
) -> Caller:
    return await authenticator(request).caller(
        request.headers.get("authorization"), request.headers.get("origin"), access_token=access_token
    )


AnyCaller = Annotated[Caller, Depends(_caller)]
EventCaller = Annotated[Caller, Depends(_event_caller)]


def session_access(need: Need, *, events: bool = False) -> Callable[..., Awaitable[str]]:
    """The dependency of a session route doing `need`: the owner to look `session_id` up with. (Two closures, not
    one over a local: FastAPI resolves the annotations by name in this module.)"""

    async def owner_for_session(session_id: str, request: Request, caller: AnyCaller) -> str:
        return await _session_owner(session_id, request, caller, need)

    async def owner_for_events(session_id: str, request: Request, caller: EventCaller) -> str:
        return await _session_owner(session_id, request, caller, need)

    return owner_for_events if events else owner_for_session


async def _session_owner(session_id: str, request: Request, caller: Caller, need: Need) -> str:
    owner = caller.session_owner(session_id, need)
    if caller.grant is not None:
        runtime: ServiceRuntime = request.app.state.runtime
        snapshot = await runtime.lookup(owner, session_id)
        authenticator(request).check_session_alive(snapshot.terminal, snapshot.updated_at)
    return owner
