"""`connect()`: from a URL or a redis-py client to a `Locks` client."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .._errors import BackendError
from .._etcd.url import is_etcd_url, parse_etcd_url
from .._logic.args import check_flag, check_text, check_ttl
from .._logic.timing import lease_clock
from .._logic.urls import DEFAULT_SOCKET_TIMEOUT, parse_redis_url
from .._redis.durability import check_against_socket, check_durability
from .._redis.fences import DEFAULT_FENCE_RETENTION, check_fence_retention
from .._redis.keys import PREFIX
from .._redis.redlock import DEFAULT_REPAIR_DELAY, check_node_count
from .._zk.url import parse_zookeeper_url
from ._cluster import cluster_from_url
from .client import AsyncLocks
from .redis import AsyncRedisBackend
from .redis_commands import CLIENT_ERRORS, socket_timeout
from .redlock import AsyncRedlockBackend


def connect(target: str | Redis | RedisCluster | Sequence[str | Redis], *, prefix: str = PREFIX,
            node_timeout: float | None = None, repair: bool | None = None,
            repair_delay: float | None = None, fence_retention: float | None = None,
            durability: str | int | None = None, durability_timeout: float | None = None) -> AsyncLocks:
    """A lock client for `target`: a URL (see the README) or a redis-py client you configured yourself.

    `etcd://[user:password@]host:port[,host:port...]` (or `etcds://` for TLS) keeps the locks in etcd.
    `zookeeper://host:2181[,host:2181...][/chroot][?timeout=2]` keeps the locks in ZooKeeper (the extra
    `fencelock[zookeeper]`; docs/design/zookeeper.md says how the TTL maps to sessions).

    A list of three or more URLs (or clients) of independent Redis masters runs Redlock over them, with fencing
    tokens. `node_timeout` (default: 50 ms + 1 % of the TTL) bounds each node's answer; `repair` (default True)
    and `repair_delay` (default 60 s) govern nodes that come back without their data (see
    `fencelock._redis.redlock`). These three are Redlock's alone: None means its default, and any other value
    given for another target (one Redis, a Cluster, a redis-py client, etcd, ZooKeeper) raises `ValueError`,
    since nothing there would act on it.

    `fence_retention` (single Redis and Redis Cluster only; default 7 days) is how long a name's fence key
    outlives its last grant or extension: memory is bounded by the names used within it, and fences still
    increase after it expired (see `fencelock._redis.fences`). Given for another target, it raises `ValueError`.

    `durability` (single Redis and Redis Cluster only; default None, off): "replica" (or a number of replicas)
    makes a grant or extend count only once WAIT confirmed it, "aof" once WAITAOF confirmed the primary's fsync,
    within `durability_timeout` seconds (default 1 s, at most half the socket timeout). An unconfirmed grant is
    given back and raises `NotDurable` (see `fencelock._redis.durability`). For another target: `ValueError`.

    No connection is made until the first request (except that the synchronous Redis Cluster client asks for
    the cluster's layout at once). A client you pass in keeps its own timeouts and is not closed by `close()`; its
    `Retry` never sends a lock's request again (fencelock's own rule decides what may go again); a client made from
    a URL has no command retries and a socket timeout of 2 s unless the URL says otherwise.
    """
    if "{" in check_text(prefix, "prefix") or "}" in prefix:
        raise ValueError(f"prefix must be a non-empty str without braces, got {prefix!r}")
    retention = DEFAULT_FENCE_RETENTION if fence_retention is None else check_fence_retention(fence_retention)
    if fence_retention is not None:
        _fence_retention_refused(target)
    durable = check_durability(durability, durability_timeout)
    if durable is not None:
        _durability_refused(target)
    given = [option for option, value in (("node_timeout", node_timeout), ("repair", repair),
                                          ("repair_delay", repair_delay)) if value is not None]
    if is_etcd_url(target):
        _redlock_only(given, "etcd")
        return _etcd(str(target), prefix)
    if isinstance(target, (list, tuple)) and any(is_etcd_url(item) for item in target):
        raise ValueError("url: give an etcd cluster's endpoints in one URL, etcd://h1:2379,h2:2379, not as a list")
    if isinstance(target, (Redis, RedisCluster)):
        _redlock_only(given, "a redis-py client (one Redis or a Redis Cluster)")
        if durable is not None:
            check_against_socket(durable, socket_timeout(target))
        return AsyncLocks(AsyncRedisBackend(target, owns_client=False, prefix=prefix, shown=_describe(target),
                                            fence_retention=retention, durability=durable))
    if isinstance(target, str) and target.partition("://")[0].lower() == "zookeeper":
        _redlock_only(given, "ZooKeeper")
        zookeeper = parse_zookeeper_url(target)   # a bad URL fails here, before kazoo is even imported
        from .zookeeper import AsyncZooKeeperBackend  # the optional extra: imported only when asked for
        clock = lease_clock  # one clock for the client and its backend's waits
        return AsyncLocks(AsyncZooKeeperBackend(zookeeper, prefix=prefix, clock=clock), clock=clock)
    _not_another_client(target)
    if isinstance(target, (list, tuple)):
        return _redlock(list(target), prefix=prefix, node_timeout=node_timeout,
                        repair=True if repair is None else repair,
                        repair_delay=DEFAULT_REPAIR_DELAY if repair_delay is None else repair_delay)
    parsed = parse_redis_url(target)
    _redlock_only(given, "a Redis Cluster" if parsed.cluster else "a single Redis")
    options = _client_options(parsed.options)
    if durable is not None:
        check_against_socket(durable, options["socket_timeout"])
    client: Redis | RedisCluster
    if parsed.cluster:
        try:  # the synchronous cluster client asks for the cluster's layout at once
            client = cluster_from_url(parsed.url, **options)
        except CLIENT_ERRORS as exc:
            raise BackendError(f"cannot reach the Redis Cluster at {parsed.shown}: {type(exc).__name__}: {exc}") \
                from exc
    else:
        client = Redis.from_url(parsed.url, **options)
    return AsyncLocks(AsyncRedisBackend(client, owns_client=True, prefix=prefix, shown=parsed.shown,
                                        fence_retention=retention, durability=durable))


def _etcd(url: str, prefix: str) -> AsyncLocks:
    """etcd://host:port[,host:port...]: the etcd backend, which needs the `fencelock[etcd]` extra (httpx)."""
    target = parse_etcd_url(url)
    from .etcd import AsyncEtcdBackend  # raises ImportError naming the extra when httpx is missing

    clock = lease_clock  # one clock for the client and its backend's waits
    return AsyncLocks(AsyncEtcdBackend(target, prefix=prefix, clock=clock), clock=clock)


