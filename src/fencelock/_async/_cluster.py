"""Redis Cluster: a node for a key, its layout read again, and redis.asyncio's cluster client's gaps filled.
Hand-written twin: `_sync/_cluster.py`."""

from __future__ import annotations

from typing import Any, NamedTuple

from redis.asyncio import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from ._connection import idle_closed


def cluster_from_url(url: str, **options: Any) -> RedisCluster:
    """A Redis Cluster client from a URL. (redis.asyncio's closes every node's connections on aclose; the
    synchronous twin needs a subclass for that.)"""
    return RedisCluster.from_url(url, **options)


class _NodePool(NamedTuple):
    connection_class: Any
    connection_kwargs: dict[str, Any]


class _NodeSource(NamedTuple):
    """What `Channel` makes connections from: a cluster node's own connection class and settings."""

    connection_pool: _NodePool


async def cluster_node(client: Any, key: str) -> tuple[str, Any]:
    """The primary that serves `key`'s slot on a Redis Cluster: its name, and what a `Channel` to it is made
    from (the node's own connection settings). (The synchronous twin hands out the node's redis-py client.)"""
    await client.initialize()
    node = client.get_node_from_key(key)
    return node.name, _NodeSource(_NodePool(node.connection_class, node.connection_kwargs))


async def cluster_refresh(client: Any) -> None:
    """Read the cluster's layout again (after MOVED: the slot has another primary now)."""
    await client.nodes_manager.initialize()


async def ready_node(client: Any, key: str) -> None:
    """Leave `key`'s node a connected idle connection for the next command. redis.asyncio's cluster client takes
    one without looking at it: those the server closed meanwhile are dropped; and one is connected here, once
    more if the server closed it during its set-up, so that such a failure is never mistaken for the command's."""
    try:
        node = client.get_node_from_key(key)
    except Exception:
        return
    free = getattr(node, "_free", None)
    if free is None:
        return
    for conn in list(free):
        if conn.is_connected and idle_closed(conn):
            await conn.disconnect(nowait=True)
    ready = next((conn for conn in free if conn.is_connected), None)
    if ready is not None:  # the next command takes the first idle connection: this one
        free.remove(ready)
        free.appendleft(ready)
        return
    for attempt in range(2):
        try:
            conn = node.acquire_connection()
        except Exception:
            return  # (no room for another: the command waits for one as it would)
        try:
            await conn.connect()
        except BaseException as exc:  # cut by the server, or cancelled half-way: never left half set up
            await conn.disconnect(nowait=True)
            free.appendleft(conn)
            if attempt or not isinstance(exc, RedisConnectionError):
                raise
            continue
        free.appendleft(conn)  # the next command takes it first
        return
