"""The Redis family as conformance-suite deployments: one Redis, a Redis Cluster, and Redlock over N nodes.

Each class owns the servers it was given (`close()` stops them) and looks behind fencelock's back with plain
redis-py clients: the lock key's value is the holder's token (see `fencelock._redis.keys`).

    with RedisDeployment.start() as deployment:
        locks = deployment.connect()
        ...

The Redis-specific helpers (`raw`, `raws`, `redis_target`, `pttl`) are for the Redis-only tests in fencelock's own
suite; the conformance suite uses only what `Deployment` declares.
"""

from __future__ import annotations

from typing import Any

import fencelock

from .._redis.keys import redis_keys
from .deployment import Deployment
from .servers import RedisClusterServers, RedisNodes, RedisServer

__all__ = ["ClusterDeployment", "RedisDeployment", "RedlockDeployment"]


def _lock_value(raw: Any, name: str) -> str | None:
    value: Any = raw.get(redis_keys(name).lock)
    return None if value is None else bytes(value).decode()


class _RedisFamily(Deployment):
    """What the three share: the lock key holds the token; steal deletes it everywhere."""

    servers: RedisServer | RedisClusterServers | RedisNodes
    _raws: list[Any] | None = None

    def _make_raws(self) -> list[Any]:
        raise NotImplementedError

    def raws(self) -> list[Any]:
        """One plain redis-py client per node that holds locks (Redlock: N; otherwise one), made once."""
        if self._raws is None:
            self._raws = self._make_raws()
        return list(self._raws)

    def raw(self) -> Any:
        """A plain redis-py client (Redis or RedisCluster; Redlock: its first node), e.g. as a guarded store."""
        return self.raws()[0]

    def redis_target(self) -> Any:
        """What to pass to `fencelock.connect` to use your own redis-py client(s) instead of URLs."""
        return self.raws()[0]

    def holder(self, name: str) -> str | None:
        """The token holding `name` (Redlock: the token a majority of the nodes hold)."""
        tokens = [_lock_value(raw, name) for raw in self.raws()]
        for token in set(tokens) - {None}:
            if tokens.count(token) > len(tokens) // 2:
                return token
        return None

    def steal(self, name: str) -> None:
        for raw in self.raws():
            raw.delete(redis_keys(name).lock)

    def pause(self) -> None:
        self.servers.pause()

    def resume(self) -> None:
        self.servers.resume()

    def pttl(self, name: str) -> int:
        """Milliseconds left on `name`'s key (Redlock: the longest, on any node)."""
        return max(int(raw.pttl(redis_keys(name).lock)) for raw in self.raws())

    def ttl_left(self, name: str) -> float | None:
        return max(0, self.pttl(name)) / 1000

    def leftovers(self, name: str) -> list[str] | None:
        keys = redis_keys(name)
        found = [f"node {i}: {keys.lock}" for i, raw in enumerate(self.raws()) if raw.exists(keys.lock)]
        if self.raws()[0].exists(keys.queue):
            found.append(keys.queue)
        return found

    def close(self) -> None:
        self.servers.close()


class RedisDeployment(_RedisFamily):
    """One Redis server."""

    kind = "redis"
    supports_fair = True

    def __init__(self, server: RedisServer) -> None:
        super().__init__(server.url)
        self.server = server
        self.servers = server

    @classmethod
    def start(cls, binary: str | None = None) -> RedisDeployment:
        server = RedisServer(binary, name="redis")
        try:
            server.start()
        except BaseException:
            server.close()
            raise
        return cls(server)

    def _make_raws(self) -> list[Any]:
        return [self.server.client()]

    def queued(self, name: str) -> int | None:
        return int(self.raw().llen(redis_keys(name).queue))


class ClusterDeployment(_RedisFamily):
    """A Redis Cluster (three masters by default)."""

    kind = "cluster"
    supports_fair = True
    # redis-py's cluster client asks every node for the layout again after a timeout: (nodes + 1) timeouts.
    stall_timeout = 2.0 * (1 + 3)

    def __init__(self, cluster: RedisClusterServers) -> None:
        super().__init__(cluster.url)
        self.cluster = cluster
        self.servers = cluster
        self.stall_timeout = 2.0 * (1 + len(cluster.nodes))

    @classmethod
    def start(cls, n: int = 3, binary: str | None = None) -> ClusterDeployment:
        return cls(RedisClusterServers(n, binary).start())

    def _make_raws(self) -> list[Any]:
        return [self.cluster.client()]

    def queued(self, name: str) -> int | None:
        return int(self.raw().llen(redis_keys(name).queue))


class RedlockDeployment(_RedisFamily):
    """Redlock over N independent Redis masters (five by default), initialised with every node up."""

    kind = "redlock"

    def __init__(self, nodes: RedisNodes) -> None:
        super().__init__(nodes.urls)
        self.nodes = nodes
        self.servers = nodes
        self.nodes_per_request = len(nodes.nodes)

    @classmethod
    def start(cls, n: int = 5, binary: str | None = None, *, initialise: bool = True) -> RedlockDeployment:
        """`initialise=False` leaves the nodes untouched: the first acquire (of any number of clients at once)
        then finds a new deployment and marks it, as users' first acquires do."""
        nodes = RedisNodes(n, binary)
        try:
            nodes.start()
            if initialise:
                initialise_redlock(nodes.urls)
        except BaseException:
            nodes.close()
            raise
        return cls(nodes)

    def _make_raws(self) -> list[Any]:
        return [node.client() for node in self.nodes.nodes]

    def redis_target(self) -> Any:
        return self.raws()


def initialise_redlock(urls: list[str]) -> None:
    """A first acquisition with every node up: a new Redlock deployment counts all its nodes from then on.

    Not needed for correctness (the first acquire of any client marks a new deployment, see
    docs/design/redlock.md); it keeps that first marking out of tests that time or count requests."""
    locks = fencelock.connect(urls)
    try:
        locks.acquire("fencelock-tests:init", ttl=1.0, wait=5.0).release()
    finally:
        locks.close()
