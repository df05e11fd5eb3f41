"""The servers of the fault matrix, each behind `FaultProxy`s, and the two front ends driven from one coroutine.

A `Rig` is one deployment (a single Redis, a Redis Cluster of three, Redlock over five, ZooKeeper, etcd) with a
proxy in front of every node; clients under test connect through the proxies, the watcher and the rival straight to
the servers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

import fencelock
import fencelock.aio
from fencelock import _scripts
from fencelock.testing.etcd import EtcdServer
from fencelock.testing.faults import FaultProxy, Request, Rule
from fencelock.testing.framing import HTTP, ZOOKEEPER
from fencelock.testing.invariants import EtcdReader, ZooKeeperReader
from fencelock.testing.redis_deployments import initialise_redlock
from fencelock.testing.servers import RedisClusterServers, RedisNodes, RedisPrimaryReplica, RedisServer
from fencelock.testing.zookeeper import ZooKeeperDeployment, ZooKeeperServer

from .cells import TTL

SOCKET_TIMEOUT = 0.25
"""Seconds: every client under test times out this fast, so a fault costs a quarter of a second."""

WATCH_TIMEOUT = 0.2
_RIVAL = f"?socket_timeout={WATCH_TIMEOUT}&socket_connect_timeout={WATCH_TIMEOUT}"


class Rig:
    """One deployment behind proxies. `faulted` are the proxies a fault is armed on (Redlock: a majority)."""

    kind: str
    quorum = 1
    fair = True
    handshake: str | Callable[[Request], bool] = "client"
    """The request a connection opens with, which the `handshake` fault closes (Redis: its first CLIENT command)."""
    ttl = TTL
    """Seconds: the TTL the cells' leases ask for."""
    lag = 0.0
    """Seconds a server may keep a key past its TTL before it deletes it (see `invariants.check`)."""
    background: frozenset[str] = frozenset()
    """Requests the client library sends on its own timer (ZooKeeper's pings): never counted as a call's."""
    straggle = 0.0
    """How much longer than its TTL a minority of nodes may keep a key (see `invariants.check`)."""

    def __init__(self, proxies: list[FaultProxy], servers: list[RedisServer]) -> None:
        self.proxies = proxies
        self.servers = servers
        self.faulted = proxies
        self._rival: fencelock.Locks | None = None
        self._watch: list[Any] | None = None

    def connect(self, front: str) -> Any:
        raise NotImplementedError

    def rival(self) -> fencelock.Locks:
        """A synchronous client straight to the servers (not through the proxies)."""
        raise NotImplementedError

    def watch_clients(self) -> list[Any]:
        raise NotImplementedError

    def watchers(self) -> list[Any]:
        """The watcher's clients, made once (a client per cell would pile up sockets)."""
        if self._watch is None:
            self._watch = self.watch_clients()
        return self._watch

    def shared_rival(self) -> fencelock.Locks:
        """The rig's one rival client, made at first use."""
        if self._rival is None:
            self._rival = self.rival()
        return self._rival

    def arm(self, make: Callable[[RedisServer], Rule]) -> list[Rule]:
        """One rule per faulted proxy, made for the server behind it (for its pause hooks)."""
        rules = []
        for proxy in self.faulted:
            server = next(s for s in self.servers if s.port == proxy.target_port)
            rules.append(proxy.arm(make(server)))
        return rules

    def clear(self) -> None:
        for proxy in self.proxies:
            proxy.clear()

    def close_idle(self) -> int:
        return sum(proxy.close_idle() for proxy in self.faulted)

    def close(self) -> None:
        if self._rival is not None:
            self._rival.close()
        for proxy in self.proxies:
            proxy.close()
        for watch in self._watch or []:
            if isinstance(watch, (ZooKeeperReader, EtcdReader)):
                watch.close()


def _url(proxy: FaultProxy) -> str:
    return f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={SOCKET_TIMEOUT}&socket_connect_timeout={SOCKET_TIMEOUT}"


class SingleRig(Rig):
    kind = "redis"

    def connect(self, front: str) -> Any:
        return (fencelock.connect if front == "sync" else fencelock.aio.connect)(_url(self.proxies[0]))

    def rival(self) -> fencelock.Locks:
        return fencelock.connect(self.servers[0].url + _RIVAL)

    def watch_clients(self) -> list[Any]:
        return [self.servers[0].client(socket_timeout=WATCH_TIMEOUT)]


class DurableRig(SingleRig):
    """A primary and its replica, the client under test with `durability="replica"` through a proxy to the
    primary: a grant's and an extend's WAIT go in the same write as the script, so each fault meets the WAIT's
    reply as well as the script's. The watcher reads the primary."""

    kind = "durable"

    def connect(self, front: str) -> Any:
        return (fencelock.connect if front == "sync" else fencelock.aio.connect)(
            _url(self.proxies[0]), durability="replica", durability_timeout=SOCKET_TIMEOUT / 2)


