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
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .args import MAX_SECONDS

DEFAULT_SOCKET_TIMEOUT = 2.0
"""Seconds. A stopped server gives a `BackendError` within this, instead of redis-py's 5 s and ten retries."""

_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}
_FLOAT_OPTIONS = {"socket_timeout", "socket_connect_timeout"}
_PASSED_OPTIONS = {"db", "password", "username", "ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile",
                   "ssl_check_hostname", "client_name", "protocol"}


@dataclass(frozen=True)
class RedisTarget:
    url: str = field(repr=False)  # what redis-py's from_url gets (scheme without "+cluster", our options removed)
    cluster: bool
    options: dict[str, float] = field(default_factory=dict)
    shown: str = ""               # the URL with the password masked, for messages


_SHOWN_VALUES = {"db", "socket_timeout", "socket_connect_timeout", "timeout", "protocol", "ssl_cert_reqs",
                 "ssl_check_hostname"}
"""Query options whose values are shown in messages; every other option's value is masked (it may be a secret:
`password`, a key file's passphrase, a token)."""

_OPTION_NAME = re.compile(r"[a-z_][a-z0-9_]{0,31}")
"""What an option's name looks like; anything else in a name's place (a password pasted there) is masked."""
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.]{1,32}")
_HOST = r"(?:\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9_.-]{0,253})(?::\d{0,5})?"
_AUTHORITY = re.compile(rf"{_HOST}(?:,{_HOST})*")
"""What a URL's hosts look like (one, or several separated by commas): anything else is not shown."""


def shown_part(part: str) -> str:
    """A piece of a URL quoted in a message, if it looks like a host[:port] (else it may be a password's piece)."""
    return repr(part) if re.fullmatch(_HOST, part) else "a part not shown"


def redact(url: object) -> str:
    """`url` as messages show it: no password in any form, whatever the URL's shape (valid or not).

    The userinfo (everything up to the authority's last `@`, which may hold `/`, `?` or `#` a user forgot to
    escape) becomes `user:***@`, or `***@` without a `:`; query values are masked except a few harmless ones
    (`db`, timeouts); a fragment is dropped. A string without `://` that holds an `@` or a `password` is not shown.
    """
    if not isinstance(url, str):
        return f"<a {type(url).__name__}>"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<a URL without scheme://, not shown>" if "@" in url or "pass" in url.lower() else url
    at = userinfo_end(rest)
    shown_user = ""
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        shown_user = f"{user}:***@" if colon and re.fullmatch(r"[\w.-]{0,64}", user) else "***@"
        rest = rest[at + 1:]
    rest = rest.partition("#")[0]
    base, question, query = rest.partition("?")
    authority, slash, path = base.partition("/")
    if not _AUTHORITY.fullmatch(authority) or (at < 0 and "@" in rest):
        # Not host[:port], or an `@` was left in the query: the authority may be a password's first piece, whose
        # `?`, `/` or `#` hid the `@` after it. Shown as `***` (a query value with an `@` costs the host's name).
        authority = "***"
    shown = f"{scheme}://{shown_user}{authority}{slash}{path}"
    if question:
        pairs = [pair.partition("=") for pair in query.split("&") if pair]
        shown += "?" + "&".join(
            (key if _OPTION_NAME.fullmatch(key) else "***")
            + (("=" + value if key in _SHOWN_VALUES and _PLAIN_VALUE.fullmatch(value)
                else "=***") if eq else "")
            for key, eq, value in pairs)
    return shown


def option_shown(key: str) -> str:
    """An option's name for a message: quoted if it looks like one, else not shown (it may be a password)."""
    return repr(key) if _OPTION_NAME.fullmatch(key) else "(its name is not shown)"


def userinfo_end(rest: str) -> int:
    """Where the userinfo of `scheme://` + `rest` ends (its `@`), or -1. An `@` inside a query value (a
    `?password=a@b`) is not one: the last `@` before a `?...=` that follows it is taken instead."""
    at = rest.rfind("@")
    while at >= 0:
        question = rest.find("?", 0, at)
        if question < 0 or "=" not in rest[question:at]:
            return at
        at = rest.rfind("@", 0, question)
    return -1


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
    except ValueError:
        # (not the parser's own words: they may quote a piece of a password that holds an unescaped `/`)
        raise bad("its host or port cannot be read (escape special characters in a password as %XX)") from None
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
        if path:
            _database(path, bad)
    options: dict[str, float] = {}
    passed: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in seen and (key in _FLOAT_OPTIONS or key in _PASSED_OPTIONS):
            raise bad(f"option {key} is given twice")
        seen.add(key)
        if key in _FLOAT_OPTIONS:
            options[key] = seconds_option(key, value, bad)
        elif key in _PASSED_OPTIONS:
            _check_passed(key, value, scheme, bad)
            passed.append((key, value))
        elif key == "timeout":
            raise bad("unknown option 'timeout' (a Redis URL takes socket_timeout and socket_connect_timeout)")
        else:
            raise bad(f"unknown option {option_shown(key)}")
    if "db" in seen and scheme != "unix" and parts.path.strip("/"):
        raise bad("the database is given twice (in the path and as ?db=)")
    cluster = scheme.endswith("+cluster")
    base_scheme = scheme.removesuffix("+cluster")
    query = urlencode(passed)
    if scheme == "unix":
        # urlunsplit writes `unix:/path` (no authority); redis-py's synchronous parser wants `unix://`.
        client_url = f"unix://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")
    else:
        client_url = urlunsplit(parts._replace(scheme=base_scheme, query=query))
    return RedisTarget(client_url, cluster, options, shown)


MAX_DATABASE = 2**31 - 1
"""The highest database number Redis can take (its `databases` setting is a C int)."""

