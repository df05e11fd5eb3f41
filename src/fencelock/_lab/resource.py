"""The protected resource: a read-modify-write counter behind a small TCP service, with or without a guard.

Guarded, each read and write runs `fencelock.SQLGuard.check` in the transaction that serves it; every access is
logged with the monotonic time it was decided (why: docs/design/lab-report.md).

Protocol: one JSON object per line each way.
    {"op": "read", "name": N, "worker": W, "fence": F}           -> {"ok": bool, "value": int (if ok)}
    {"op": "write", "name": N, "worker": W, "fence": F, "read": R, "sent": T}
                                                                 -> {"ok": bool, "detail": str}
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from typing import Any

from .._errors import StaleFence
from .._guards_sql import SQLGuard
from ..testing._threaded import ThreadedServer
from .history import Event


class Resource(ThreadedServer):
    """One counter store on a free loopback port. `guarded=False` accepts every write (the unfenced configs)."""

    def __init__(self, *, guarded: bool) -> None:
        super().__init__("lab-resource")
        self.guarded = guarded
        self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._db.execute("CREATE TABLE counter (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        self._db.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, t REAL, kind TEXT, worker TEXT, fence INTEGER, "
                         "ok INTEGER, read INTEGER, before INTEGER, sent REAL, detail TEXT)")
        self._guard = SQLGuard()
        self._guard.create_table(self._db.cursor())
        self._lock = threading.Lock()
        self._clients: set[asyncio.BaseTransport] = set()

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def close(self) -> None:
        """Stop serving (see `ThreadedServer.close`) and close the store. Idempotent."""
        super().close()
        self._db.close()

    def _connections(self) -> Iterable[asyncio.BaseTransport]:
        return list(self._clients)

    def value(self, name: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM counter WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def events(self) -> list[Event]:
        """Every read and write decided so far, in the order it was decided (a read's `before` is the value it
        read)."""
        with self._lock:
            rows = self._db.execute("SELECT t, kind, worker, fence, ok, read, before, sent, detail FROM log "
                                    "ORDER BY seq").fetchall()
        return [Event(t, worker, "read" if kind == "read" else "write", fence=fence, ok=bool(ok), read=read,
                      before=before, sent=sent, detail=detail)
                for t, kind, worker, fence, ok, read, before, sent, detail in rows]

    # -- the service --------------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        self._clients.add(transport)
        try:
            while line := await reader.readline():
                try:
                    reply = self.handle(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a worker went away, or the lab is shutting the resource down
        finally:
            writer.transport.abort()
            self._clients.discard(transport)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        name, op = str(request["name"]), request["op"]
        if op not in ("read", "write"):
            raise ValueError(f"unknown op {op!r}")
        worker, fence = str(request.get("worker", "?")), request.get("fence")
        if self.guarded and op == "write" and not isinstance(fence, int):
            raise TypeError(f"a guarded write needs an int fence, got {fence!r}")
        read = int(request["read"]) if op == "write" else None
        sent = request.get("sent")
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            now = time.monotonic()
            before_row = cur.execute("SELECT value FROM counter WHERE name = ?", (name,)).fetchone()
            before = int(before_row[0]) if before_row else 0
            ok, detail = True, "accepted"
            try:
                if self.guarded and isinstance(fence, int):  # a read without a fence (the lab looking) passes
                    self._guard.check(cur, name, fence)
                    detail = f"accepted by the guard (fence {fence})"
                if read is not None:
                    cur.execute("INSERT INTO counter (name, value) VALUES (?, ?) "
                                "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, read + 1))
            except StaleFence as exc:
                cur.execute("ROLLBACK")
                cur.execute("BEGIN IMMEDIATE")
                ok, detail = False, f"rejected by the guard: fence {fence} < {exc.highest}"
            if sent is not None:
                detail += f"; sent {now - float(sent):.3f} s before it was decided"
            cur.execute("INSERT INTO log (t, kind, worker, fence, ok, read, before, sent, detail) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (now, op, worker, fence, int(ok), read, before, sent,
                                                              detail))
            cur.execute("COMMIT")
        if op == "read":
            return {"ok": ok, "value": before} if ok else {"ok": False, "detail": detail}
        return {"ok": ok, "detail": detail}
