"""Redis Cluster: a node for a key, its layout read again, and redis.asyncio's cluster client's gaps filled.
Hand-written twin: `_sync/_cluster.py`."""

from __future__ import annotations

from typing import Any, NamedTuple

from redis.asyncio import ConnectionPool, Redis, RedisCluster

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


async def primary_of(client: Any, key: bytes) -> Any:
    """The `ClusterNode` of the primary that serves `key`'s slot (the layout read first, if it never was)."""
    await client.initialize()
    return client.get_node_from_key(key)


async def cluster_refresh(client: Any) -> None:
    """Read the cluster's layout again (after MOVED: the slot has another primary now)."""
    await client.nodes_manager.initialize()


async def ready_node(client: Any, key: str) -> None:
    """redis.asyncio's cluster client takes an idle connection without looking at it: drop those of `key`'s node
    that the server closed meanwhile (they connect again when next used). (The synchronous twin also sets one up
    ahead of the command; here that met cancellations badly, see docs/decisions/2026-12-02-handshake-close.md.)"""
    try:
        node = client.get_node_from_key(key)
    except Exception:
        return
    for conn in list(getattr(node, "_free", ())):
        if conn.is_connected and idle_closed(conn):
            await conn.disconnect(nowait=True)


def node_of(client: Any, key: bytes) -> Any:
    """The primary that serves `key`'s slot by the layout the client last read (None: none read yet)."""
    try:
        return client.get_node_from_key(key)
    except Exception:
        return None


def node_redis(client: Any, node: Any, made: dict[str, Any]) -> Any:
    """A plain client of the primary `node`, to pipeline scripts to it (a cluster pipeline refuses them): made
    from the node's connection settings and kept in `made` (its owner closes them). (The synchronous twin uses
    the node's own redis-py client.)"""
    found = made.get(node.name)
    if found is None:
        pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
        found = made[node.name] = Redis.from_pool(pool)  # (its aclose closes the pool)
    return found

