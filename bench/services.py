"""The servers the chosen contenders need, started once per run and shared by every row that needs the same.

Today: one Redis-compatible server for the single-node rows ("redis"), and up to N more, independent ones for
the Redlock rows ("redlock": `fencelock.testing.servers.RedisServer` each), etcd, and one standalone ZooKeeper
("zookeeper": `fencelock.testing.zookeeper.ZooKeeperServer`). To add a service,
teach `Services.target()` to start it; a need it cannot meet raises `Unavailable`, and the rows that need it are
skipped with the reason, the others still run.

The Redlock nodes are apart from the single-node server (no row sees another's keys or load, and the node
markers fencelock's Redlock writes stay on Redlock nodes). Each deployment size has nodes of its own: the 3-node
rows do not use the 5-node rows' nodes. Sharing them would be one node in two deployments: fencelock marks the
nodes of the deployment that used them first, so the other deployment's unmarked nodes look like nodes that lost
their data, and it runs with them quarantined (a 5-node row on 3 counting nodes, for `repair_delay`). The rows of
one size share their nodes; only one row runs at a time, so they never compete.
"""

from __future__ import annotations

import re
import socket
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

import redis

from fencelock.testing.etcd import EtcdCluster, EtcdServer
from fencelock.testing.servers import RedisServer
from fencelock.testing.zookeeper import ZooKeeperServer, four_letter_word

from .contenders import Need, Target
from .delay import DelayProxy, DelayStats


class Unavailable(RuntimeError):
    """A need this machine cannot meet (no binary, not supported yet)."""


