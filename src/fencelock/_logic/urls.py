"""Parsing and validation of lock-service URLs, before any connection is made.

    redis://[[user]:[password]@]host[:port][/db][?socket_timeout=2&socket_connect_timeout=2]
    rediss://...                       the same over TLS
    redis+cluster://host[:port]        a Redis Cluster (any node; the others are discovered)
    rediss+cluster://...               the same over TLS
    unix:///path/to/redis.sock[?db=0]

A malformed URL raises `ValueError` naming the `url` argument; the password is never shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

DEFAULT_SOCKET_TIMEOUT = 2.0
"""Seconds. A stopped server gives a `BackendError` within this, instead of redis-py's 5 s and ten retries."""

_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}
_FLOAT_OPTIONS = {"socket_timeout", "socket_connect_timeout"}
_PASSED_OPTIONS = {"db", "password", "username", "ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile",
                   "ssl_check_hostname", "client_name", "protocol"}


@dataclass(frozen=True)
class RedisTarget:
    url: str                      # what redis-py's from_url gets (scheme without "+cluster", our options removed)
    cluster: bool
    options: dict[str, float] = field(default_factory=dict)
    shown: str = ""               # the URL with the password masked, for messages


def redact(url: str) -> str:
    """The URL with any password replaced by `***`."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        userinfo = f"{parts.username or ''}:***@"
        host = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit(parts._replace(netloc=userinfo + host))
    except ValueError:
        return "<unparsable URL>"


ALL_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster", "unix", "etcd", "etcds", "zookeeper")
"""Every scheme `connect()` takes, for error messages (etcd and ZooKeeper URLs are told apart before Redis's)."""


def parse_redis_url(url: object) -> RedisTarget:
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    shown = redact(url)

    def bad(why: str) -> ValueError:
        return ValueError(f"url {shown!r} is not a valid lock-service URL: {why}")

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise bad(str(exc)) from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise bad(f"the scheme must be one of {', '.join(ALL_SCHEMES)} (or give a list of 3 or more redis:// "
                  "URLs for Redlock)")
    if scheme == "unix":
        if not parts.path:
            raise bad("a unix:// URL needs a socket path")
    else:
        if not parts.hostname:
            raise bad("it has no host")
        if port == 0:
            raise bad("port 0 is not a server port")
        path = parts.path.strip("/")
        if path and not (path.isdigit() and not scheme.endswith("+cluster")):
            raise bad("the path must be a database number (and Redis Cluster has only database 0)")
    options: dict[str, float] = {}
    passed: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _FLOAT_OPTIONS:
            options[key] = seconds_option(key, value, bad)
        elif key in _PASSED_OPTIONS:
            passed.append((key, value))
        else:
            raise bad(f"unknown option {key!r}")
    cluster = scheme.endswith("+cluster")
    base_scheme = scheme.removesuffix("+cluster")
    query = urlencode(passed)
    client_url = urlunsplit(parts._replace(scheme=base_scheme, query=query))
    return RedisTarget(client_url, cluster, options, shown)


def seconds_option(key: str, value: str, bad: Callable[[str], ValueError]) -> float:
    """A URL option given in seconds (`?timeout=2.5`): a finite positive number, or `bad(why)` is raised. Every
    lock-service URL reads its durations through this."""
    try:
        number = float(value)
    except ValueError:
        raise bad(f"{key} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise bad(f"{key} must be a positive number of seconds, got {value!r}")
    return number
