"""ZooKeeper's URL: `zookeeper://` parsed into a `ZooKeeperTarget` (hosts, chroot, timeout)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl

from .._logic.urls import option_shown, redact, seconds_option, shown_part, userinfo_end

DEFAULT_PORT = 2181
DEFAULT_TIMEOUT = 2.0
"""Seconds: how long one request (and the first connection) may take before it is a `BackendError`."""

SCHEME = "zookeeper"


@dataclass(frozen=True)
class ZooKeeperTarget:
    hosts: tuple[tuple[str, int], ...]
    chroot: str         # "" or "/a/b": every path fencelock uses starts with it
    timeout: float      # seconds, per request and for the first connection
    shown: str          # for messages

    @property
    def hosts_string(self) -> str:
        """What kazoo takes: `h1:2181,h2:2181` (IPv6 hosts in brackets)."""
        return ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in self.hosts)


def parse_zookeeper_url(url: object) -> ZooKeeperTarget:
    """`zookeeper://host[:port][,host[:port]...][/chroot][?timeout=2]`; a bad URL is a ValueError naming `url`."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")

    shown = redact(url)  # never show credentials

    def bad(why: str) -> ValueError:
        return ValueError(f"url {shown!r} is not a valid ZooKeeper URL: {why}")

    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != SCHEME:
        raise bad("it must start with zookeeper://")
    if userinfo_end(rest) >= 0:
        raise bad("credentials in the URL are not supported")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    if not netloc:
        raise bad("it has no host")
    hosts: list[tuple[str, int]] = []
    for part in netloc.split(","):
        match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([A-Za-z0-9._-]+)(?::(\d+))?", part)
        if match is None:
            raise bad(f"{shown_part(part)} is not host[:port]")
        host = match.group(1) or match.group(3)
        port_text = match.group(2) or match.group(4)
        port = DEFAULT_PORT if port_text is None else int(port_text)
        if not 0 < port < 65536:
            raise bad(f"port {port} is not a server port")
        hosts.append((host, port))
    if len(set(hosts)) != len(hosts):
        raise bad("a server is listed twice")
    chroot = ""
    if slash and path.strip("/"):
        parts = path.strip("/").split("/")
        if parts[0] == "zookeeper":
            raise bad("/zookeeper is ZooKeeper's own subtree")
        for part in parts:
            if part in ("", ".", "..") or not _valid_component(part):
                raise bad(f"the chroot path component {part!r} is not allowed")
        chroot = "/" + "/".join(parts)
    timeout = DEFAULT_TIMEOUT
    seen = False
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key != "timeout":
            raise bad(f"unknown option {option_shown(key)} (the one option is timeout, in seconds)")
        if seen:
            raise bad("option timeout is given twice")
        timeout, seen = seconds_option(key, value, bad), True
    return ZooKeeperTarget(tuple(hosts), chroot, timeout, shown)


def _valid_component(part: str) -> bool:
    return not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xF8FF or ord(c) >= 0xFFF0
                   for c in part)