def _fence_retention_refused(target: object) -> None:
    """Refuse `fence_retention` where no per-name fence key would honour it (before anything is sent)."""
    if is_etcd_url(target):
        where = "etcd, whose fences are its revisions: it keeps no fence state per name"
    elif isinstance(target, str) and target.partition("://")[0].lower() == "zookeeper":
        where = "ZooKeeper, whose fences are its zxids: it keeps no fence state per name"
    elif isinstance(target, (list, tuple)):
        where = "Redlock, whose nodes keep their fence state as their repair needs it"
    else:
        return
    raise ValueError(f"fence_retention applies to a single Redis or a Redis Cluster only, not to {where}")


def _durability_refused(target: object) -> None:
    """Refuse `durability` where WAIT / WAITAOF would not run (before anything is sent)."""
    if is_etcd_url(target) or (isinstance(target, (list, tuple)) and any(is_etcd_url(item) for item in target)):
        where = "etcd, which answers a write only once a majority of its members have it on disk"
    elif isinstance(target, str) and target.partition("://")[0].lower() == "zookeeper":
        where = "ZooKeeper, which answers a write only once a quorum of its servers have logged it"
    elif isinstance(target, (list, tuple)):
        where = ("Redlock, whose safety rests on a majority of independent nodes, not on each node's replicas "
                 "(docs/design/durability.md)")
    else:
        return
    raise ValueError(f"durability applies to a single Redis or a Redis Cluster only, not to {where}")


