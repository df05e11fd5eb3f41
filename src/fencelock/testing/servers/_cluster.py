"""A real Redis Cluster of ``n`` masters, built from :class:`RedisServer` processes with redis-py only."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import ResponseError

from ._groups import _ServerGroup
from ._process import _close_clients, _port_is_free, find_server_binary, free_port, server_version
from ._server import RedisServer

#: Seconds :meth:`RedisClusterServers.start` waits for the cluster to converge.
CLUSTER_TIMEOUT = 15.0
#: Number of hash slots in a Redis Cluster.
CLUSTER_SLOTS = 16384


class RedisClusterServers(_ServerGroup):
    """A real Redis Cluster of ``n`` masters (no replicas) on loopback ports.

    Built without ``redis-cli``: each node gets ``CLUSTER ADDSLOTSRANGE`` for its
    share of 0..16383 (``ADDSLOTS`` on 6.2), the nodes ``CLUSTER MEET`` each
    other, then :meth:`start` waits until every node reports ``cluster_state:ok``
    and knows all ``n`` masters. Note that a fresh master refuses to report ``ok``
    during its first ~2 s (Redis' ``CLUSTER_WRITABLE_DELAY``), so a cluster takes
    a little over 2 s to start, and a restarted node as long to rejoin.

    Each node is a :class:`RedisServer` in :attr:`nodes`; kill / restart single
    nodes through it. On 7.0+ the cluster bus port is a separate free port
    (``--cluster-port``); on 6.2 it is ``port + 10000``, which is checked to be free.
    """

    def __init__(self, n: int = 3, binary: str | None = None) -> None:
        if n < 1:
            raise ValueError("a cluster needs at least one node")
        self.n = n
        self.binary = binary if binary is not None else find_server_binary()
        self.version = server_version(self.binary)
        self.nodes: list[RedisServer] = []
        #: Cluster bus port of each node (same order as :attr:`nodes`).
        self.bus_ports: list[int] = []
        self._clients: list[redis.RedisCluster] = []

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<first node port>`` (fencelock's cluster scheme)."""
        if not self.nodes:
            raise RuntimeError("cluster not started")
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def _new_node(self, i: int) -> tuple[RedisServer, int]:
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "5000",
        ]
        port: int | None = None
        if self.version >= (7, 0, 0):
            bus = free_port()
            args += ["--cluster-port", str(bus)]
        else:
            for _ in range(100):
                p = free_port()
                if p + 10000 <= 65535 and _port_is_free(p + 10000):
                    port, bus = p, p + 10000
                    break
            else:
                raise RuntimeError("no port p with p+10000 free for the cluster bus")
        node = RedisServer(self.binary, port=port, extra_args=args, name=f"cluster{i}")
        return node, bus

    def _start_node(self, i: int) -> tuple[RedisServer, int]:
        last: RuntimeError | None = None
        for _ in range(3):
            node, bus = self._new_node(i)
            try:
                return node.start(), bus
            except RuntimeError as exc:
                node.close()
                last = exc
                if "Address already in use" not in str(exc):
                    break
        assert last is not None
        raise last

    @property
    def started(self) -> bool:
        return bool(self.nodes)

    def start(self) -> RedisClusterServers:
        """Start the nodes, assign slots, MEET, wait for convergence. Returns ``self``.

        Raises :class:`RuntimeError` (after closing what was started) if the
        cluster does not converge within 15 s.
        """
        if self.nodes:
            raise RuntimeError("cluster already started")
        try:
            for i in range(self.n):
                node, bus = self._start_node(i)
                self.nodes.append(node)
                self.bus_ports.append(bus)
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        admins = [node.client() for node in self.nodes]
        for i, r in enumerate(admins):
            lo = i * CLUSTER_SLOTS // self.n
            hi = (i + 1) * CLUSTER_SLOTS // self.n - 1
            # Distinct epochs avoid the epoch-collision dance (redis-cli does the same).
            _cluster(r, "SET-CONFIG-EPOCH", i + 1)
            try:
                _cluster(r, "ADDSLOTSRANGE", lo, hi)
            except ResponseError as exc:
                if "unknown" not in str(exc).lower():
                    raise
                _cluster(r, "ADDSLOTS", *range(lo, hi + 1))
        # MEET every pair once (not just node 0 -> others) so that convergence does
        # not wait for gossip. The bus port must be given explicitly: with
        # --cluster-port it is not port + 10000 (MEET would even say "out of range").
        for i, r in enumerate(admins):
            for j in range(i + 1, self.n):
                other = self.nodes[j]
                if self.version >= (7, 0, 0):
                    _cluster(r, "MEET", other.host, other.port, self.bus_ports[j])
                else:
                    _cluster(r, "MEET", other.host, other.port)
        self._wait_converged(time.monotonic() + CLUSTER_TIMEOUT)

    def _wait_converged(self, deadline: float) -> None:
        admins = [node.client() for node in self.nodes]
        last = ""
        while True:
            ok = True
            for node, r in zip(self.nodes, admins, strict=True):
                try:
                    info = _parse_cluster_info(_cluster(r, "INFO"))
                except redis.RedisError as exc:
                    ok, last = False, f"{node.name}: {exc}"
                    break
                if (
                    info.get("cluster_state") != "ok"
                    or info.get("cluster_known_nodes") != str(self.n)
                    or info.get("cluster_size") != str(self.n)
                ):
                    ok, last = False, f"{node.name}: {info}"
                    break
            if ok:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"cluster of {self.n} did not converge within {CLUSTER_TIMEOUT:g}s; "
                    f"last: {last}"
                )
            time.sleep(0.05)

    def wait_ok(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """Wait until every node reports ``cluster_state:ok`` and knows all masters
        (e.g. after restarting a node)."""
        self._wait_converged(time.monotonic() + timeout)

    def client(self, **kw: Any) -> redis.RedisCluster:
        """A ``redis.RedisCluster`` seeded with the first node (``socket_timeout=2``
        unless overridden). Closed by :meth:`close`."""
        if not self.nodes:
            raise RuntimeError("cluster not started")
        kwargs: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.nodes[0].port,
            "socket_timeout": 2,
            "socket_connect_timeout": 2,
        }
        kwargs.update(kw)
        c = redis.RedisCluster(**kwargs)
        self._clients.append(c)
        return c

    def close(self) -> None:
        """Close clients and every node (each node's close is idempotent)."""
        _close_clients(self._clients)
        self._close_nodes()


def _cluster(r: redis.Redis, *args: Any) -> Any:
    """Send ``CLUSTER <args...>`` as a raw command (works the same on Redis and Valkey)."""
    send: Callable[..., Any] = r.execute_command  # redis-py leaves it untyped
    return send("CLUSTER", *args)


def _parse_cluster_info(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if isinstance(raw, bytes):
        raw = raw.decode()
    out: dict[str, str] = {}
    for line in str(raw).splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out
