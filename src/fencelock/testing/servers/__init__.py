"""Start and control real ``redis-server`` / ``valkey-server`` processes for tests (see ``_server``)."""

from ._server import (
    RedisClusterServers,
    RedisNodes,
    RedisPrimaryReplica,
    RedisServer,
    find_server_binary,
    free_port,
    server_version,
)

__all__ = [
    "RedisClusterServers",
    "RedisNodes",
    "RedisPrimaryReplica",
    "RedisServer",
    "find_server_binary",
    "free_port",
    "server_version",
]
