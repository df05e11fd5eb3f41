"""`SQLGuard(dialect="mysql")` on a real MariaDB server (InnoDB, REPEATABLE READ, PyMySQL: a driver that counts
the rows an UPDATE changed), and with a real lock on Redis in front of it.

Each promise of the guard, run on the server it is written for: fences kept per name, compared byte for byte;
the same holder accepted again; a lower fence refused; InnoDB's longest key; a transaction whose snapshot is older
than the last accepted fence refused (the locking read); two holders' transactions serialised on the row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock.testing.servers import RedisServer
from tests._mariadb import MariaDBServer
from tests.conftest import IN_CI

GUARD = fencelock.SQLGuard(paramstyle="format", dialect="mysql")


@pytest.fixture(scope="module")
def mariadb() -> Iterator[MariaDBServer]:
    try:
        server = MariaDBServer()
        import pymysql  # noqa: F401
    except (RuntimeError, ImportError) as exc:
        if IN_CI:
            pytest.fail(f"CI must run the MySQL guard's tests: {exc}")
        pytest.skip(str(exc))
    with server:
        yield server


@pytest.fixture
def db(mariadb: MariaDBServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A database of this test's own, with the fence table and an account row."""
    name = f"t_{abs(hash(request.node.nodeid)) % 10**12}"
    admin = mariadb.connect(autocommit=True)
    cur = admin.cursor()
    cur.execute(f"DROP DATABASE IF EXISTS {name}")
    cur.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    conn = mariadb.connect(database=name)
    with conn.cursor() as c:
        GUARD.create_table(c)
        GUARD.create_table(c)  # (again: it exists already)
        c.execute("CREATE TABLE accounts (id INT PRIMARY KEY, owner VARCHAR(64) NOT NULL) ENGINE=InnoDB")
        c.execute("INSERT INTO accounts VALUES (42, 'nobody')")
    conn.commit()
    conn.database = name
    try:
        yield conn
    finally:
        conn.close()
        cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


def _open(mariadb: MariaDBServer, db: Any) -> Any:
    return mariadb.connect(database=db.database)


def _write(conn: Any, name: str, fence: int, owner: str) -> None:
    """The guard's check and the write it protects, in one transaction."""
    try:
        with conn.cursor() as cur:
            GUARD.check(cur, name, fence)
            cur.execute("UPDATE accounts SET owner = %s WHERE id = 42", (owner,))
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def _owner(conn: Any) -> str:
    conn.commit()  # (a fresh snapshot)
    with conn.cursor() as cur:
        cur.execute("SELECT owner FROM accounts WHERE id = 42")
        return str(cur.fetchone()[0])


def test_fences_per_name_on_mariadb(db: Any) -> None:
    _write(db, "a", 10, "a10")
    _write(db, "b", 2, "b2")  # another name has its own fence
    _write(db, "a", 10, "a10 again")  # the same holder again: the UPDATE changes no row, PyMySQL reports 0
    with pytest.raises(fencelock.StaleFence) as info:
        _write(db, "a", 9, "a9")
    assert (info.value.fence, info.value.highest) == (9, 10)
    assert _owner(db) == "a10 again"
    with db.cursor() as cur:
        assert GUARD.highest(cur, "a") == 10
        assert GUARD.highest(cur, "c") is None


def test_names_that_a_collation_would_call_equal_keep_fences_of_their_own(db: Any) -> None:
    """MariaDB's default collations are case- and accent-insensitive; lock names are compared byte for byte."""
    _write(db, "Orders", 9, "big")
    _write(db, "orders", 1, "small")  # (with a collated key: "fence 1 rejected: fence 9 was already accepted")
    _write(db, "ordérs", 1, "accent")
    with db.cursor() as cur:
        assert [GUARD.highest(cur, n) for n in ("Orders", "orders", "ordérs")] == [9, 1, 1]


