"""Tokens out of text that may be logged or answered: JWTs (client, session, watch and LiveKit tokens) and the values
of `token=` / `access_token=` query parameters replaced by `[redacted]`.

The LiveKit SDK quotes the whole token in a refused join's error (`401 Unauthorized - invalid token: eyJ...`) and its
native library logs the same line; uvicorn's access log writes query strings that may carry a token. The transports
redact the errors they raise, and the service's log handler redacts every record (`service.logs`).
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_tokens"]

REDACTED = "[redacted]"

_TOKEN_PARAMETER = re.compile(r"((?:^|[?&])(?:access_token|token)=)[^&\s\"']*")
# A JWT: base64url header (JSON, so it starts with `{"` = eyJ), claims and signature, dot-separated.
_JWT = re.compile(r"eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}")


def redact_tokens(text: str) -> str:
    """`text` with the values of `token=` / `access_token=` query parameters and JWT-shaped strings replaced."""
    if "token=" in text:
        text = _TOKEN_PARAMETER.sub(lambda match: match.group(1) + REDACTED, text)
    if "eyJ" in text:
        text = _JWT.sub(REDACTED, text)
    return text
