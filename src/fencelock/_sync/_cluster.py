"""Redis Cluster: a node for a key, its layout read again, and redis-py's cluster client's gaps filled.
Hand-written twin: `_async/_cluster.py`."""

from __future__ import annotations

from typing import Any

from redis import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError



class _ClosingRedisCluster(RedisCluster):
    """redis-py's cluster client, whose close() also closes the connections of every node.

    Made from a URL, redis-py 8's client gives each node a connection pool of its own that the node client does
    not own, so RedisCluster.close() leaves those connections open, to the garbage collector (a ResourceWarning
    at some later, random moment). redis.asyncio's cluster client closes them.
    """

    def close(self) -> None:
        super().close()
        manager: Any = getattr(self, "nodes_manager", None)
        if manager is None:
            return
        nodes = {id(node): node for cache in (manager.nodes_cache, manager.startup_nodes) for node in cache.values()}
        for node in nodes.values():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()


def cluster_from_url(url: str, **options: Any) -> RedisCluster:
    """A Redis Cluster client from a URL, whose close() closes every node's connections (see above)."""
    return _ClosingRedisCluster.from_url(url, **options)


def cluster_node(client: Any, key: str) -> tuple[str, Any]:
    """The primary that serves `key`'s slot on a Redis Cluster: its name, and what a `Channel` to it is made
    from (the node's redis-py client, whose pool has the node's connection settings)."""
    node = client.get_node_from_key(key)
    return node.name, client.get_redis_connection(node)


def primary_of(client: Any, key: bytes) -> Any:
    """The `ClusterNode` of the primary that serves `key`'s slot."""
    return client.get_node_from_key(key)


def cluster_refresh(client: Any) -> None:
    """Read the cluster's layout again (after MOVED: the slot has another primary now)."""
    client.nodes_manager.initialize()


def ready_node(client: Any, key: str) -> None:
    """Leave `key`'s node a connected idle connection for the next command: redis-py's pool checks one (and
    connects it again if the server closed it) here, once more if the server closed it during its set-up, so
    that such a failure is never mistaken for the command's."""
    try:
        pool = client.get_redis_connection(client.get_node_from_key(key)).connection_pool
    except Exception:
        return
    for attempt in range(2):
        try:
            conn = pool.get_connection()
        except RedisConnectionError:
            if attempt:
                raise
            continue
        pool.release(conn)
        return


def node_of(client: Any, key: bytes) -> Any:
    """The primary that serves `key`'s slot by the layout the client last read (None: none read yet)."""
    try:
        return client.get_node_from_key(key)
    except Exception:
        return None


def node_redis(client: Any, node: Any, made: dict[str, Any]) -> Any:
    """The primary `node`'s own redis-py client, to pipeline scripts to it (a cluster pipeline refuses them);
    the cluster client owns it. (The asyncio twin makes one and keeps it in `made`.)"""
    return client.get_redis_connection(node)