def test_the_longest_name_innodb_keys_is_kept_and_a_longer_one_refused_before_anything_is_sent(db: Any) -> None:
    longest = "\N{GRINNING FACE}" * 768  # 3,072 bytes of UTF-8
    _write(db, longest, 3, "long")
    with db.cursor() as cur:
        assert GUARD.highest(cur, longest) == 3
    with pytest.raises(ValueError, match="3072 bytes"):
        _write(db, longest + "x", 4, "longer")
    with db.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM fencelock_fences")
        assert cur.fetchone()[0] == 1


def test_a_transaction_whose_snapshot_predates_a_newer_fence_is_refused(mariadb: MariaDBServer, db: Any) -> None:
    """Holder 9 wrote before; its next transaction reads (REPEATABLE READ fixes its snapshot there), then holder 10
    commits a write, then holder 9 checks its fence 9. The snapshot still shows 9: only the locking read sees 10."""
    _write(db, "acct", 9, "holder 9")
    old, new = _open(mariadb, db), _open(mariadb, db)
    try:
        with old.cursor() as cur:
            cur.execute("SELECT fence FROM fencelock_fences WHERE name = 'acct'")
            assert cur.fetchone()[0] == 9  # (the snapshot is taken)
        _write(new, "acct", 10, "holder 10")
        with pytest.raises(fencelock.StaleFence) as info:
            _write(old, "acct", 9, "holder 9, late")
        assert info.value.highest == 10
        assert _owner(db) == "holder 10"
    finally:
        old.close()
        new.close()


def test_a_lower_fence_waiting_on_the_row_is_refused_once_the_higher_commits(mariadb: MariaDBServer,
                                                                           db: Any) -> None:
    """Holder 10 has checked (the row is locked) and not committed; holder 9's check waits for the row, and once
    10 commits it is refused: the order on the server, not in the clients, decides."""
    first, second = _open(mariadb, db), _open(mariadb, db)
    events: list[str] = []
    outcome: list[BaseException | None] = []
    try:
        with first.cursor() as cur:
            GUARD.check(cur, "row", 10)
            cur.execute("UPDATE accounts SET owner = 'holder 10' WHERE id = 42")

        def late() -> None:
            try:
                events.append("9 checks")
                _write(second, "row", 9, "holder 9")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)
            events.append("9 done")

        thread = threading.Thread(target=late)
        thread.start()
        _until_a_transaction_waits_for_a_lock(mariadb)
        events.append("10 commits")
        first.commit()
        thread.join(10.0)
        assert events == ["9 checks", "10 commits", "9 done"], events  # (9 waited on the row lock)
        assert len(outcome) == 1
        assert isinstance(outcome[0], fencelock.StaleFence), outcome
        assert _owner(db) == "holder 10"
    finally:
        first.close()
        second.close()


def _until_a_transaction_waits_for_a_lock(mariadb: MariaDBServer) -> None:
    admin = mariadb.connect(autocommit=True)
    try:
        deadline = time.monotonic() + 10.0
        while True:
            with admin.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'")
                if cur.fetchone()[0]:
                    return
            assert time.monotonic() < deadline, "the second transaction never waited for the row"
            time.sleep(0.01)
    finally:
        admin.close()


def test_a_holder_paused_past_its_ttl_cannot_overwrite_the_next_holders_write(mariadb: MariaDBServer, db: Any,
                                                                             name: str) -> None:
    """The pitfall end to end: A holds the lock (Redis), stalls past its TTL, B acquires with a higher fence and
    writes; A's write then reaches MariaDB and is refused. The row keeps B's write."""
    with RedisServer() as redis:
        locks = fencelock.connect(redis.url)
        try:
            a = locks.acquire(name, ttl=0.3, wait=0)
            time.sleep(0.5)  # A is paused past its TTL (a GC pause, a stalled VM)
            b = locks.acquire(name, ttl=5.0, wait=0)
            assert b.fence > a.fence
            _write(_open(mariadb, db), name, b.fence, "B")
            with pytest.raises(fencelock.StaleFence):
                _write(_open(mariadb, db), name, a.fence, "A, late")
            assert _owner(db) == "B"
            b.release()
        finally:
            locks.close()
