"""A redis-py client passed in never lends its `Retry` to fencelock's requests: a release, a forced release or a
grant goes to the server once per fencelock's own rule (`_redis/request.py`), never again because redis-py's retry
policy re-sent it after a reply that did not come. Sent twice, a release's second answer ("gone") was read as a
loss and reported `LockLost` for a release that had worked; a forced release sent twice could delete the next
holder's key.

A Redis Cluster of this module's own, whose primary for the lock is stopped (SIGSTOP) across the release, longer
than the client's socket timeout; the server's slow log (every command) says how often the release ran.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock._scripts import GUARD_SET, RELEASE
from fencelock.testing.faults import LOSE, FaultProxy, Rule
from fencelock.testing.servers import RedisClusterServers, RedisServer
from tests.conftest import _require_server_binary

SOCKET_TIMEOUT = 0.3
STALL = 1.0  # seconds the primary stays stopped: several socket timeouts, well below the node timeout (5 s)


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[RedisClusterServers]:
    _require_server_binary()
    with RedisClusterServers(3) as cluster:
        yield cluster


def _owner(cluster: RedisClusterServers, name: str) -> RedisServer:
    slot = key_slot(redis_keys(name).lock.encode())
    admin: Any = cluster.nodes[0].client()
    for low, high, primary, *_ in admin.execute_command("CLUSTER", "SLOTS"):
        if low <= slot <= high:
            return next(node for node in cluster.nodes if node.port == int(primary[1]))
    raise AssertionError(f"no primary serves slot {slot}")


def _releases_run(raw: Any) -> int:
    entries: Any = raw.slowlog_get(10000)
    return sum(1 for e in entries if bytes(e["command"]).startswith(b"EVALSHA " + RELEASE.sha.encode()))


def _stalled_for(server: RedisServer, seconds: float) -> threading.Timer:
    server.pause()
    timer = threading.Timer(seconds, server.resume)
    timer.start()
    return timer


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_users_cluster_client_retry_never_sends_a_release_again(own_cluster: RedisClusterServers, name: str,
                                                                  front: str) -> None:
    owner = _owner(own_cluster, name)
    raw: Any = owner.client()
    raw.config_set("slowlog-log-slower-than", 0)
    raw.config_set("slowlog-max-len", 10000)
    raw.script_load(RELEASE.source)  # (so that every sending runs: none is answered NOSCRIPT)
    retry = Retry(NoBackoff(), 3)  # the user's policy: any command again, three times
    options: dict[str, Any] = {"host": "127.0.0.1", "port": own_cluster.nodes[0].port, "socket_timeout": SOCKET_TIMEOUT,
               "socket_connect_timeout": SOCKET_TIMEOUT}
    outcome: list[BaseException | None] = []
    try:
        if front == "sync":
            client = redis.RedisCluster(retry=retry, **options)
            locks = fencelock.connect(client)
            lease = locks.acquire(name, ttl=10.0, wait=0)
            raw.slowlog_reset()
            timer = _stalled_for(owner, STALL)
            try:
                lease.release()
                outcome.append(None)
            except fencelock.LockError as exc:
                outcome.append(exc)
            timer.join()
            if isinstance(outcome[0], fencelock.BackendError):
                lease.release()  # in doubt: released now, or the retry finds our first sending's work
            locks.close()
            client.close()
        else:
            async def main() -> None:
                client = redis.asyncio.RedisCluster(retry=AsyncRetry(NoBackoff(), 3), **options)
                locks = fencelock.aio.connect(client)
                lease = await locks.acquire(name, ttl=10.0, wait=0)
                raw.slowlog_reset()
                timer = _stalled_for(owner, STALL)
                try:
                    await lease.release()
                    outcome.append(None)
                except fencelock.LockError as exc:
                    outcome.append(exc)
                await asyncio.to_thread(timer.join)
                if isinstance(outcome[0], fencelock.BackendError):
                    await lease.release()
                await locks.aclose()
                await client.aclose()

            asyncio.run(main())
    finally:
        owner.resume()
    # The one sending got no reply within the socket timeout: the call says so (it was not sent again behind the
    # caller's back, to come back "released", or "gone" and so LockLost for a release that had worked).
    assert isinstance(outcome[0], fencelock.BackendError), outcome[0]
    assert raw.exists(redis_keys(name).lock) == 0
    # Sent once by the call (which ran, or not, when the primary came back), once by the caller's retry.
    assert 1 <= _releases_run(raw) <= 2


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_users_redis_client_retry_never_sends_a_guarded_write_again(own_server: RedisServer, name: str,
                                                                     front: str) -> None:
    """One Redis: a guarded write whose reply is lost is reported once the socket timeout ends, sent once."""
    own_server.client().script_load(GUARD_SET.source)
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        options: dict[str, Any] = {"host": "127.0.0.1", "port": proxy.port, "socket_timeout": SOCKET_TIMEOUT}
        proxy.arm(Rule(LOSE, "guard_set"))
        if front == "sync":
            client = redis.Redis(retry=Retry(NoBackoff(), 3), **options)
            guard = fencelock.RedisGuard(client)
            with pytest.raises(fencelock.BackendError, match="TimeoutError"):
                guard.set(name, 5, guard.key(name, "data"), "v")
            guard.set(name, 5, guard.key(name, "data"), "v")  # (the connection left behind is not reused)
            client.close()
        else:
            async def main() -> None:
                client = redis.asyncio.Redis(retry=AsyncRetry(NoBackoff(), 3), **options)
                guard = fencelock.aio.RedisGuard(client)
                with pytest.raises(fencelock.BackendError, match="TimeoutError"):
                    await guard.set(name, 5, guard.key(name, "data"), "v")
                await guard.set(name, 5, guard.key(name, "data"), "v")
                await client.aclose()

            asyncio.run(main())
    assert [r.name for r in proxy.requests if r.name == "guard_set"] == ["guard_set", "guard_set"]