class Services:
    """`latency_ms` > 0: every client reaches every server through a delay proxy of its own (`bench.delay`)."""

    def __init__(self, latency_ms: float = 0.0) -> None:
        self.latency_ms = latency_ms
        self._proxies: dict[str, DelayProxy] = {}  # "host:port" of a server -> its proxy
        self._workdir = Path(tempfile.mkdtemp(prefix="fencelock-bench-delay-"))
        self._stack = ExitStack()
        self._redis: list[RedisServer] = []
        self._redlock: dict[int, list[RedisServer]] = {}  # nodes per deployment size
        self._targets: dict[Need, Target] = {}
        self._etcd: list[EtcdCluster] = []
        self._zookeeper: ZooKeeperServer | None = None

    def target(self, need: Need) -> Target:
        if need not in self._targets:
            found = self._start(need)
            self._targets[need] = Target(found.service, tuple(self._through_proxy(url) for url in found.urls))
        return self._targets[need]

    def _through_proxy(self, url: str) -> str:
        """`url` with every 127.0.0.1:port in it replaced by a delay proxy's (as is, without --latency)."""
        if self.latency_ms <= 0:
            return url

        def proxied(match: re.Match[str]) -> str:
            address = match.group(0)
            if address not in self._proxies:
                self._proxies[address] = DelayProxy("127.0.0.1", int(match.group(1)), self.latency_ms,
                                                    self._workdir)
            return f"127.0.0.1:{self._proxies[address].port}"

        return re.sub(r"127\.0\.0\.1:(\d+)", proxied, url)

    def round_trip_ms(self) -> float | None:
        """The median PING round trip through one Redis server's proxy (None: no proxy in front of a Redis)."""
        for server in self._all():
            proxy = self._proxies.get(f"127.0.0.1:{server.port}")
            if proxy is None:
                continue
            with socket.create_connection(("127.0.0.1", proxy.port)) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                times = []
                for _ in range(200):
                    began = time.perf_counter()
                    s.sendall(b"PING\r\n")
                    got = b""
                    while not got.endswith(b"\r\n"):
                        got += s.recv(64)
                    times.append((time.perf_counter() - began) * 1000.0)
            return statistics.median(times)
        return None

    def proxy_pids(self) -> list[int]:
        """PIDs of the delay proxies (latency mode), for their CPU per cycle."""
        return [proxy.proc.pid for proxy in self._proxies.values()]

    def proxy_stats(self) -> list[DelayStats]:
        """Stop the delay proxies and say what each measured (how late it forwarded, its CPU)."""
        stats = [proxy.stop() for proxy in self._proxies.values()]
        self._proxies.clear()
        return stats

    def _grow(self, pool: list[RedisServer], nodes: int, name: str) -> None:
        while len(pool) < nodes:
            try:
                server = RedisServer(name=f"{name}{len(pool)}")
            except RuntimeError as exc:  # no server binary
                raise Unavailable(str(exc)) from exc
            try:
                pool.append(self._stack.enter_context(server))
            except RuntimeError as exc:  # it did not start
                raise Unavailable(f"{name}{len(pool)} did not start: {exc}") from exc

    def _start(self, need: Need) -> Target:
        if need.service in ("redis", "redlock"):
            if need.service == "redlock" and need.nodes < 3:
                raise Unavailable(f"{need}: Redlock needs at least 3 nodes")
            if need.service == "redis":
                pool, name = self._redis, "bench"
            else:
                pool, name = self._redlock.setdefault(need.nodes, []), f"bench-redlock{need.nodes}-"
            self._grow(pool, need.nodes, name)
            return Target(need.service, tuple(s.url for s in pool[:need.nodes]))
        if need.service == "etcd":
            try:
                cluster = EtcdServer() if need.nodes == 1 else EtcdCluster(need.nodes)
                self._etcd.append(self._stack.enter_context(cluster))
            except RuntimeError as exc:  # no etcd binary, or it did not start
                raise Unavailable(str(exc)) from exc
            return Target("etcd", (cluster.url,))
        if need.service == "zookeeper":
            if need.nodes != 1:
                raise Unavailable(f"{need}: only a standalone ZooKeeper is started here")
            try:
                self._zookeeper = self._stack.enter_context(ZooKeeperServer(name="bench-zk", durable=True))
            except RuntimeError as exc:  # no server, or it did not start
                raise Unavailable(str(exc)) from exc
            return Target("zookeeper", (self._zookeeper.url("/bench"),))
        raise Unavailable(f"no way to start {need} yet (bench/services.py)")

    def server_pids(self) -> list[int]:
        """PIDs of the server processes this run started (for CPU pinning): the single node, the Redlock nodes, etcd,
        ZooKeeper."""
        etcd = [pid for cluster in self._etcd for pid in cluster.pids()]
        zookeeper = [self._zookeeper.pid] if self._zookeeper is not None else []
        return [pid for pid in (*(server.pid for server in self._all()), *etcd, *zookeeper) if pid is not None]

    def pid(self, url: str) -> int | None:
        """The PID of the server this run started at `url` (None: not ours, or not known)."""
        for server in self._all():
            if url in (server.url, self._through_proxy(server.url)):
                return server.pid
        if self._zookeeper is not None and url == self._zookeeper.url("/bench"):
            return self._zookeeper.pid
        return None

    def describe(self) -> dict[str, str]:
        """What runs, for the report: binary, version, and the version the server reports itself."""
        out: dict[str, str] = {}
        servers = self._all()
        if servers:
            first = servers[0]
            client = redis.Redis(host=first.host, port=first.port)
            try:
                info = client.info("server")
            finally:
                client.close()
            flavour = "valkey" if "valkey_version" in info else "redis"
            out["server"] = f"{flavour} {info.get(f'{flavour}_version', info.get('redis_version', '?'))}"
            out["server binary"] = first.binary
            out["server nodes"] = ", ".join(
                part for part in (f"{len(self._redis)} single" if self._redis else "",
                                  f"{sum(map(len, self._redlock.values()))} Redlock (independent masters: "
                                  f"{' + '.join(str(n) for n in self._redlock)})" if self._redlock else "")
                if part)
        if self._zookeeper is not None:
            version = four_letter_word(self._zookeeper.host, self._zookeeper.port, "srvr").splitlines()[:1]
            out["zookeeper"] = (version[0].removeprefix("Zookeeper version: ").split("-")[0] if version else "?") + \
                " standalone, tickTime 100 ms, fsync on (zookeeper.forceSync=yes, as etcd fsyncs)"
        return out

    def _all(self) -> list[RedisServer]:
        return [*self._redis, *(server for pool in self._redlock.values() for server in pool)]

    def close(self) -> None:
        for proxy in self._proxies.values():
            proxy.proc.kill()
            proxy.proc.wait(5)
        self._proxies.clear()
        self._stack.close()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
