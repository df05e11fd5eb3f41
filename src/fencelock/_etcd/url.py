"""etcd's URLs: `etcd://` and `etcds://` parsed into an `EtcdTarget` (members, TLS, credentials, timeout)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

from .._logic.urls import option_shown, redact, seconds_option, shown_part, userinfo_end

DEFAULT_TIMEOUT = 2.0
"""Seconds per request (connect, read). A stopped member gives a `BackendError` within about this."""

DEFAULT_PORT = 2379

_SCHEMES = {"etcd": False, "etcds": True}
_FLOAT_OPTIONS = {"timeout"}
_FILE_OPTIONS = {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile"}


@dataclass(frozen=True)
class EtcdTarget:
    """A parsed `etcd://` or `etcds://` URL."""

    endpoints: tuple[str, ...]          # base URLs of the members' JSON gateways ("http://host:port")
    tls: bool
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    shown: str = ""                     # for messages: endpoints and user, never the password


def is_etcd_url(target: object) -> bool:
    return isinstance(target, str) and target.split(":", 1)[0].lower() in _SCHEMES


def parse_etcd_url(url: str) -> EtcdTarget:
    """`etcd[s]://[user:password@]host[:port][,host[:port]...][/][?timeout=2&ssl_ca_certs=...]`."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ValueError(f"url {redact(url)!r} is not a valid etcd URL: the scheme must be etcd or etcds")
    tls = _SCHEMES[scheme.lower()]
    username = password = None
    at = userinfo_end(rest)  # the userinfo first: a password may hold an unescaped `/`, `?` or `#`
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1:]
        user, has_password, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    rest, _, query = rest.partition("?")
    rest, _, fragment = rest.partition("#")
    netloc, _, path = rest.partition("/")
    shown = redact(url).partition("?")[0].rstrip("/")

    def bad(why: str) -> ValueError:
        return ValueError(f"url {shown!r} is not a valid etcd URL: {why}")

    if path.strip("/") or fragment:
        raise bad("it must not have a path (the lock names' prefix is connect(prefix=...))")
    if (username is None) != (password is None):
        raise bad("give both a user and a password, as user:password@")
    if not netloc:
        raise bad("it has no host")
    endpoints: list[str] = []
    for part in netloc.split(","):
        host, port = _host_port(part.strip(), bad)
        endpoint = f"{'https' if tls else 'http'}://{host}:{port}"
        if endpoint in endpoints:
            raise bad(f"{host}:{port} is listed twice")
        endpoints.append(endpoint)
    options: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in options:
            raise bad(f"option {key} is given twice")
        if key in _FLOAT_OPTIONS:
            options[key] = seconds_option(key, value, bad)
        elif key in _FILE_OPTIONS:
            if not tls:
                raise bad(f"{key} needs etcds:// (TLS)")
            if not value:
                raise bad(f"{key} needs a file name")
            options[key] = value
        else:
            raise bad(f"unknown option {option_shown(key)}")
    return EtcdTarget(tuple(endpoints), tls, username, password, shown=shown, **options)


def _host_port(part: str, bad: Any) -> tuple[str, int]:
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d*))?|([^:\[\]\s/]+)(?::(\d*))?", part)
    if not match:
        raise bad(f"{shown_part(part)} is not host[:port]")
    host = f"[{match[1]}]" if match[1] else match[3]
    digits = match[2] if match[1] else match[4]
    if digits == "":
        raise bad(f"{part!r} has an empty port")
    port = DEFAULT_PORT if digits is None else int(digits)
    if not 0 < port < 65536:
        raise bad(f"port {port} is not a server port")
    return host, port
