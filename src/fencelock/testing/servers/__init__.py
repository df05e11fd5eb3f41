"""Start and control real ``redis-server`` / ``valkey-server`` processes for tests: nothing is mocked.

A :class:`RedisServer` is one server process on a free loopback port with its own temporary directory; it can be
paused (SIGSTOP), resumed, killed (SIGKILL) and restarted on the same port and data directory. :class:`RedisNodes`
is ``n`` independent masters (Redlock), :class:`RedisPrimaryReplica` a primary with one replica behind a proxy, and
:class:`RedisClusterServers` a real Redis Cluster built with redis-py only (no ``redis-cli`` needed). Every wait has
a deadline, only processes started here are signalled (by PID), and whatever is still open at exit is closed.
Not thread-safe: drive one server from one thread at a time. Typical use::

    with RedisServer(durable=True) as srv:
        r = srv.client()
        r.set("k", "v", px=60_000)
        srv.kill()            # SIGKILL, nothing flushed beyond the fsync'ed AOF
        srv.restart()         # same port, same --dir: "k" and its TTL come back

    with RedisClusterServers(3) as cluster:
        rc = cluster.client() # redis.RedisCluster
        rc.set("a", 1)

Modules: ``_child`` (the process base every server of the harness shares, free ports), ``_process`` (binary
lookup, a raw RESP probe), ``_server`` (one process), ``_groups`` (nodes and primary/replica), ``_cluster``.
"""

from ._child import free_port
from ._cluster import CLUSTER_SLOTS as CLUSTER_SLOTS
from ._cluster import CLUSTER_TIMEOUT as CLUSTER_TIMEOUT
from ._cluster import RedisClusterServers
from ._groups import RedisNodes, RedisPrimaryReplica
from ._process import find_server_binary, server_version
from ._server import START_TIMEOUT as START_TIMEOUT
from ._server import STOP_TIMEOUT as STOP_TIMEOUT
from ._server import RedisServer

__all__ = [
    "RedisClusterServers",
    "RedisNodes",
    "RedisPrimaryReplica",
    "RedisServer",
    "find_server_binary",
    "free_port",
    "server_version",
]
