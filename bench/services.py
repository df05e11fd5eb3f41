"""The servers the chosen contenders need, started once per run and shared by every row that needs the same.

Today: one Redis-compatible server (`fencelock.testing.servers.RedisServer`). To add a service (five Redis
nodes for Redlock, etcd, ZooKeeper), teach `Services.target()` to start it; a need it cannot meet raises
`Unavailable`, and the rows that need it are skipped with the reason, the others still run.
"""

from __future__ import annotations

from contextlib import ExitStack
from types import TracebackType

import redis

from fencelock.testing.servers import RedisServer

from .contenders import Need, Target


class Unavailable(RuntimeError):
    """A need this machine cannot meet (no binary, not supported yet)."""


class Services:
    def __init__(self) -> None:
        self._stack = ExitStack()
        self._redis: list[RedisServer] = []
        self._targets: dict[Need, Target] = {}

    def target(self, need: Need) -> Target:
        if need not in self._targets:
            self._targets[need] = self._start(need)
        return self._targets[need]

    def _start(self, need: Need) -> Target:
        if need.service == "redis":
            while len(self._redis) < need.nodes:
                try:
                    server = RedisServer(name=f"bench{len(self._redis)}")
                except RuntimeError as exc:  # no server binary
                    raise Unavailable(str(exc)) from exc
                self._redis.append(self._stack.enter_context(server))
            # Every need shares the first nodes: a one-node row and a five-node row use the same first server.
            return Target("redis", tuple(s.url for s in self._redis[:need.nodes]))
        raise Unavailable(f"no way to start {need} yet (bench/services.py)")

    def server_pids(self) -> list[int]:
        """PIDs of the server processes this run started (for CPU pinning)."""
        return [pid for pid in (server.pid for server in self._redis) if pid is not None]

    def describe(self) -> dict[str, str]:
        """What runs, for the report: binary, version, and the version the server reports itself."""
        out: dict[str, str] = {}
        if self._redis:
            first = self._redis[0]
            client = redis.Redis(host=first.host, port=first.port)
            try:
                info = client.info("server")
            finally:
                client.close()
            flavour = "valkey" if "valkey_version" in info else "redis"
            out["server"] = f"{flavour} {info.get(f'{flavour}_version', info.get('redis_version', '?'))}"
            out["server binary"] = first.binary
            out["server nodes"] = str(len(self._redis))
        return out

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
