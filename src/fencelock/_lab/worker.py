"""A lab worker: `python -m fencelock._lab.worker`, one JSON command per line on stdin, JSON lines on stdout.

It answers `{"event": {...}}` for each acquire, release or loss and `{"reply": {...}}` per command; the commands
(`op`) are those of `Worker.run`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from typing import Any

import redis

import fencelock

from .._redis.keys import redis_keys


class _ResourceClient:
    """A blocking line-JSON client for the lab's resource."""

    def __init__(self, address: tuple[str, int], timeout: float) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.file = self.sock.makefile("rb")

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.sock.sendall(json.dumps(request).encode() + b"\n")
        line = self.file.readline()
        if not line:
            raise ConnectionError("the resource closed the connection")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class Worker:
    def __init__(self) -> None:
        self.out_lock = threading.Lock()
        self.role = "?"
        self.name = ""
        self.target: Any = None
        self.options: dict[str, Any] = {}
        self.resource: tuple[str, int] | None = None
        self.locks: fencelock.Locks | None = None
        self.lease: fencelock.Lease | None = None
        self.store: _ResourceClient | None = None
        self.read_value = 0

    # -- output ---------------------------------------------------------------------------------------------

    def emit(self, kind: str, *, fence: int | None = None, ok: bool | None = None,
             lease_end: float | None = None, detail: str = "", t: float | None = None) -> None:
        event = {"t": time.monotonic() if t is None else t, "worker": self.role, "kind": kind, "fence": fence,
                 "ok": ok, "lease_end": lease_end, "detail": detail}
        self._send({"event": event})

    def _send(self, message: dict[str, Any]) -> None:
        with self.out_lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    # -- helpers ----------------------------------------------------------------------------------------------

    def _locks(self) -> fencelock.Locks:
        if self.locks is None:
            self.locks = fencelock.connect(self.target, **self.options)
        return self.locks

    def _store(self) -> _ResourceClient:
        if self.store is None:
            assert self.resource is not None, "connect first"
            self.store = _ResourceClient(self.resource, timeout=30.0)
        return self.store

    def _raw_nodes(self) -> list[redis.Redis]:
        urls = self.target if isinstance(self.target, list) else [self.target]
        return [redis.Redis.from_url(url) for url in urls]

    def _lease_end(self, lease: fencelock.Lease | fencelock.aio.Lease, renewing: bool) -> float | None:
        return None if renewing else time.monotonic() + lease.remaining()

    def _write(self, fence: int | None, read: int) -> dict[str, Any]:
        return self._store().call({"op": "write", "name": self.name, "worker": self.role, "fence": fence,
                                   "read": read, "sent": time.monotonic()})

    def _on_lost(self, lease: object) -> None:
        fence = getattr(lease, "fence", None)
        self.emit("lost", fence=fence, detail="the watchdog reports the lease lost (no confirmed renewal)")

    # -- commands ---------------------------------------------------------------------------------------------

    def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "connect":   # role, name, target (URL or list), resource [host, port], options (connect kwargs)
            self.reset()
            self.role, self.name, self.target = cmd["role"], cmd["name"], cmd["target"]
            self.options = dict(cmd.get("options") or {})
            self.resource = (cmd["resource"][0], int(cmd["resource"][1]))
            return {}
        if op == "acquire":   # ttl, wait, renew
            renew = bool(cmd.get("renew", False))
            try:
                lease = self._locks().acquire(self.name, ttl=cmd["ttl"], wait=cmd.get("wait", 0),
                                              renew=renew, on_lost=self._on_lost if renew else None)
            except fencelock.LockError as exc:
                self.emit("acquire", ok=False, detail=f"not acquired: {type(exc).__name__}: {exc}")
                return {"ok": False, "error": type(exc).__name__}
            self.lease = lease
            self.emit("acquire", fence=lease.fence, ok=True, lease_end=self._lease_end(lease, renew),
                      detail=f"granted for {cmd['ttl']:g} s" + (", renewed by the watchdog" if renew else ""))
            return {"ok": True, "fence": lease.fence}
        if op == "read":      # with the lease's fence: a guarded resource refuses a stale reader too
            fence = self.lease.fence if self.lease is not None else None
            reply = self._store().call({"op": "read", "name": self.name, "worker": self.role, "fence": fence})
            if reply["ok"]:
                self.read_value = int(reply["value"])
            return {"ok": reply["ok"], "value": self.read_value}
        if op == "write":     # only_if_valid: skip the write when the lease's validity ran out (a careful holder)
            return self._cmd_write(bool(cmd.get("only_if_valid", False)))
        if op == "rmw":
            self.run({"op": "read"})
            return self._cmd_write(False)
        if op == "check":
            assert self.lease is not None
            remaining = self.lease.remaining()
            return {"valid": remaining > 0, "remaining": remaining}
        if op == "release":
            return self._cmd_release()
        if op == "extend":
            assert self.lease is not None
            try:
                self.lease.extend(cmd.get("ttl"))
            except fencelock.LockError as exc:
                self.emit("lost", fence=self.lease.fence, detail=f"extend refused: {type(exc).__name__}: {exc}")
                return {"ok": False, "error": type(exc).__name__}
            return {"ok": True}
        if op == "naive_extend":   # PEXPIRE the lock key, whoever holds it (what a naive lock does)
            ms = int(float(cmd["ttl"]) * 1000)
            done = [int(node.pexpire(redis_keys(self.name).lock, ms)) for node in self._raw_nodes()]
            return {"ok": sum(done) > len(done) // 2, "nodes": done}
        if op == "naive_release":  # DEL the lock key, whoever holds it
            done = [int(node.delete(redis_keys(self.name).lock)) for node in self._raw_nodes()]
            self.emit("release", fence=self.lease.fence if self.lease else None, ok=True,
                      detail=f"naive DEL without an owner check: deleted the key on {sum(done)} node(s)")
            self.lease = None
            return {"ok": sum(done) > len(done) // 2, "nodes": done}
        if op == "write_loop":     # every, duration: read-modify-write over and over, never asking the lease
            deadline = time.monotonic() + float(cmd["duration"])
            n = 0
            while time.monotonic() < deadline:
                self.run({"op": "rmw"})
                n += 1
                time.sleep(float(cmd["every"]))
            return {"writes": n}
        if op == "loop_blocked":   # ttl, wait, block: asyncio; the event loop is blocked inside the lock
            return asyncio.run(self._loop_blocked(float(cmd["ttl"]), float(cmd.get("wait", 5.0)),
                                                  float(cmd["block"])))
        if op == "reset":
            self.reset()
            return {}
        raise ValueError(f"unknown op {op!r}")

    def _cmd_write(self, only_if_valid: bool) -> dict[str, Any]:
        fence = self.lease.fence if self.lease is not None else None
        if only_if_valid and (self.lease is None or self.lease.remaining() <= 0):
            self.emit("lost", fence=fence, detail="its validity ran out before the write, so it did not write")
            return {"ok": None, "skipped": True}
        reply = self._write(fence, self.read_value)
        return {"ok": reply.get("ok"), "detail": reply.get("detail")}

    def _cmd_release(self) -> dict[str, Any]:
        lease, self.lease = self.lease, None
        if lease is None:
            return {"ok": None}
        try:
            lease.release()
        except fencelock.LockError as exc:
            self.emit("release", fence=lease.fence, ok=False, detail=f"{type(exc).__name__}: {exc}")
            return {"ok": False, "error": type(exc).__name__}
        self.emit("release", fence=lease.fence, ok=True, detail="released")
        return {"ok": True}

    async def _loop_blocked(self, ttl: float, wait: float, block: float) -> dict[str, Any]:
        assert self.resource is not None
        locks = fencelock.aio.connect(self.target, **self.options)
        reader, writer = await asyncio.open_connection(*self.resource)

        async def call(request: dict[str, Any]) -> dict[str, Any]:
            writer.write(json.dumps(request).encode() + b"\n")
            reply: dict[str, Any] = json.loads(await reader.readline())
            return reply

        async def read(fence: int) -> int:
            reply = await call({"op": "read", "name": self.name, "worker": self.role, "fence": fence})
            return int(reply["value"]) if reply["ok"] else -1  # refused: the write that follows is refused too

        async def write(fence: int, value: int) -> None:
            await call({"op": "write", "name": self.name, "worker": self.role, "fence": fence, "read": value,
                        "sent": time.monotonic()})

        fence: int | None = None
        outcome: dict[str, Any] = {}
        try:
            async with locks.lock(self.name, ttl=ttl, wait=wait) as lease:
                fence = lease.fence
                self.emit("acquire", fence=fence, ok=True, lease_end=None,
                          detail=f"granted for {ttl:g} s, renewed by the asyncio watchdog")
                await write(fence, await read(fence))
                value = await read(fence)
                self.emit("fault", fence=fence, ok=True,
                          detail=f"a blocking call holds the event loop for {block:g} s: no renewal can run")
                time.sleep(block)  # noqa: ASYNC251 - the fault: a CPU-bound step, a sync client call, a blocking read
                # The first statement after the block sends the write: it is on the wire before the watchdog,
                # which only now gets to run, can cancel this body.
                await write(fence, value)
            self.emit("release", fence=fence, ok=True, detail="released")
            outcome["ok"] = True
        except fencelock.LockError as exc:
            self.emit("release", fence=fence, ok=False, detail=f"{type(exc).__name__}: {exc}")
            outcome.update(ok=False, error=type(exc).__name__)
        finally:
            writer.close()
            await locks.aclose()
        return outcome

    def reset(self) -> None:
        if self.lease is not None:
            try:
                self.lease.release()
            except fencelock.LockError:
                pass
            self.lease = None
        if self.locks is not None:
            self.locks.close()
            self.locks = None
        if self.store is not None:
            self.store.close()
            self.store = None
        self.read_value = 0


def main() -> int:
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            break
        try:
            reply = worker.run(cmd)
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}", "failed": True}
        worker._send({"reply": reply})
    try:
        worker.reset()
    except Exception:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