def _redlock_only(given: list[str], target: str) -> None:
    """Refuse Redlock's options for another kind of target, where they would be silently ignored."""
    if given:
        names = " and ".join(given) if len(given) < 3 else ", ".join(given[:-1]) + " and " + given[-1]
        raise ValueError(f"{names} {'applies' if len(given) == 1 else 'apply'} to Redlock only (a list of 3 or "
                         f"more Redis node URLs or clients), not to {target}: nothing there would act on "
                         f"{'it' if len(given) == 1 else 'them'}")


def _describe(client: Redis | RedisCluster) -> str:
    """Where a client points, for messages: host and port only, never credentials."""
    if isinstance(client, RedisCluster):
        cluster: Any = client
        node: Any = cluster.get_default_node()
        return f"redis cluster at {node.host}:{node.port}" if node is not None else "redis cluster"
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"redis at {kwargs['path']}"
    return f"redis at {kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def _not_another_client(target: object) -> None:
    if hasattr(target, "execute_command") and not isinstance(target, (Redis, RedisCluster)):
        raise TypeError(f"url: {type(target).__module__}.{type(target).__name__} is the wrong kind of redis-py "
                        "client here: fencelock.connect() takes redis.Redis, fencelock.aio.connect() takes "
                        "redis.asyncio.Redis")


def _client_options(overrides: dict[str, float]) -> dict[str, Any]:
    options: dict[str, Any] = {
        "socket_timeout": DEFAULT_SOCKET_TIMEOUT,
        "socket_connect_timeout": DEFAULT_SOCKET_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
    }
    options.update(overrides)
    return options


def _redlock(targets: list[str | Redis], *, prefix: str, node_timeout: float | None, repair: bool,
             repair_delay: float) -> AsyncLocks:
    check_node_count(len(targets))
    check_flag(repair, "repair")
    if node_timeout is not None:
        check_ttl(node_timeout, None, "node_timeout")
    check_ttl(repair_delay, None, "repair_delay")
    clients: list[Redis] = []
    shown: list[str] = []
    where_each: list[set[str]] = []
    places: dict[str, str] = {}
    given = [isinstance(target, Redis) for target in targets]
    if any(given) and not all(given):
        raise TypeError("url: give Redlock nodes all as URLs or all as redis-py clients, not mixed")
    for target in targets:
        _not_another_client(target)
        if isinstance(target, Redis):
            client, where = target, _describe(target)
        else:
            parsed = parse_redis_url(target)
            if parsed.cluster:
                raise ValueError(f"url {parsed.shown!r}: Redlock nodes are independent masters, not a Redis Cluster")
            client, where = Redis.from_url(parsed.url, **_client_options(parsed.options)), parsed.shown
        found = _places(client)
        for place in found:
            if place in places:
                raise ValueError(f"url: {where} and {places[place]} are one server ({place}), listed twice; "
                                 "Redlock needs independent nodes")
            places[place] = where
        where_each.append(found)
        clients.append(client)
        shown.append(where)
    clock = lease_clock  # one clock for the client and its backend's grants
    return AsyncLocks(AsyncRedlockBackend(clients, owns_clients=not all(given), shown=shown, prefix=prefix,
                                          node_timeout=node_timeout, repair=repair, repair_delay=repair_delay,
                                          places=where_each, clock=clock), clock=clock)


def _places(client: Redis) -> set[str]:
    """Where a node really is: its socket file, or every address its host resolves to with its port. Two nodes
    sharing one are one server (another database number on it is not another node). Names this cannot tell apart
    (a socket and a TCP port of one server, a proxy) are found at first contact (`NotIndependent`)."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return {os.path.realpath(str(kwargs["path"]))}
    host, port = str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379))
    try:  # numeric hosts and /etc/hosts answer at once; a name the resolver does not know stays as written
        found = {f"{info[4][0]}:{port}" for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        found = set()
    if host.lower() == "localhost" or any(address.startswith(("127.", "::1:")) for address in found):
        found |= {f"loopback:{port}"}  # 127.0.0.1, ::1 and localhost: one loopback server on one port
    return found or {f"{host.lower()}:{port}"}