class RedlockRig(Rig):
    kind = "redlock"
    fair = False

    def __init__(self, proxies: list[FaultProxy], servers: list[RedisServer]) -> None:
        super().__init__(proxies, servers)
        self.quorum = len(servers) // 2 + 1
        self.faulted = proxies[:self.quorum]
        # A call returns once a quorum answered; a node whose connection still waits for an earlier reply (held
        # back, at most one socket timeout) gets the request after that, and keeps the key that much longer.
        self.straggle = SOCKET_TIMEOUT

    def connect(self, front: str) -> Any:
        # Each node's answer within 0.2 s (the default, 50 ms + 1 % of the TTL, is too tight for a fresh
        # connection's handshake through a proxy on a loaded machine: at 0.15 s, a release after a fault on three
        # nodes once got two of them back too late in CI), still below the socket timeout.
        urls = [_url(p) for p in self.proxies]
        return (fencelock.connect if front == "sync" else fencelock.aio.connect)(urls, node_timeout=0.2)

    def rival(self) -> fencelock.Locks:
        return fencelock.connect([s.url + _RIVAL for s in self.servers])

    def watch_clients(self) -> list[Any]:
        return [s.client(socket_timeout=WATCH_TIMEOUT) for s in self.servers]


class ClusterRig(Rig):
    """A Cluster's nodes announce their own ports: the client under test maps each to its proxy
    (`address_remap`), with the options `fencelock.connect` gives a client it makes from a URL."""

    kind = "cluster"

    def __init__(self, proxies: list[FaultProxy], servers: list[RedisServer], cluster: RedisClusterServers) -> None:
        super().__init__(proxies, servers)
        self.cluster = cluster
        self._to_proxy = {s.port: p.port for s, p in zip(servers, proxies, strict=True)}
        for proxy in proxies:  # redis-py's asyncio client follows MOVED without address_remap
            proxy.redirects = dict(self._to_proxy)

    def _remap(self, address: tuple[str, int]) -> tuple[str, int]:
        return "127.0.0.1", self._to_proxy.get(address[1], address[1])

    def connect(self, front: str) -> Any:
        options: dict[str, Any] = {"host": "127.0.0.1", "port": self.proxies[0].port, "socket_timeout": SOCKET_TIMEOUT,
                                   "socket_connect_timeout": SOCKET_TIMEOUT, "address_remap": self._remap}
        if front == "sync":
            return _Owned(fencelock.connect(redis.RedisCluster(retry=Retry(NoBackoff(), 0), **options)))
        return _Owned(fencelock.aio.connect(redis.asyncio.RedisCluster(retry=AsyncRetry(NoBackoff(), 0), **options)))

    def rival(self) -> fencelock.Locks:
        return fencelock.connect(self.cluster.url + _RIVAL)

    def watch_clients(self) -> list[Any]:
        return [self.cluster.client(socket_timeout=WATCH_TIMEOUT)]


class ZooKeeperRig(Rig):
    """One ZooKeeper server behind a proxy that reads its frames; the client under test gives each request
    `SOCKET_TIMEOUT` (its URL's `timeout`), the watcher reads the head of each queue and its node's TTL."""

    kind = "zookeeper"
    handshake = "connect"
    background = frozenset({"ping"})

    def __init__(self, proxies: list[FaultProxy], servers: list[Any], deployment: ZooKeeperDeployment) -> None:
        super().__init__(proxies, servers)
        self.deployment = deployment

    def connect(self, front: str) -> Any:
        url = f"zookeeper://127.0.0.1:{self.proxies[0].port}{self.deployment.chroot}?timeout={SOCKET_TIMEOUT}"
        return (fencelock.connect if front == "sync" else fencelock.aio.connect)(url)

    def rival(self) -> fencelock.Locks:
        return fencelock.connect(f"{self.deployment.target}?timeout={WATCH_TIMEOUT}")

    def watch_clients(self) -> list[Any]:
        return [ZooKeeperReader(self.deployment.hosts, self.deployment.chroot, timeout=WATCH_TIMEOUT)]


def _first_request(request: Request) -> bool:
    return request.index == 0


class _EtcdNode:
    """The one etcd member, as `Rig.arm` sees a server: its client port, and its pause hooks."""

    def __init__(self, server: EtcdServer) -> None:
        self.server = server
        self.port = server.members[0].client_port

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()


