"""Fencing guards: storage rejects writes from holders whose lease ran out. Real Redis, real SQLite."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

import fencelock
from fencelock._logic.fencing import accepts
from fencelock.testing.servers import RedisClusterServers
from tests.conftest import RedisFamily


def _pause_past_ttl(lease: fencelock.Lease) -> None:
    """The holder stops (a GC pause, a stalled VM) until well after its lease ran out."""
    time.sleep(lease.ttl + 0.1)
    assert lease.remaining() == 0.0


def test_redis_guard_rejects_the_writer_that_paused_past_its_ttl(locks: fencelock.Locks, name: str,
                                                                 deployment: RedisFamily) -> None:
    raw: Any = deployment.raw()
    guard = fencelock.RedisGuard(raw)
    data = guard.key(name, "balance")
    a = locks.acquire(name, ttl=0.2, wait=0)
    _pause_past_ttl(a)
    b = locks.acquire(name, ttl=5.0, wait=0)
    guard.set(name, b.fence, data, "written by B")
    with pytest.raises(fencelock.StaleFence) as info:
        guard.set(name, a.fence, data, "written by A, who thinks it still holds the lock")
    assert info.value.fence == a.fence
    assert info.value.highest == b.fence
    assert info.value.name == name
    assert raw.get(data) == b"written by B"
    assert guard.highest(name) == b.fence
    guard.set(name, b.fence, data, "B writes again")  # the current holder may write many times
    assert raw.get(data) == b"B writes again"
    b.release()


def test_without_a_guard_the_paused_writer_overwrites_the_new_holder(locks: fencelock.Locks, name: str,
                                                                   deployment: RedisFamily) -> None:
    """The classic failure the guard exists for: a lock alone does not protect the resource."""
    raw: Any = deployment.raw()
    data = f"unguarded:{{{name}}}"
    a = locks.acquire(name, ttl=0.2, wait=0)
    _pause_past_ttl(a)
    b = locks.acquire(name, ttl=5.0, wait=0)
    raw.set(data, "written by B")
    raw.set(data, "written by A")  # A wakes up and writes: nothing stops it
    assert raw.get(data) == b"written by A"
    b.release()


def test_async_redis_guard(deployment: RedisFamily, name: str) -> None:
    import redis.asyncio

    async def main() -> None:
        first = deployment.target[0] if isinstance(deployment.target, list) else deployment.target
        url = first.replace("redis+cluster://", "redis://")
        raw: Any = (redis.asyncio.RedisCluster if deployment.kind == "cluster" else redis.asyncio.Redis).from_url(url)
        guard = fencelock.aio.RedisGuard(raw)
        await guard.set(name, 7, guard.key(name, "x"), "seven")
        with pytest.raises(fencelock.StaleFence):
            await guard.set(name, 6, guard.key(name, "x"), "six")
        assert await raw.get(guard.key(name, "x")) == b"seven"
        assert await guard.highest(name) == 7
        await raw.aclose()

    asyncio.run(main())


@pytest.mark.parametrize(("fence", "error"), [(0, ValueError), (-3, ValueError), (True, TypeError),
                                              (1.5, TypeError), ("3", TypeError)])
def test_guards_reject_bad_fences_before_writing(deployment: RedisFamily, name: str, fence: Any,
                                                 error: type[Exception]) -> None:
    guard = fencelock.RedisGuard(deployment.raw())
    with pytest.raises(error, match="fence"):
        guard.set(name, fence, guard.key(name, "x"), "v")
    conn = sqlite3.connect(":memory:")
    with pytest.raises(error, match="fence"):
        fencelock.SQLGuard().check(conn.cursor(), name, fence)


def test_a_cluster_guard_refuses_a_data_key_in_another_slot_before_sending(cluster: RedisClusterServers,
                                                                          name: str) -> None:
    """Invariant: on a Redis Cluster the guard's script needs the data key in the guard key's slot; one elsewhere
    is a ValueError that names the key, the lock and the way out, and nothing reaches a server."""
    raw: Any = cluster.client()
    guard = fencelock.RedisGuard(raw)
    elsewhere = next(f"plain:{i}" for i in range(1000)
                     if key_slot(f"plain:{i}".encode()) != key_slot(guard.key(name, "x").encode()))
    with pytest.raises(ValueError, match=r"key.*slot.*guard\.key") as info:
        guard.set(name, 3, elsewhere, "v")
    assert repr(name) in str(info.value)
    assert raw.exists(elsewhere) == 0
    assert guard.highest(name) is None  # the guard's own key was not touched either

    async def main() -> None:
        import redis.asyncio

        client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        with pytest.raises(ValueError, match="slot"):
            await fencelock.aio.RedisGuard(client).set(name, 3, elsewhere, "v")
        await client.aclose()

    asyncio.run(main())
    guard.set(name, 3, guard.key(name, "x"), "v")  # the key guard.key gives is always in the slot


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_the_redis_guard_refuses_a_value_that_is_no_finite_number(deployment: RedisFamily, name: str,
                                                                   value: float) -> None:
    guard = fencelock.RedisGuard(deployment.raw())
    with pytest.raises(ValueError, match="value") as info:
        guard.set(name, 3, guard.key(name, "x"), value)
    assert repr(name) in str(info.value)
    assert guard.highest(name) is None


def test_the_redis_guard_refuses_its_own_key_as_the_data_key(deployment: RedisFamily, name: str) -> None:
    """Written over, the guard's own key would no longer hold a fence: every later write would fail or pass."""
    raw: Any = deployment.raw()
    guard = fencelock.RedisGuard(raw)
    guard.set(name, 3, guard.key(name, "x"), "v")
    with pytest.raises(ValueError, match="guard") as info:
        guard.set(name, 4, guard._guard_key(name), "overwritten")
    assert repr(name) in str(info.value)
    assert guard.highest(name) == 3


