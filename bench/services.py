"""The servers the chosen contenders need, started once per run and shared by every row that needs the same.

Today: one Redis-compatible server for the single-node rows ("redis"), and up to N more, independent ones for
the Redlock rows ("redlock": `fencelock.testing.servers.RedisServer` each), and one standalone ZooKeeper
("zookeeper": `fencelock.testing.zookeeper.ZooKeeperServer`). To add a service (etcd, ...),
teach `Services.target()` to start it; a need it cannot meet raises `Unavailable`, and the rows that need it are
skipped with the reason, the others still run.

The Redlock nodes are apart from the single-node server (no row sees another's keys or load, and the node
markers fencelock's Redlock writes stay on Redlock nodes). The Redlock rows share them: a 3-node row uses the first
three of the 5-node rows' nodes. Only one row runs at a time, so they never compete.
"""

from __future__ import annotations

from contextlib import ExitStack
from types import TracebackType

import redis

from fencelock.testing.servers import RedisServer
from fencelock.testing.zookeeper import ZooKeeperServer, four_letter_word

from .contenders import Need, Target


class Unavailable(RuntimeError):
    """A need this machine cannot meet (no binary, not supported yet)."""


class Services:
    def __init__(self) -> None:
        self._stack = ExitStack()
        self._redis: list[RedisServer] = []
        self._redlock: list[RedisServer] = []
        self._targets: dict[Need, Target] = {}
        self._zookeeper: ZooKeeperServer | None = None

    def target(self, need: Need) -> Target:
        if need not in self._targets:
            self._targets[need] = self._start(need)
        return self._targets[need]

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
            pool = self._redis if need.service == "redis" else self._redlock
            if need.service == "redlock" and need.nodes < 3:
                raise Unavailable(f"{need}: Redlock needs at least 3 nodes")
            self._grow(pool, need.nodes, "bench" if need.service == "redis" else "bench-redlock")
            # Every need of one service shares the first nodes: a 3-node row uses 3 of the 5-node rows' nodes.
            return Target(need.service, tuple(s.url for s in pool[:need.nodes]))
        if need.service == "zookeeper":
            if need.nodes != 1:
                raise Unavailable(f"{need}: only a standalone ZooKeeper is started here")
            try:
                self._zookeeper = self._stack.enter_context(ZooKeeperServer(name="bench-zk"))
            except RuntimeError as exc:  # no server, or it did not start
                raise Unavailable(str(exc)) from exc
            return Target("zookeeper", (self._zookeeper.url("/bench"),))
        raise Unavailable(f"no way to start {need} yet (bench/services.py)")

    def server_pids(self) -> list[int]:
        """PIDs of the server processes this run started (for CPU pinning): the single node and the Redlock nodes."""
        pids = [server.pid for server in (*self._redis, *self._redlock)]
        pids.append(self._zookeeper.pid if self._zookeeper is not None else None)
        return [pid for pid in pids if pid is not None]

    def pid(self, url: str) -> int | None:
        """The PID of the server this run started at `url` (None: not ours, or not known)."""
        for server in (*self._redis, *self._redlock):
            if server.url == url:
                return server.pid
        if self._zookeeper is not None and url == self._zookeeper.url("/bench"):
            return self._zookeeper.pid
        return None

    def describe(self) -> dict[str, str]:
        """What runs, for the report: binary, version, and the version the server reports itself."""
        out: dict[str, str] = {}
        servers = [*self._redis, *self._redlock]
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
                                  f"{len(self._redlock)} Redlock (independent masters)" if self._redlock else "")
                if part)
        if self._zookeeper is not None:
            version = four_letter_word(self._zookeeper.host, self._zookeeper.port, "srvr").splitlines()[:1]
            out["zookeeper"] = (version[0].removeprefix("Zookeeper version: ").split("-")[0] if version else "?") + \
                " standalone, tickTime 100 ms, no fsync (zookeeper.forceSync=no)"
        return out

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
