"""A Redis Cluster's own faults: a stalled primary, a slot being migrated.

One stalled Redis Cluster primary (SIGSTOP) never costs the leases on the healthy primaries: the watchdog sends a
batch per primary, each a pipeline of its slots' scripts, all at once and each bounded by its own socket timeout;
and releasing a lease on a healthy primary waits only for its own renewal, never for the stalled primary's batch.

Before, renewal sent one script call per slot, one after another, each bounded by the socket timeout: with the
stalled primary's slots first in the batch, every healthy lease ran out unrenewed, and a release waited for the
whole batch (9.4 s with 5 leases on the stalled primary). A cluster of this module's own (the test stops one of
its nodes, for less than the cluster's node timeout, and with `cluster-require-full-coverage no`); an independent
client reads the healthy primaries.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisClusterServers, RedisServer
from tests.conftest import _require_server_binary, lock_value, until

TTL = 1.2  # renewed every 0.4 s; the socket timeout (2 s) is longer than the whole validity
STALL = 2.6  # seconds the primary stays stopped: longer than a TTL, shorter than the cluster's node timeout (5 s)


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[RedisClusterServers]:
    _require_server_binary()
    with RedisClusterServers(3) as cluster:
        for node in cluster.nodes:
            node.client().config_set("cluster-require-full-coverage", "no")  # healthy shards keep serving
        yield cluster


def _owner(cluster: RedisClusterServers, name: str) -> RedisServer:
    slot = key_slot(redis_keys(name).lock.encode())
    admin: Any = cluster.nodes[0].client()
    for low, high, primary, *_ in admin.execute_command("CLUSTER", "SLOTS"):
        if low <= slot <= high:
            return next(node for node in cluster.nodes if node.port == int(primary[1]))
    raise AssertionError(f"no primary serves slot {slot}")


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_stalled_primary_loses_no_lease_elsewhere_and_holds_up_no_release(own_cluster: RedisClusterServers,
                                                                             name: str, front: str) -> None:
    stalled = own_cluster.nodes[2]
    candidates = [f"{name}:{i}" for i in range(400)]
    on_stalled = [n for n in candidates if _owner(own_cluster, n) is stalled][:5]
    healthy = [n for n in candidates if _owner(own_cluster, n) is not stalled][:4]
    order = on_stalled + healthy  # the stalled primary's slots first in each batch
    raw: Any = own_cluster.client()
    seen: dict[str, Any] = {}

    def during_stall(leases: dict[str, Any]) -> None:
        """(runs in a thread while the primary is stopped)"""
        for n in healthy[1:]:
            assert lock_value(raw, n) == leases[n].token

    if front == "sync":
        with fencelock.connect(own_cluster.url) as locks:
            leases = {n: locks.acquire(n, ttl=TTL, wait=0, renew=True) for n in order}
            stalled.pause()
            try:
                until(lambda: leases[on_stalled[0]]._life.renewal is not None, 5, "a renewal to the stalled primary")
                out: Any = leases[on_stalled[0]]._life.renewal
                leases[healthy[0]].release()  # while the stalled primary's batch is on the wire
                seen["stalled batch still out"] = not out.is_set()
                threading.Event().wait(STALL)
                seen["held"] = [leases[n].held for n in healthy[1:]]
                during_stall(leases)
            finally:
                stalled.resume()
            for n in healthy[1:]:
                leases[n].release()
    else:
        async def main() -> None:
            async with fencelock.aio.connect(own_cluster.url) as locks:
                # (at once: renewed in one batch, as leases taken one after another quickly are)
                got = await asyncio.gather(*(locks.acquire(n, ttl=TTL, wait=0, renew=True) for n in order))
                leases = dict(zip(order, got, strict=True))
                stalled.pause()
                try:
                    await asyncio.to_thread(until, lambda: leases[on_stalled[0]]._life.renewal is not None, 5,
                                            "a renewal to the stalled primary")
                    out: Any = leases[on_stalled[0]]._life.renewal
                    await leases[healthy[0]].release()
                    seen["stalled batch still out"] = not out.is_set()
                    await asyncio.sleep(STALL)
                    seen["held"] = [leases[n].held for n in healthy[1:]]
                    await asyncio.to_thread(during_stall, leases)
                finally:
                    stalled.resume()
                for n in healthy[1:]:
                    await leases[n].release()

        asyncio.run(main())
    assert seen["stalled batch still out"], "the release returned only after the stalled primary's batch ended"
    assert seen["held"] == [True] * 3, "a lease on a healthy primary was lost while another primary was stalled"
    assert lock_value(raw, healthy[0]) is None


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_lock_whose_slot_is_being_migrated_gives_a_backend_error_that_says_so(own_cluster: RedisClusterServers,
                                                                               name: str, front: str) -> None:
    """While a lock's slot is MIGRATING/IMPORTING, a script on its keys cannot run (TRYAGAIN, then redis-py's
    "TTL exhausted"): the error says the slot is being moved, names the lock, and is a `BackendError`."""
    source = _owner(own_cluster, name)
    target = next(node for node in own_cluster.nodes if node is not source)
    slot = key_slot(redis_keys(name).lock.encode())
    admins: list[Any] = [source.client(), target.client()]
    ids = [admin.execute_command("CLUSTER", "MYID") for admin in admins]
    with fencelock.connect(own_cluster.url) as holder:
        lease = holder.acquire(name, ttl=30.0, wait=0)
        admins[1].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[0])
        admins[0].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[1])
        try:
            if front == "sync":
                with fencelock.connect(own_cluster.url) as locks, pytest.raises(fencelock.BackendError) as caught:
                    locks.acquire(name, ttl=5.0, wait=0)
            else:
                async def main() -> None:
                    async with fencelock.aio.connect(own_cluster.url) as locks:
                        await locks.acquire(name, ttl=5.0, wait=0)

                with pytest.raises(fencelock.BackendError) as caught:
                    asyncio.run(main())
        finally:
            for admin in admins:
                admin.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        lease.release()
    assert caught.value.name == name
    assert "being moved between Redis Cluster primaries" in str(caught.value)