# -- SQL ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def db(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / "bank.db")
    with conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT NOT NULL)")
        conn.execute("INSERT INTO accounts VALUES (42, 'nobody')")
        fencelock.SQLGuard().create_table(conn.cursor())
    return conn


def _write(conn: sqlite3.Connection, guard: fencelock.SQLGuard, name: str, fence: int, owner: str) -> None:
    with conn:  # one transaction: the guard's check and the write commit together, or neither does
        cur = conn.cursor()
        guard.check(cur, name, fence)
        cur.execute("UPDATE accounts SET owner = ? WHERE id = 42", (owner,))


def test_sql_guard_keeps_fences_per_name(db: sqlite3.Connection) -> None:
    guard = fencelock.SQLGuard()
    _write(db, guard, "a", 10, "a10")
    _write(db, guard, "b", 2, "b2")          # another name has its own fence
    _write(db, guard, "a", 10, "a10 again")  # the same holder again
    with pytest.raises(fencelock.StaleFence):
        _write(db, guard, "a", 9, "a9")
    assert guard.highest(db.cursor(), "a") == 10
    assert guard.highest(db.cursor(), "c") is None


class _ChangedRowsCursor:
    """A DB-API cursor whose `rowcount` after an UPDATE counts the rows it *changed*, as MySQL's drivers report by
    default (without the FOUND_ROWS flag), not the rows it matched: here on SQLite, over its own cursor."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor
        self.rowcount = -1

    def execute(self, operation: str, parameters: Any = ()) -> Any:
        if not operation.startswith("UPDATE"):
            self._cursor.execute(operation, parameters)
            self.rowcount = self._cursor.rowcount
            return self
        before = self._cursor.execute("SELECT fence FROM fencelock_fences WHERE name = ?", (parameters[1],))
        old = before.fetchone()
        self._cursor.execute(operation, parameters)
        after = self._cursor.execute("SELECT fence FROM fencelock_fences WHERE name = ?", (parameters[1],))
        self.rowcount = int(after.fetchone() != old)
        return self

    def fetchone(self) -> Any:
        return self._cursor.fetchone()


def test_sql_guard_accepts_the_same_holder_again_where_the_driver_counts_changed_rows(
        db: sqlite3.Connection) -> None:
    """MySQL reports 0 rows for an UPDATE that writes the value already there: the same holder writing again with
    its fence must still be accepted (before, it was refused as stale), and a lower fence still refused."""
    guard = fencelock.SQLGuard()
    with db:
        guard.check(_ChangedRowsCursor(db.cursor()), "a", 10)
    with db:
        guard.check(_ChangedRowsCursor(db.cursor()), "a", 10)  # unchanged row, rowcount 0: still this holder's
    with db, pytest.raises(fencelock.StaleFence) as info:
        guard.check(_ChangedRowsCursor(db.cursor()), "a", 9)
    assert (info.value.fence, info.value.highest) == (9, 10)


def test_sql_guard_mysql_statements() -> None:
    """MySQL's statements, read as SQL (they run on MariaDB in tests/guards): names compared byte for byte (a
    VARBINARY key, never a case- or accent-insensitive collation that would let two lock names share a fence), a
    key that fits InnoDB's 3072-byte limit, an insert that fails loudly (not INSERT IGNORE, which truncates a value
    silently), and the recorded fence read with a locking read (a snapshot read could show an older one)."""
    guard = fencelock.SQLGuard(paramstyle="format", dialect="mysql")
    assert guard._create == ("CREATE TABLE IF NOT EXISTS fencelock_fences "
                             "(name VARBINARY(3072) PRIMARY KEY, fence BIGINT NOT NULL)")
    assert guard._ensure == ("INSERT INTO fencelock_fences (name, fence) VALUES (%s, 0) "
                             "ON DUPLICATE KEY UPDATE name = name")
    assert guard._advance == "UPDATE fencelock_fences SET fence = %s WHERE name = %s AND fence <= %s"
    assert guard._recorded == "SELECT fence FROM fencelock_fences WHERE name = %s FOR UPDATE"
    conn = sqlite3.connect(":memory:")
    with pytest.raises(ValueError, match="3072 bytes"):
        guard.check(conn.cursor(), "\N{GRINNING FACE}" * 800, 1)  # 3,200 bytes of UTF-8: no such key in MySQL


def test_sql_guard_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="table"):
        fencelock.SQLGuard(table="fences; DROP TABLE accounts")
    with pytest.raises(ValueError, match="paramstyle"):
        fencelock.SQLGuard(paramstyle="numeric")


@given(st.lists(st.integers(1, 20), min_size=1, max_size=30))
def test_both_guards_follow_the_fencing_rule(fences: list[int]) -> None:
    """The SQL guard accepts exactly the writes `fencing.accepts` accepts (the Redis guard: see above)."""
    conn = sqlite3.connect(":memory:")
    guard = fencelock.SQLGuard()
    guard.create_table(conn.cursor())
    highest: int | None = None
    for fence in fences:
        expected = accepts(fence, highest)
        try:
            with conn:
                guard.check(conn.cursor(), "n", fence)
            accepted = True
        except fencelock.StaleFence:
            accepted = False
        assert accepted == expected
        if accepted:
            highest = fence if highest is None else max(highest, fence)


def test_the_redis_guard_follows_the_fencing_rule(deployment: RedisFamily, name: str) -> None:
    import random

    rng = random.Random(11)
    guard = fencelock.RedisGuard(deployment.raw())
    highest: int | None = None
    for step in range(60):
        fence = rng.randint(1, 30)
        try:
            guard.set(name, fence, guard.key(name, "x"), str(step))
            accepted = True
        except fencelock.StaleFence:
            accepted = False
        assert accepted == accepts(fence, highest)
        if accepted:
            highest = fence if highest is None else max(highest, fence)
    assert guard.highest(name) == highest
