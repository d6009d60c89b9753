"""An app's backend in miniature for the browser tests: the token endpoint docs/integrate.md describes.

`TokenEndpoint` serves `POST /token` on loopback: it mints a client token from lingstream (`target`, set once the
service runs: the service must know this endpoint's URL first) with the app's API key (one create, bound to the
page's origin, which is the service's own: it serves the page) and answers `{"token": ...}`, with the CORS headers a
page on another origin needs to read it (the page's cookies would authenticate the user here; the test has none).
`minted` counts the tokens it handed out.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

__all__ = ["TokenEndpoint", "token_endpoint"]


class TokenEndpoint:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self.minted = 0
        self.target = ""  # the lingstream service's URL, also the page's origin

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/token"


@contextmanager
def token_endpoint(api_key: str) -> Iterator[TokenEndpoint]:
    """A running token endpoint minting with `api_key` from the service at its `target`, for that service's page."""
    holder: list[TokenEndpoint] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, object]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Access-Control-Allow-Origin", holder[0].target)
            self.send_header("Access-Control-Allow-Credentials", "true")
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self) -> None:
            endpoint = holder[0]
            if self.headers.get("Origin") != endpoint.target:
                self._answer(403, {"error": "unknown origin"})
                return
            minted = httpx.post(
                f"{endpoint.target}/v1/client_tokens",
                headers={"Authorization": f"Bearer {api_key}"},
                json={"max_creates": 1, "ttl_seconds": 60, "origins": [endpoint.target]},
                timeout=10.0,
            )
            if minted.status_code != 201:
                self._answer(502, {"error": minted.text})
                return
            endpoint.minted += 1
            self._answer(200, {"token": minted.json()["token"]})

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(TokenEndpoint(server))
    thread = threading.Thread(target=server.serve_forever, name="token-endpoint", daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
