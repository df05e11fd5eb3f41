"""`connect()`: from a URL or a redis-py client to a `Locks` client."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .._errors import BackendError
from .._logic.keys import PREFIX
from .._logic.urls import DEFAULT_SOCKET_TIMEOUT, parse_redis_url
from .client import AsyncLocks
from .redis import CLIENT_ERRORS, AsyncRedisBackend


def connect(target: str | Redis | RedisCluster, *, prefix: str = PREFIX) -> AsyncLocks:
    """A lock client for `target`: a URL (see the README) or a redis-py client you configured yourself.

    No connection is made until the first request (except that the synchronous Redis Cluster client asks for
    the cluster's layout at once). A client you pass in keeps its own timeouts and retries, and
    is not closed by `close()`; a client made from a URL has no command retries (fencelock retries only what is
    safe to retry) and a socket timeout of 2 s unless the URL says otherwise.
    """
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        raise ValueError(f"prefix must be a non-empty str without braces, got {prefix!r}")
    if isinstance(target, (Redis, RedisCluster)):
        return AsyncLocks(AsyncRedisBackend(target, owns_client=False, prefix=prefix, shown=_describe(target)))
    if hasattr(target, "execute_command"):
        raise TypeError(f"url: {type(target).__module__}.{type(target).__name__} is the wrong kind of redis-py "
                        "client here: fencelock.connect() takes redis.Redis, fencelock.aio.connect() takes "
                        "redis.asyncio.Redis")
    if isinstance(target, (list, tuple)):
        raise TypeError("url: a list of URLs (Redlock over several nodes) is not supported yet; pass one URL")
    parsed = parse_redis_url(target)
    options: dict[str, Any] = {
        "socket_timeout": DEFAULT_SOCKET_TIMEOUT,
        "socket_connect_timeout": DEFAULT_SOCKET_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
    }
    options.update(parsed.options)
    client: Redis | RedisCluster
    if parsed.cluster:
        try:  # the synchronous cluster client asks for the cluster's layout at once
            client = RedisCluster.from_url(parsed.url, **options)
        except CLIENT_ERRORS as exc:
            raise BackendError(f"cannot reach the Redis Cluster at {parsed.shown}: {exc}") from exc
    else:
        client = Redis.from_url(parsed.url, **options)
    return AsyncLocks(AsyncRedisBackend(client, owns_client=True, prefix=prefix, shown=parsed.shown))


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
