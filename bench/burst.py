"""The burst section: many concurrent calls through ONE client, on every backend.

A web server's event loop or thread pool shares one `connect()` between all its requests. Two workloads per
backend, each through one asyncio client: `distinct` (N tasks, each acquires and releases a name of its own) and
`one name` (N tasks wait on one held name, each takes it in turn and releases it), and `threads` (N threads of
one sync client, distinct names). Every call must succeed on a healthy server: the target is zero errors, and the
wall time is reported beside it (client-side queueing is bounded by the connection cap, not by the server).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import fencelock
import fencelock.aio

from .report import Check, _table

TTL = 30.0
WAIT = 120.0


@dataclass(frozen=True)
class BurstRun:
    backend: str
    workload: str
    calls: int
    ok: int
    seconds: float
    errors: dict[str, int] = field(default_factory=dict)  # "Type: message's head" -> count


def _key(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:80]}"


async def _distinct(target: str | list[str], n: int, tag: str) -> tuple[int, Counter[str]]:
    locks = fencelock.aio.connect(target)
    errors: Counter[str] = Counter()

    async def one(i: int) -> bool:
        try:
            lease = await locks.acquire(f"bench:burst:{tag}:{i}", ttl=TTL, wait=WAIT)
            await lease.release()
            return True
        except Exception as exc:  # counted and shown: the section's result is every failure
            errors[_key(exc)] += 1
            return False

    try:
        ok = sum(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        await locks.aclose()
    return ok, errors


async def _one_name(target: str | list[str], n: int, tag: str) -> tuple[int, Counter[str]]:
    locks = fencelock.aio.connect(target)
    errors: Counter[str] = Counter()
    name = f"bench:burst:{tag}:one"

    async def one() -> bool:
        try:
            lease = await locks.acquire(name, ttl=TTL, wait=WAIT)
            await lease.release()
            return True
        except Exception as exc:
            errors[_key(exc)] += 1
            return False

    try:
        holder = await locks.acquire(name, ttl=TTL)
        tasks = [asyncio.ensure_future(one()) for _ in range(n)]
        await asyncio.sleep(0.5)  # every waiter is queued before the first release
        await holder.release()
        ok = sum(await asyncio.gather(*tasks))
    finally:
        await locks.aclose()
    return ok, errors


def _threads(target: str | list[str], n: int, tag: str) -> tuple[int, Counter[str]]:
    locks = fencelock.connect(target)
    errors: Counter[str] = Counter()
    done = [0]
    guard = threading.Lock()

    def one(i: int) -> None:
        try:
            locks.acquire(f"bench:burst:{tag}:t{i}", ttl=TTL, wait=WAIT).release()
            with guard:
                done[0] += 1
        except Exception as exc:
            with guard:
                errors[_key(exc)] += 1

    workers = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        locks.close()
    return done[0], errors


def _timed(backend: str, workload: str, calls: int,
           run: Callable[[], tuple[int, Counter[str]]]) -> BurstRun:
    began = time.monotonic()
    ok, errors = run()
    return BurstRun(backend, workload, calls, ok, time.monotonic() - began, dict(errors))


def burst_section(targets: Sequence[tuple[str, str | list[str]]], *, tasks: int, waiters: int, threads: int,
                  progress: Callable[[str], None]) -> list[BurstRun]:
    """Each workload once per (backend label, connect() target)."""
    runs: list[BurstRun] = []
    stamp = f"{time.time_ns():x}"
    for backend, target in targets:
        tag = f"{stamp}:{backend}"
        progress(f"burst: {backend}, {tasks} tasks on distinct names")
        runs.append(_timed(backend, "distinct names (asyncio)", tasks,
                           functools.partial(asyncio.run, _distinct(target, tasks, tag))))
        progress(f"burst: {backend}, {waiters} tasks on one name")
        runs.append(_timed(backend, "one name (asyncio)", waiters,
                           functools.partial(asyncio.run, _one_name(target, waiters, tag))))
        progress(f"burst: {backend}, {threads} threads on distinct names")
        runs.append(_timed(backend, "distinct names (threads)", threads,
                           functools.partial(_threads, target, threads, tag)))
    return runs


def burst_table(runs: Sequence[BurstRun]) -> str:
    rows = [[r.backend, r.workload, str(r.calls), str(r.ok), f"{r.seconds:.1f} s",
             "; ".join(f"{count} x {what}" for what, count in r.errors.items()) or "-"] for r in runs]
    return ("Burst: concurrent calls through one client (acquire + release each)\n\n"
            + _table(["backend", "workload", "calls", "ok", "wall", "errors"], rows, "llrrrl"))


def burst_checks(runs: Sequence[BurstRun]) -> list[Check]:
    return [Check(f"burst: {r.backend}, {r.workload}, {r.calls} calls", f"{r.ok} ok", f"{r.calls} ok",
                  r.ok == r.calls) for r in runs]
