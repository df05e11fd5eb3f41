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
import contextlib
import json
import sqlite3
import threading
import time
from typing import Any

from .._errors import StaleFence
from .._guards_sql import SQLGuard
from ..testing.proxy import wind_down
from .history import Event

START_TIMEOUT = 5.0


class Resource:
    """One counter store on a free loopback port. `guarded=False` accepts every write (the unfenced configs)."""

    def __init__(self, *, guarded: bool) -> None:
        self.guarded = guarded
        self.host = "127.0.0.1"
        self.port = 0
        self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._db.execute("CREATE TABLE counter (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        self._db.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, t REAL, kind TEXT, worker TEXT, fence INTEGER, "
                         "ok INTEGER, read INTEGER, before INTEGER, sent REAL, detail TEXT)")
        self._guard = SQLGuard()
        self._guard.create_table(self._db.cursor())
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._transports: set[asyncio.Transport] = set()
        self._closing = False
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self) -> Resource:
        self._thread = threading.Thread(target=self._run, name="fencelock-lab-resource", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT) or not self.port:
            raise RuntimeError(f"the lab's resource did not start within {START_TIMEOUT:g} s")
        return self

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            if self._thread is not None:
                self._thread.join(START_TIMEOUT)
        self._db.close()

    async def _shutdown(self) -> None:
        self._closing = True
        try:
            assert self._server is not None
            await wind_down(self._server, lambda: list(self._transports))
        finally:
            asyncio.get_running_loop().stop()

    def __enter__(self) -> Resource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            server = loop.run_until_complete(asyncio.start_server(self._serve, self.host, 0))
            self.port = int(server.sockets[0].getsockname()[1])
            self._server = server
            self._ready.set()
            loop.run_forever()  # until `_shutdown` has closed every connection
        finally:
            self._ready.set()
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport: Any = writer.transport
        if self._closing:
            transport.abort()
            return
        self._transports.add(transport)
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
            self._transports.discard(transport)

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
