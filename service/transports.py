"""Choosing and building the transport: the only place the service names a transport implementation.

`build_transport(settings)` returns the transport: `LiveKitTransport` when `LIVEKIT_URL`, `LIVEKIT_API_KEY` and
`LIVEKIT_API_SECRET` are all set (its own rooms, callers' rooms by name, and callers' rooms with the callers' tokens
on the servers `LINGSTREAM_LIVEKIT_CALLER_URLS` allows), or a `LiveKitTransport` with no project of its own when only
`LINGSTREAM_LIVEKIT_CALLER_URLS` is set (every create must bring `livekit.url` and `livekit.token`: a hosted video
provider for LiveKit Agents), else the embedded WebRTC one (`EmbeddedTransport`). A replica runs one transport: the
routes ask that one for capabilities, and a replica that served embedded sessions and callers' LiveKit rooms side
by side would need a router transport answering for both (not built: one deployment per kind is the simpler fit).

It is the wiring point for the transports' constructors; the settings are converted into the transports' config
records here, once (`livekit_config`, `embedded_config`).

The embedded transport gathers ICE host candidates where the service listens: only on the bound address when
`HOST` is one specific IP address (loopback, 127.0.0.1, by default without API keys), and on every interface but
loopback (aioice's default) when it binds every interface (0.0.0.0, ::) or names a host.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import replace
from typing import TypeVar

from service.errors import SettingsError
from service.settings import Settings
from transport.base import Transport
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport
from transport.errors import TransportConfigError
from transport.livekit.config import LiveKitConfig
from transport.livekit.rooms import RoomConfig, room_capacity
from transport.livekit.transport import LiveKitTransport

__all__ = ["build_transport", "embedded_config", "ice_addresses_for_host", "livekit_config"]

logger = logging.getLogger(__name__)


def build_transport(settings: Settings) -> Transport:
    """LiveKit when its three variables are set, else the embedded WebRTC transport. Raises `SettingsError` (a
    start error naming the variables) when only some of the LiveKit variables are set or a value is refused."""
    secret = settings.livekit_api_secret
    project = settings.livekit_enabled or settings.livekit_api_key or (secret is not None and secret.get_secret_value())
    if project or settings.livekit_caller_urls:
        config = livekit_config(settings)
        if config.has_project:
            logger.info("transport: LiveKit at %s (codec %s, %d bit/s)", config.url, config.codec, config.max_bitrate)
        else:
            logger.info("transport: LiveKit for callers' tokens only, on %s", ", ".join(config.caller_urls))
        try:
            return LiveKitTransport(config)
        except TransportConfigError as exc:
            raise SettingsError(f"invalid configuration: the LiveKit transport refused its settings: {exc}") from None
    embedded = embedded_config(settings)
    where = "every interface but loopback" if embedded.ice_host_addresses is None else embedded.ice_host_addresses
    logger.info("transport: embedded WebRTC (no LIVEKIT_URL); ICE host candidates on %s", where)
    return EmbeddedTransport(embedded)


def livekit_config(settings: Settings) -> LiveKitConfig:
    """The LiveKit transport's config from the settings (all three variables, or a `SettingsError`)."""
    secret = settings.livekit_api_secret.get_secret_value() if settings.livekit_api_secret is not None else ""
    present = {
        "LIVEKIT_URL": bool(settings.livekit_url),
        "LIVEKIT_API_KEY": bool(settings.livekit_api_key),
        "LIVEKIT_API_SECRET": bool(secret),
    }
    if not any(present.values()) and settings.livekit_caller_urls:
        present = dict.fromkeys(present, True)  # no project: callers' tokens only
    if not all(present.values()):
        missing = ", ".join(name for name, given in present.items() if not given)
        raise SettingsError(f"invalid configuration: LiveKit needs all three variables; {missing} missing")
    try:
        config = LiveKitConfig(
            url=settings.livekit_url or "",
            api_key=settings.livekit_api_key or "",
            api_secret=secret,
            caller_urls=settings.livekit_caller_urls,
            client_url=settings.livekit_client_url,
            reconnect_grace=settings.reconnect_grace,
            codec=settings.video_codec,
            max_bitrate=settings.video_bitrate,
            max_viewers=settings.max_viewers,
            room=RoomConfig(max_participants=room_capacity(settings.max_viewers)),
        )
        return _with_idle_frame_interval(config, settings)
    except TransportConfigError as exc:
        raise SettingsError(f"invalid configuration: the LiveKit transport refused its settings: {exc}") from None


def embedded_config(settings: Settings) -> EmbeddedConfig:
    """The embedded transport's config: ICE host candidates follow `HOST` (see `ice_addresses_for_host`)."""
    try:
        config = EmbeddedConfig(
            ice_host_addresses=ice_addresses_for_host(settings.host or "127.0.0.1"),
            reconnect_grace=settings.reconnect_grace,
            max_viewers=settings.max_viewers,
        )
        return _with_idle_frame_interval(config, settings)
    except TransportConfigError as exc:
        raise SettingsError(f"invalid configuration: the embedded transport refused its settings: {exc}") from None


_Config = TypeVar("_Config", LiveKitConfig, EmbeddedConfig)


def _with_idle_frame_interval(config: _Config, settings: Settings) -> _Config:
    """`config` with LINGSTREAM_IDLE_FRAME_INTERVAL_MS when it is set; else the transport keeps its own default
    (keep-warm on LiveKit, off on the embedded transport)."""
    if settings.idle_frame_interval_ms is None:
        return config
    return replace(config, idle_frame_interval=settings.idle_frame_interval_ms / 1000)


def ice_addresses_for_host(host: str) -> tuple[str, ...] | None:
    """Where the embedded transport gathers ICE host candidates for a service bound to `host`.

    One specific IP address (e.g. 127.0.0.1, the default without API keys): that address only, so a loopback
    service never announces the machine's other addresses. `localhost`: 127.0.0.1. Every interface (0.0.0.0, ::)
    or a host name: None, aioice's default (every interface except loopback).
    """
    if host == "localhost":
        return ("127.0.0.1",)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if address.is_unspecified:
        return None
    return (str(address),)
