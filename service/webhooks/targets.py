"""Where a session's webhook events go, and which addresses a caller may name.

A session's targets are, in order: the URLs its API key's `KEY_QUOTAS` entry names (`webhook_urls`), else the
deployment's (`WEBHOOK_URLS`); plus the create's own `webhook_url`, if it gave one. The operator's URLs are trusted
configuration (they may name an in-cluster receiver). A caller's URL is not: it must start with one of
`WEBHOOK_ALLOWED_PREFIXES` (none configured: a create that names one is refused), must be http(s) without
credentials, and its host must not resolve to a loopback, private, link-local, multicast or otherwise reserved
address unless `WEBHOOK_ALLOW_PRIVATE` says so explicitly (tests with loopback receivers; an operator whose
receivers are internal). The address check runs at the create and again before every delivery to that URL (a name
that resolved to a public address at the create and to an internal one later is refused then: DNS rebinding).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from service.errors import WebhookUrlRefusedError
from service.settings import webhook_url_problem as url_problem

__all__ = ["WebhookTargets", "check_public", "redact_url", "url_problem"]


def redact_url(url: str) -> str:
    """`url` as logs and errors show it: scheme, host and port only (a path or query may carry a token)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}/…"
    except ValueError:
        return "<invalid url>"


def _internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


async def check_public(url: str) -> None:
    """Raise `WebhookUrlRefusedError` unless every address the URL's host resolves to is a public one (the
    resolution runs in a worker thread)."""
    host = urlsplit(url).hostname or ""
    try:
        infos = await asyncio.to_thread(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
    except OSError:
        raise WebhookUrlRefusedError(f"webhook_url {redact_url(url)}: its host does not resolve") from None
    addresses = {info[4][0] for info in infos}
    if not addresses or any(_internal(str(address)) for address in addresses):
        raise WebhookUrlRefusedError(
            f"webhook_url {redact_url(url)}: its host resolves to an internal address "
            "(loopback, private, link-local or reserved), which this service does not call"
        )


@dataclass(frozen=True, slots=True)
class WebhookTargets:
    """The configured endpoints (see the module docstring). `by_owner` maps an owner to its key's own list (which
    replaces `deployment` for that owner's sessions; an empty list: none)."""

    deployment: tuple[str, ...] = ()
    by_owner: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    allowed_prefixes: tuple[str, ...] = ()
    allow_private: bool = False

    @property
    def configured(self) -> bool:
        """Whether any session can have a webhook endpoint."""
        return bool(self.deployment or any(self.by_owner.values()) or self.allowed_prefixes)

    def of(self, owner: str, own: str | None) -> tuple[str, ...]:
        """The endpoints of a session of `owner` created with webhook_url `own`."""
        urls = self.by_owner.get(owner, self.deployment)
        return (*urls, own) if own is not None and own not in urls else urls

    async def check_own(self, url: str) -> str:
        """A create's `webhook_url`, checked; raises `WebhookUrlRefusedError` with a sentence saying why."""
        problem = url_problem(url)
        if problem is not None:
            raise WebhookUrlRefusedError(f"webhook_url is refused: {problem}")
        if not self.allowed_prefixes:
            raise WebhookUrlRefusedError(
                "webhook_url is refused: this service takes no per-session webhook URL "
                "(LINGSTREAM_WEBHOOK_ALLOWED_PREFIXES is empty)"
            )
        if not any(url.startswith(prefix) for prefix in self.allowed_prefixes):
            raise WebhookUrlRefusedError(
                f"webhook_url {redact_url(url)} is refused: it is under none of the allowed prefixes"
            )
        if not self.allow_private:
            await check_public(url)
        return url
