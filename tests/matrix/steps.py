"""The steps of a cell's story (`scenario.py`): the state a cell shares between them (`Story`), what the request
needs first, the request itself, and a renewed `with` block's exit. Every call to the API under test is recorded
in the cell's `History`, its errors returned, not raised."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fencelock
from fencelock.testing.invariants import History, LeaseRecord, Watcher

from .cells import FIRE_TIMEOUT, PAST_TTL_FAULT, RENEW, SHORT_TTL, Cell, target_of
from .rigs import Front, Rig


@dataclass
class _Live:
    lease: Any
    record: LeaseRecord


@dataclass
class Run:
    """What one cell did: the history, the watcher, and the names of the requests its faults hit."""

    history: History = field(default_factory=History)
    hits: list[str] = field(default_factory=list)


class Story:
    """The state one cell shares between its steps."""

    def __init__(self, rig: Rig, front: Front, locks: Any, rival: fencelock.Locks, watcher: Watcher,
                 history: History, name: str) -> None:
        self.rig = rig
        self.front = front
        self.locks = locks
        self.rival = rival
        self.watcher = watcher
        self.history = history
        self.name = name
        self.live: list[_Live] = []
        self.timers: list[threading.Thread] = []
        self.holder: tuple[LeaseRecord, Any] | None = None  # the wait cells' holder: its record and lease
        self.ttl = rig.ttl  # the TTL of the cell's leases (the rig's: etcd counts whole seconds)

    def ttl_of(self, cell: Cell) -> float:
        """The TTL the request under test asks for."""
        return SHORT_TTL if cell.fault == PAST_TTL_FAULT else self.ttl

    async def do(self, what: str, fn: Callable[..., Any], *args: Any, lease: LeaseRecord | None = None,
                 **kwargs: Any) -> Any:
        """Call the API under test and record the call (with the TTL it asks for); errors are recorded and
        returned, not raised (a cancellation is re-raised)."""
        ttl = kwargs.get("ttl", args[0] if what == "extend" and args else None)
        if what == "extend" and ttl is None and lease is not None:
            ttl = lease.ttl
        op = self.history.begin(what, self.name if what != "fresh" else args[0], lease, ttl)
        try:
            result = await self.front.call(fn, *args, **kwargs)
        except BaseException as exc:
            self.history.finish(op, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return exc
        self.history.finish(op)
        if what in ("acquire", "fresh") and result is not None:
            op.lease = self.adopt(result, renewing=bool(kwargs.get("renew")))
        return result

    def adopt(self, lease: Any, *, renewing: bool, client: str = "client") -> LeaseRecord:
        record = self.history.lease(lease, renewing=renewing, client=client)
        if client == "client":
            self.live.append(_Live(lease, record))
        return record

    async def observe(self, seconds: float, until: Callable[[], bool] | None = None) -> None:
        """Claims of every live lease, and a rival's attempts, for `seconds` (or until `until()`)."""
        end = time.monotonic() + seconds
        rival_next = 0.0
        while time.monotonic() < end and not (until is not None and until()):
            for live in self.live:
                if live.record.ended_at is None:
                    self.history.claim(live.record, live.lease)
            if time.monotonic() >= rival_next:
                rival_next = time.monotonic() + 0.08
                await asyncio.to_thread(self._rival_try)
            await asyncio.sleep(0.02)

    def _rival_try(self) -> None:
        try:
            lease = self.rival.acquire(self.name, ttl=self.ttl, wait=0)
        except fencelock.LockError:
            return
        record = self.history.lease(lease, renewing=False, client="rival")
        self.history.claim(record, lease)
        release_aside(self.history, record, lease)

    async def release_all(self) -> None:
        """The same client releases every lease it still holds, once the fault has ended."""
        for live in self.live:
            if live.record.ended_at is not None and live.record.ended != "lost":
                continue  # a failed `with` exit is not retried: the lock must free by its TTL at the latest
            for attempt in range(2):
                result = await self.do("release", live.lease.release, lease=live.record)
                if result is None:
                    self.history.end(live.record, "released")
                    break
                if isinstance(result, fencelock.LockLost):
                    self.history.end(live.record, "lost")
                    break
                if attempt == 0:
                    self.history.liveness.append(f"the first release after the fault failed: "
                                                 f"{type(result).__name__}: {result}")
            else:
                self.history.end(live.record, "abandoned")

    async def liveness(self) -> None:
        """The same client, not rebuilt: a fresh name, then the cell's name (free by its TTL at the latest)."""
        fresh = f"{self.name}:after"
        self.watcher.watch(fresh)
        for what, lock, wait in (("fresh", fresh, 0.0), ("acquire", self.name, self.ttl + self.rig.lag + 1.5)):
            result = await self.do(what, self.locks.acquire, lock, ttl=self.ttl, wait=wait)
            if isinstance(result, BaseException):
                self.history.liveness.append(f"acquire of {lock!r} after the fault: {type(result).__name__}: "
                                             f"{result}")
                continue
            record = self.history.leases[-1]
            self.live = [live for live in self.live if live.record is not record]
            released = await self.do("release", result.release, lease=record)
            if released is None:
                self.history.end(record, "released")
            else:
                self.history.end(record, "abandoned")
                self.history.liveness.append(f"release of {lock!r} after the fault: {type(released).__name__}: "
                                             f"{released}")


def release_aside(history: History, record: LeaseRecord, lease: Any) -> None:
    """A lease of a client not under test (straight to the servers) is released; its errors are not checked."""
    op = history.begin("release", record.name, record)
    try:
        lease.release()
    except fencelock.LockError:
        history.end(record, "abandoned")
    else:
        history.end(record, "released")
    history.finish(op)


