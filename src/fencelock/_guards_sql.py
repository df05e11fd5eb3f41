"""The SQL fencing guard, for any DB-API 2.0 database (tested on SQLite).

Inside the transaction that writes the protected rows, `guard.check(cursor, name, fence)` first records the fence
for `name` in a small table, and raises `StaleFence` if a higher fence was already recorded. The row stays locked
by the transaction until it commits, so a stale writer can never commit its write after a newer holder's:

    with conn:                                  # one transaction
        cur = conn.cursor()
        guard.check(cur, "orders:42", lease.fence)
        cur.execute("UPDATE orders SET state = ? WHERE id = 42", ("paid",))

The rule is `fencelock._logic.fencing.accepts`: accept a fence at least as high as the highest accepted.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from ._errors import StaleFence
from ._logic.args import check_name
from ._logic.fencing import check_fence

_PLACEHOLDERS = {"qmark": "?", "format": "%s", "pyformat": "%s"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
MYSQL_NAME_BYTES = 3072
"""The longest name the MySQL guard keeps: InnoDB's longest index key, in bytes (its name column is VARBINARY)."""


class Cursor(Protocol):
    """The part of a DB-API 2.0 cursor the guard uses."""

    @property
    def rowcount(self) -> int: ...
    def execute(self, operation: str, parameters: Any = ..., /) -> Any: ...
    def fetchone(self) -> Any: ...


class SQLGuard:
    """Fencing for rows in a SQL database. `paramstyle` is your driver's (`sqlite3.paramstyle` is "qmark");
    `dialect="mysql"` for MySQL and MariaDB (whose names are then at most 3072 bytes of UTF-8)."""

    def __init__(self, *, table: str = "fencelock_fences", paramstyle: str = "qmark",
                 dialect: str = "standard") -> None:
        if not isinstance(table, str) or not _IDENTIFIER.fullmatch(table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        if paramstyle not in _PLACEHOLDERS:
            raise ValueError(f"paramstyle must be one of {', '.join(_PLACEHOLDERS)}, got {paramstyle!r}")
        if dialect not in ("standard", "mysql"):
            raise ValueError(f"dialect must be 'standard' (SQLite, PostgreSQL) or 'mysql', got {dialect!r}")
        p = _PLACEHOLDERS[paramstyle]
        self.table = table
        self._mysql = dialect == "mysql"
        self._read = f"SELECT fence FROM {table} WHERE name = {p}"
        self._advance = f"UPDATE {table} SET fence = {p} WHERE name = {p} AND fence <= {p}"
        if self._mysql:
            # Names compared byte for byte (a VARBINARY key: MySQL's default collations are case- and accent-
            # insensitive, which would give two lock names one fence), within InnoDB's 3072-byte key; an insert
            # that fails loudly (INSERT IGNORE truncates silently); the fence read with a locking read (a plain
            # SELECT may read the transaction's older snapshot).
            self._create = (f"CREATE TABLE IF NOT EXISTS {table} "
                            "(name VARBINARY(3072) PRIMARY KEY, fence BIGINT NOT NULL)")
            self._ensure = f"INSERT INTO {table} (name, fence) VALUES ({p}, 0) ON DUPLICATE KEY UPDATE name = name"
            self._recorded = f"{self._read} FOR UPDATE"
        else:
            self._create = (f"CREATE TABLE IF NOT EXISTS {table} "
                            "(name VARCHAR(1024) PRIMARY KEY, fence BIGINT NOT NULL)")
            self._ensure = f"INSERT INTO {table} (name, fence) VALUES ({p}, 0) ON CONFLICT (name) DO NOTHING"
            self._recorded = self._read

    def create_table(self, cursor: Cursor) -> None:
        """Create the fence table if it does not exist (or create it yourself: name PRIMARY KEY, fence BIGINT)."""
        cursor.execute(self._create)

    def check(self, cursor: Cursor, name: str, fence: int) -> None:
        """Record `fence` for `name` in the current transaction, or raise `StaleFence` if a newer one is recorded.

        Call it in the same transaction as the write it protects, before that write; commit both together.
        """
        name = check_name(name)
        fence = check_fence(fence, name)
        if self._mysql and len(name.encode("utf-8")) > MYSQL_NAME_BYTES:
            raise ValueError(f"name must be at most {MYSQL_NAME_BYTES} bytes of UTF-8 for the MySQL guard (InnoDB's "
                             f"longest key), got {len(name.encode('utf-8'))} (lock {name!r})")
        cursor.execute(self._ensure, (name,))
        cursor.execute(self._advance, (fence, name, fence))
        if cursor.rowcount == 1:
            return
        # 0 rows: a newer fence is recorded, or (MySQL's drivers count the rows an UPDATE *changed*) this very fence
        # is, written by this holder before. The row is locked by the UPDATE: read what it holds.
        cursor.execute(self._recorded, (name,))
        row = cursor.fetchone()
        highest = 0 if row is None or not row[0] else int(row[0])
        if highest == fence:
            return
        raise StaleFence(f"write with fence {fence} rejected: fence {highest} was already accepted",
                         name=name, fence=fence, highest=highest)

    def highest(self, cursor: Cursor, name: str) -> int | None:
        """The highest fence recorded for `name`, or None."""
        cursor.execute(self._read, (check_name(name),))
        row = cursor.fetchone()
        return None if row is None or not row[0] else int(row[0])