_BOOLEANS = {"", "0", "1", "f", "t", "n", "y", "no", "yes", "false", "true"}
_CERT_REQS = {"none", "optional", "required"}


def _database(text: str, bad: Callable[[str], ValueError]) -> int:
    if not text.isdigit() or not text.isascii() or int(text) > MAX_DATABASE:
        raise bad(f"the database must be a number from 0 to {MAX_DATABASE}")
    return int(text)


def _value_shown(value: str) -> str:
    return repr(value) if _PLAIN_VALUE.fullmatch(value) else "a value not shown"


def _check_passed(key: str, value: str, scheme: str, bad: Callable[[str], ValueError]) -> None:
    """Refuse a redis-py option value the client or the server cannot take (before anything is sent)."""
    if key == "db":
        _database(value, bad)
        if scheme.endswith("+cluster") and int(value) != 0:
            raise bad("Redis Cluster has only database 0")
    elif key == "protocol" and value not in ("2", "3"):
        raise bad(f"protocol must be 2 or 3, got {_value_shown(value)}")
    elif key == "ssl_cert_reqs" and value.lower() not in _CERT_REQS:
        raise bad(f"ssl_cert_reqs must be one of none, optional, required, got {_value_shown(value)}")
    elif key == "ssl_check_hostname" and value.lower() not in _BOOLEANS:
        raise bad(f"ssl_check_hostname must be true or false, got {_value_shown(value)}")
    elif key == "client_name" and (not value or any(not "!" <= char <= "~" for char in value)):
        raise bad("client_name must be printable ASCII without spaces (Redis refuses any other name)")
    if key.startswith("ssl_") and not scheme.startswith("rediss"):
        raise bad(f"{key} is a TLS option: it needs rediss:// (or rediss+cluster://); redis:// does not use TLS")


MIN_TIMEOUT = 0.001
"""Seconds: no request can be answered in less (a shorter timeout would fail every call on a healthy server)."""


def seconds_option(key: str, value: str, bad: Callable[[str], ValueError]) -> float:
    """A URL option given in seconds (`?timeout=2.5`): a finite positive number, or `bad(why)` is raised. Every
    lock-service URL reads its durations through this."""
    try:
        number = float(value)
    except ValueError:
        raise bad(f"{key} must be a number of seconds, got {_value_shown(value)}") from None
    if not math.isfinite(number) or not MIN_TIMEOUT <= number <= MAX_SECONDS:
        raise bad(f"{key} must be a number of seconds from {MIN_TIMEOUT} to {MAX_SECONDS:.0f} (ten years), "
                  f"got {_value_shown(value)}")
    return number


DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "redis+cluster": 6379, "rediss+cluster": 6379, "etcd": 2379,
                 "etcds": 2379, "zookeeper": 2181}
"""The port a URL of each scheme means when it gives none."""

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "::1"}


def _host(host: str) -> str:
    """A host as `service_nodes` compares it: lower case, without IPv6 brackets, every loopback spelling as
    127.0.0.1 (no name is resolved: this is pure)."""
    host = host.strip().lower().removeprefix("[").removesuffix("]")
    if host in _LOOPBACK_NAMES or host == "0:0:0:0:0:0:0:1":
        return "127.0.0.1"
    return host


def service_nodes(urls: Iterable[str]) -> frozenset[str]:
    """The servers, and the key space on each, that lock-service `urls` name, one canonical string per node:
    `redis 127.0.0.1:6379/0`, `unix /run/redis.sock/0`, `etcd h:2379`, `zookeeper h:2181/chroot`. The same
    server spelled differently (localhost or 127.0.0.1, a default port left out or given, `db` in the path or the
    query, a socket path with `//` or `/./`) is one node. Lenient: works on redacted URLs, and skips what it cannot
    read. Two runs whose nodes overlap lock in one place."""
    nodes: set[str] = set()
    for url in urls:
        scheme, sep, rest = url.strip().partition("://")
        scheme = scheme.lower()
        if not sep:
            continue
        at = userinfo_end(rest)
        rest = rest[at + 1:] if at >= 0 else rest
        rest = rest.partition("#")[0]
        base, _, query = rest.partition("?")
        params = dict(parse_qsl(query, keep_blank_values=True))
        if scheme == "unix":
            db = _db_key(params.get("db", "0"))
            nodes.add(f"unix {posixpath.normpath(base or '/')}/{db}")
            continue
        netloc, _, path = base.partition("/")
        family = "redis" if scheme.startswith("redis") else scheme.removesuffix("s")
        if family == "redis":
            db = _db_key(path.strip("/") or params.get("db", "0"))
            suffix = f"/{db}"
        elif family == "zookeeper":
            suffix = posixpath.normpath("/" + path).rstrip("/") if path.strip("/") else ""
        else:
            suffix = ""
        for member in netloc.split(","):
            host, port = _host_port(member, DEFAULT_PORTS.get(scheme, 0))
            if host:
                nodes.add(f"{family} {host}:{port}{suffix}")
    return frozenset(nodes)


def _db_key(text: str) -> str:
    """A database number as `service_nodes` compares it ("00" and "0" are one)."""
    return str(int(text)) if text.isascii() and text.isdigit() else (text or "0")


def _host_port(member: str, default: int) -> tuple[str, int]:
    """`host[:port]` or `[v6]:port` as (host, port), the port `default` when left out; ("", 0) if unreadable."""
    member = member.strip()
    if member.startswith("["):
        host, _, tail = member[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif member.count(":") == 1:
        host, _, port_text = member.partition(":")
    else:
        host, port_text = member, ""
    try:
        port = int(port_text) if port_text else default
    except ValueError:
        return "", 0
    return _host(host), port