async def _wait_for(event: threading.Event, timeout: float) -> bool:
    return await asyncio.to_thread(event.wait, timeout)


async def _prepare(story: Story, cell: Cell) -> Any:
    """What the request needs first: a lease (renewing for the watchdog's requests), or a holder to wait on."""
    request = cell.request
    if request in ("acquire", "acquire_fair", "exit"):
        return None
    if request == "wait":
        held = await asyncio.to_thread(story.rival.acquire, story.name, ttl=story.ttl, wait=0)
        record = story.history.lease(held, renewing=False, client="holder")

        story.holder = (record, held)
        return None
    renew = RENEW if request == "renewal" or request.startswith("race") else False
    for _ in range(3):  # not under test: a slow start of a fresh client (a Cluster's layout) may be retried
        lease = await story.do("acquire", story.locks.acquire, story.name, ttl=story.ttl, wait=0.5, renew=renew)
        if not isinstance(lease, fencelock.BackendError):
            break
        await asyncio.sleep(0.2)
    if isinstance(lease, BaseException):
        raise AssertionError(f"the cell could not prepare its lease before any fault: {lease!r} (proxies: "
                             f"{[(p.port, p.target_port) for p in story.rig.proxies]})")
    return lease


async def _request(story: Story, cell: Cell, lease: Any, fired: threading.Event) -> None:
    """Send the request under test (the race cells: once the renewal is on the wire)."""
    request, locks, name = cell.request, story.locks, story.name
    record = story.live[0].record if story.live else None
    if request in ("acquire", "acquire_fair"):
        await story.do("acquire", locks.acquire, name, ttl=story.ttl_of(cell), wait=0, fair=request == "acquire_fair")
    elif request.startswith("extend"):
        base = story.ttl
        ttl = {"extend_same": base, "extend_longer": 2 * base,
               "extend_shorter": min(base / 2, story.ttl_of(cell))}[request]
        await story.do("extend", lease.extend, ttl, lease=record)
    elif request == "release":
        if await story.do("release", lease.release, lease=record) is None:
            assert record is not None
            story.history.end(record, "released")
    elif request == "exit":
        await (_exit_sync(story) if cell.front == "sync" else _exit_async(story))
    elif request == "renewal":
        await _wait_for(fired, FIRE_TIMEOUT)
    elif request == "wait":
        # The holder lets go once the waiter waits (the faulted request was seen), not on a timer: a slow start
        # of the client must not let the first attempt succeed and leave nothing to fault. In the past_ttl row
        # the faulted request is the grant after the wait: the holder lets go once the first attempt was sent.
        assert story.holder is not None
        record_held, held = story.holder
        since = time.monotonic()
        attempts = target_of("acquire", story.rig.kind)[0]

        def waiting() -> bool:
            return any(seen in attempts for proxy in story.rig.faulted for seen in proxy.names(since))

        def let_go() -> None:
            if cell.fault == PAST_TTL_FAULT:
                end = time.monotonic() + FIRE_TIMEOUT
                while not waiting() and time.monotonic() < end:
                    time.sleep(0.005)
            else:
                fired.wait(FIRE_TIMEOUT)
            time.sleep(0.05)
            release_aside(story.history, record_held, held)

        timer = threading.Thread(target=let_go, daemon=True)
        timer.start()
        story.timers.append(timer)
        await story.do("acquire", locks.acquire, name, ttl=story.ttl_of(cell), wait=2.0)
    elif request == "status":
        await story.do("status", locks.status, name)
    elif request == "force_release":
        await story.do("force_release", locks.force_release, name)
    elif request.startswith("race"):
        await _wait_for(fired, FIRE_TIMEOUT)
        if request == "race_extend":
            await story.do("extend", lease.extend, lease=record)
        elif await story.do("release", lease.release, lease=record) is None:
            assert record is not None
            story.history.end(record, "released")
    else:  # pragma: no cover - the tables name every request
        raise AssertionError(request)


async def _exit_sync(story: Story) -> None:
    """A renewed `with locks.lock()` block whose exit (the release) meets the fault."""
    def block() -> None:
        context = story.locks.lock(story.name, ttl=story.ttl, renew=RENEW)
        lease = context.__enter__()
        _exited(story, lease, lambda: context.__exit__(None, None, None))

    await asyncio.to_thread(block)


async def _exit_async(story: Story) -> None:
    context = story.locks.lock(story.name, ttl=story.ttl, renew=RENEW)
    lease = await context.__aenter__()
    record, op = _entered(story, lease)
    try:
        await context.__aexit__(None, None, None)
    except BaseException as exc:
        _left(story, record, op, exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
    else:
        _left(story, record, op, None)


def _exited(story: Story, lease: Any, leave: Callable[[], object]) -> None:
    record, op = _entered(story, lease)
    try:
        leave()
    except BaseException as exc:
        _left(story, record, op, exc)
    else:
        _left(story, record, op, None)


def _entered(story: Story, lease: Any) -> tuple[LeaseRecord, Any]:
    record = story.adopt(lease, renewing=True)
    story.history.claim(record, lease)
    return record, story.history.begin("release", story.name, record)


def _left(story: Story, record: LeaseRecord, op: Any, error: BaseException | None) -> None:
    """After the block: the lease is out of the caller's hands either way (renewal must stop)."""
    story.history.finish(op, error)
    story.history.end(record, "released" if error is None else "exit")