class EtcdRig(Rig):
    """One etcd member (data in memory, 1 s minimum lease) behind a proxy that reads HTTP; the client under test
    gives each request `SOCKET_TIMEOUT` (its URL's `timeout`). Leases are whole seconds: the cells ask for 2 s,
    which the server grants as asked, and it deletes an expired lease's key within its 0.5 s expiry check."""

    kind = "etcd"
    handshake = staticmethod(_first_request)  # plain HTTP has no set-up: the first request of a new connection
    background = frozenset({"version"})        # the client's one `GET /version`, in the background
    ttl = 2.0
    lag = 0.6

    def connect(self, front: str) -> Any:
        url = f"etcd://127.0.0.1:{self.proxies[0].port}?timeout={SOCKET_TIMEOUT}"
        return (fencelock.connect if front == "sync" else fencelock.aio.connect)(url)

    def rival(self) -> fencelock.Locks:
        return fencelock.connect(f"etcd://127.0.0.1:{self.servers[0].port}?timeout={WATCH_TIMEOUT}")

    def watch_clients(self) -> list[Any]:
        return [EtcdReader("127.0.0.1", self.servers[0].port, timeout=WATCH_TIMEOUT)]


class _Owned:
    """A `Locks` over a redis-py client of ours: closing it closes that client too."""

    def __init__(self, locks: Any) -> None:
        self._locks = locks

    def __getattr__(self, item: str) -> Any:
        return getattr(self._locks, item)

    def close(self) -> None:
        self._locks.close()
        self._locks.backend.client.close()

    async def aclose(self) -> None:
        await self._locks.aclose()
        # fencelock's cleanups in the background (after a cancelled or failed acquire) may still use the client:
        # let them end before closing it, or their connections would outlive it.
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if others:
            await asyncio.wait(others, timeout=1.0)
        await self._locks.aclose()
        await self._locks.backend.client.aclose()


def _proxies(servers: list[RedisServer]) -> list[FaultProxy]:
    """A proxy in front of each server; every fencelock script is loaded first, so that a fault meets the request
    that does the work, not a NOSCRIPT answer before it."""
    for server in servers:
        client = server.client()
        for lua in vars(_scripts).values():
            if isinstance(lua, _scripts.Lua):
                client.script_load(lua.source)
    return [FaultProxy("127.0.0.1", s.port, name=f"faults-{i}").start() for i, s in enumerate(servers)]


@contextlib.contextmanager
def start_rig(kind: str) -> Iterator[Rig]:
    rig: Rig
    if kind == "redis":
        with RedisServer(name="matrix") as server:
            rig = SingleRig(_proxies([server]), [server])
            try:
                yield rig
            finally:
                rig.close()
    elif kind == "durable":
        with RedisPrimaryReplica() as pair:
            rig = DurableRig(_proxies([pair.primary]), [pair.primary])
            try:
                yield rig
            finally:
                rig.close()
    elif kind == "zookeeper":
        with ZooKeeperServer(name="matrix-zk") as zk_server:
            deployment = ZooKeeperDeployment(zk_server)
            proxy = FaultProxy("127.0.0.1", zk_server.port, name="faults-zk", framing=ZOOKEEPER).start()
            rig = ZooKeeperRig([proxy], [zk_server], deployment)
            try:
                yield rig
            finally:
                rig.close()
    elif kind == "etcd":
        with EtcdServer(memory=True) as etcd_server:
            node = _EtcdNode(etcd_server)
            proxy = FaultProxy("127.0.0.1", node.port, name="faults-etcd", framing=HTTP).start()
            rig = EtcdRig([proxy], [node])  # type: ignore[list-item]
            try:
                yield rig
            finally:
                rig.close()
    elif kind == "redlock":
        with RedisNodes(5) as nodes:
            initialise_redlock(nodes.urls)
            rig = RedlockRig(_proxies(nodes.nodes), nodes.nodes)
            try:
                yield rig
            finally:
                rig.close()
    else:
        with RedisClusterServers(3) as cluster:
            rig = ClusterRig(_proxies(cluster.nodes), cluster.nodes, cluster)
            try:
                yield rig
            finally:
                rig.close()


class Front:
    """The sync or asyncio API, driven from one coroutine: a sync call runs in a thread."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.kind == "sync":
            return await asyncio.to_thread(fn, *args, **kwargs)
        return await fn(*args, **kwargs)

    async def close(self, locks: Any) -> None:
        """Close the client; asyncio: after fencelock's cleanups in the background have ended (a cleanup that
        connected after the first close is closed by the second)."""
        if self.kind == "sync":
            await asyncio.to_thread(locks.close)
            return
        await locks.aclose()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if others:
            await asyncio.wait(others, timeout=1.0)
        await locks.aclose()
