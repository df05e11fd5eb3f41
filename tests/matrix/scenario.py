"""One cell of the fault matrix: a request fencelock sends, a fault injected into it, on one front end and backend.

Every cell runs the same story, watched by an independent `Watcher` and recorded in a `History`:

1. prepare (a lease to extend or release, a holder to wait behind, a renewing lease);
2. arm the fault on the request (on a majority of Redlock's nodes), or close the idle connections;
3. send the request; while the fault lasts, a rival client straight to the servers tries to take the lock and
   every lease says what it claims (`remaining()`, `ensure()`);
4. the fault ends; the leases are released by the same client, which then acquires and releases again, a fresh
   name and the cell's name (the lock frees by its TTL at the latest);
5. `check()` the history against what the watcher saw.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fencelock
from fencelock.testing.faults import CLOSE, LATE, LOSE, PAUSE, RESET_AFTER, RESET_BEFORE, Request, Rule
from fencelock.testing.invariants import History, LeaseRecord, Watcher, check

from .rigs import SOCKET_TIMEOUT, Front, Rig

TTL = 0.8
RENEW = 0.25         # renewed leases: every this many seconds
HELD_BACK = 0.4      # a late reply or a paused server: longer than the clients' socket timeout
OBSERVE = 0.1        # seconds of claims and rival attempts after the request
FIRE_TIMEOUT = 3.0   # the fault must have fired by then

FAULTS = ["lose", "late", "reset_before", "reset_after", "idle", "handshake", "pause"]
"""Every fault of the matrix; `cancel` (asyncio only) is its own table. `handshake`: the idle connections are
closed, and the server then closes the next new connection during its set-up (its first CLIENT command)."""
_HEALTHY = ("idle", "handshake")
"""Faults after which the server is healthy: no call may fail."""

REQUESTS = ["acquire", "acquire_fair", "extend_same", "extend_longer", "extend_shorter", "release", "exit", "renewal",
            "wait", "status", "force_release", "race_extend", "race_release"]
"""Every request fencelock sends; `exit` is the release at the end of a renewed `with locks.lock()` block; the
race_* cells are a renewal racing extend() / release() on one lease."""

_MATCH = {
    "acquire": {"acquire", "redlock_acquire"},
    "acquire_fair": {"fair_acquire"},
    "extend": {"extend", "redlock_extend"},
    "release": {"release", "redlock_release"},
    "renewal": {"extend_many", "redlock_extend_many"},
    "wait": {"blpop"},
    "status": {"status"},
    "force_release": {"force_release"},
}

DURABLE_TARGETS = {"acquire", "acquire_fair", "extend_same", "extend_longer", "extend_shorter", "renewal",
                   "race_extend", "race_release"}
"""The requests that carry a WAIT with `durability=`."""

_RULES = {"lose": LOSE, "late": LATE, "reset_before": RESET_BEFORE, "reset_after": RESET_AFTER, "pause": PAUSE}


def target_of(request: str, kind: str) -> tuple[set[str], int]:
    """The request names a cell faults, and which of them (the nth). With `durability=`, a grant's or an extend's
    fault hits the WAIT written after its script: the script ran and answered, its confirmation is what fails."""
    if kind == "durable" and request in DURABLE_TARGETS:
        return {"wait"}, 1
    if request.startswith("extend"):
        return _MATCH["extend"], 1
    if request == "exit":
        return _MATCH["release"], 1
    if request.startswith("race") or request == "renewal":
        return _MATCH["renewal"], 1
    if request == "wait" and kind == "redlock":
        return _MATCH["acquire"], 2  # Redlock waits by trying again: the second attempt is the one after a wait
    return _MATCH[request], 1


@dataclass(frozen=True)
class Cell:
    front: str
    fault: str
    request: str
    nth: int = 1
    held_back: float = HELD_BACK

    def __str__(self) -> str:
        return f"{self.front}-{self.fault}-{self.request}"


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
            lease = self.rival.acquire(self.name, ttl=TTL, wait=0)
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
        for what, lock, wait in (("fresh", fresh, 0.0), ("acquire", self.name, TTL + 1.5)):
            result = await self.do(what, self.locks.acquire, lock, ttl=TTL, wait=wait)
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
        held = await asyncio.to_thread(story.rival.acquire, story.name, ttl=TTL, wait=0)
        record = story.history.lease(held, renewing=False, client="holder")

        story.holder = (record, held)
        return None
    renew = RENEW if request == "renewal" or request.startswith("race") else False
    for _ in range(3):  # not under test: a slow start of a fresh client (a Cluster's layout) may be retried
        lease = await story.do("acquire", story.locks.acquire, story.name, ttl=TTL, wait=0.5, renew=renew)
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
        await story.do("acquire", locks.acquire, name, ttl=TTL, wait=0, fair=request == "acquire_fair")
    elif request.startswith("extend"):
        ttl = {"extend_same": TTL, "extend_longer": 2 * TTL, "extend_shorter": TTL / 2}[request]
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
        # of the client must not let the first attempt succeed and leave nothing to fault.
        assert story.holder is not None
        record_held, held = story.holder

        def let_go() -> None:
            fired.wait(FIRE_TIMEOUT)
            time.sleep(0.05)
            release_aside(story.history, record_held, held)

        timer = threading.Thread(target=let_go, daemon=True)
        timer.start()
        story.timers.append(timer)
        await story.do("acquire", locks.acquire, name, ttl=TTL, wait=2.0)
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
        context = story.locks.lock(story.name, ttl=TTL, renew=RENEW)
        lease = context.__enter__()
        _exited(story, lease, lambda: context.__exit__(None, None, None))

    await asyncio.to_thread(block)


async def _exit_async(story: Story) -> None:
    context = story.locks.lock(story.name, ttl=TTL, renew=RENEW)
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


def _rule(cell: Cell, rig: Rig, fired: threading.Event) -> Callable[[Any], Rule]:
    names, nth = target_of(cell.request, rig.kind)
    nth = max(nth, cell.nth)

    def match(request: Request) -> bool:
        return request.name in names

    def make(server: Any) -> Rule:
        kind = _RULES.get(cell.fault, LATE)  # idle: an observer (a late reply by 0 s) that says when it passed
        delay = 0.0 if cell.fault in _HEALTHY else cell.held_back
        if kind == RESET_AFTER:  # the reset comes a while after the reply, but before the client times out
            delay = min(delay, 0.8 * SOCKET_TIMEOUT)
        return Rule(kind, match, nth=nth, delay=delay, on_pause=server.pause, on_resume=server.resume,
                    on_hit=lambda _: fired.set())

    return make


async def run_cell(rig: Rig, cell: Cell) -> list[str]:
    """Run one cell; the broken invariants, one line each (empty: it passed)."""
    front = Front(cell.front)
    history = History()
    name = f"matrix:{cell}:{uuid.uuid4().hex[:8]}"
    watcher = Watcher(rig.watchers())
    watcher.watch(name)
    watcher.start()
    locks = rig.connect(cell.front)
    rival = rig.shared_rival()
    story = Story(rig, front, locks, rival, watcher, history, name)
    problems: list[str] = []
    started = time.monotonic()
    try:
        lease = await _prepare(story, cell)
        fired = threading.Event()
        rules = rig.arm(_rule(cell, rig, fired))
        if cell.fault in _HEALTHY:
            await asyncio.sleep(0.02)
            if cell.fault == "handshake":
                rules += rig.arm(lambda _: Rule(CLOSE, "client"))
            rig.close_idle()
        await _request(story, cell, lease, fired)
        await story.observe(OBSERVE)
        if cell.request == "renewal":
            await story.observe(2 * HELD_BACK, until=lambda: all(r.done.is_set() for r in rules if r.hit.is_set()))
        rig.clear()
        for rule in rules:
            if rule.hit.is_set():
                await _wait_for(rule.done, FIRE_TIMEOUT)
                history.fault_ends.append(rule.ended_at or time.monotonic())
        if cell.fault in _HEALTHY:
            problems += [f"a connection closed ({cell.fault}) made {op.what} fail on a healthy server: "
                         f"{type(op.error).__name__}: {op.error}" for op in history.ops
                         if isinstance(op.error, fencelock.BackendError)]
        elif not fired.is_set():
            problems.append(f"the fault never fired: no {sorted(target_of(cell.request, rig.kind)[0])} request was "
                            f"seen; the proxies saw {[p.names(started) for p in rig.faulted]}; the calls raised "
                            f"{[(op.what, repr(op.error)) for op in history.ops if op.error is not None]}")
        for timer in story.timers:
            await asyncio.to_thread(timer.join)
        if cell.fault == "lose" and rig.kind == "redlock":
            # A reply lost on an open connection ends for the client when it gives that connection up, one socket
            # timeout after the send; until then the per-node order rule counts that node as not answering for
            # this caller, and a Redlock node answers within its node timeout, which is shorter
            # (docs/decisions/2026-12-01-order-after-a-lost-reply.md).
            await asyncio.sleep(SOCKET_TIMEOUT)
        await story.release_all()
        await story.liveness()
        if any(record.renewing for record in history.leases):
            await asyncio.sleep(RENEW + 0.1)  # a renewal that goes on after the end would show by now
        watcher.sample(name)
    finally:
        rig.clear()
        watcher.stop()
        await front.close(locks)
    return problems + check(history, watcher.samples, quorum=rig.quorum, straggle=rig.straggle)


async def run_cancel_cell(rig: Rig, request: str) -> list[str]:
    """asyncio cancellation after each request the call sends, k = 1..N (N counted in a run without faults, over
    the faulted nodes; the k-th request's reply is held back 50 ms, and the task cancelled while it waits)."""
    problems: list[str] = []
    count = await _count_requests(rig, request)
    if count == 0:
        return [f"{request} sent no request through the proxy"]
    for k in range(1, count + 1):
        problems += [f"k={k}: {line}" for line in await _cancel_once(rig, request, k)]
    return problems


async def _count_requests(rig: Rig, request: str) -> int:
    box: list[int] = []

    async def count(story: Story, cell: Cell, lease: Any, fired: threading.Event) -> None:
        since = time.monotonic()
        await _request(story, cell, lease, fired)
        box.append(sum(len(proxy.names(since)) for proxy in rig.faulted))

    await _story(rig, request, count, cancel_after=None)
    return box[0] if box else 0


async def _cancel_once(rig: Rig, request: str, k: int) -> list[str]:
    return await _story(rig, request, None, cancel_after=k)


async def _story(rig: Rig, request: str, body: Any, cancel_after: int | None) -> list[str]:
    front = Front("async")
    history = History(expected=[asyncio.CancelledError])
    cell = Cell("async", "cancel", request)
    name = f"matrix:{cell}:{uuid.uuid4().hex[:8]}"
    watcher = Watcher(rig.watchers())
    watcher.watch(name)
    watcher.start()
    locks = rig.connect("async")
    rival = rig.shared_rival()
    story = Story(rig, front, locks, rival, watcher, history, name)
    rules: list[Rule] = []
    try:
        lease = await _prepare(story, cell)
        fired = threading.Event()
        if cancel_after is None:
            if request.startswith("race"):
                fired.set()
            names, nth = target_of(request, rig.kind)  # the wait's holder lets go once the waiter waits
            rig.arm(lambda _: Rule(LATE, lambda r: r.name in names, nth=nth, on_hit=lambda _: fired.set()))
            await body(story, cell, lease, fired)
            rig.clear()
        else:
            hit = threading.Event()
            if request.startswith("race"):
                fired.set()  # the renewal's timing is the watchdog's: cancel the extend/release itself
            seen = itertools.count(1)
            guard = threading.Lock()

            def kth(_: Request) -> bool:  # the k-th request on any faulted node
                with guard:
                    return next(seen) == cancel_after

            def cancel_now(_: Request) -> None:
                hit.set()
                fired.set()  # the wait's holder lets go too

            rules = rig.arm(lambda _: Rule(LATE, kth, delay=0.05, on_hit=cancel_now))
            task = asyncio.ensure_future(_request(story, cell, lease, fired))
            task.add_done_callback(lambda _: hit.set())  # done before its k-th request: nothing to cancel
            await _wait_for(hit, FIRE_TIMEOUT)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        await story.observe(OBSERVE / 2)
        rig.clear()
        for rule in rules:  # the k-th reply was held back: what waited for it reached the server when it came
            if rule.hit.is_set():
                await _wait_for(rule.done, FIRE_TIMEOUT)
                history.fault_ends.append(rule.ended_at or time.monotonic())
        for timer in story.timers:
            await asyncio.to_thread(timer.join)
        if cell.fault == "lose" and rig.kind == "redlock":
            # A reply lost on an open connection ends for the client when it gives that connection up, one socket
            # timeout after the send; until then the per-node order rule counts that node as not answering for
            # this caller, and a Redlock node answers within its node timeout, which is shorter
            # (docs/decisions/2026-12-01-order-after-a-lost-reply.md).
            await asyncio.sleep(SOCKET_TIMEOUT)
        await story.release_all()
        await story.liveness()
        if any(record.renewing for record in history.leases):
            await asyncio.sleep(RENEW + 0.1)
        watcher.sample(name)
    finally:
        rig.clear()
        watcher.stop()
        await front.close(locks)
    return check(history, watcher.samples, quorum=rig.quorum, straggle=rig.straggle)


def random_cell(rng: random.Random, kinds: list[str]) -> tuple[str, Cell]:
    """A soak cell: any backend, front end, fault and request, the k-th matching request, a random hold-back."""
    kind = rng.choice(kinds)
    requests = [r for r in REQUESTS if not (kind == "redlock" and r == "acquire_fair")]
    cell = Cell(rng.choice(["sync", "async"]), rng.choice(FAULTS), rng.choice(requests), nth=1,
                held_back=rng.uniform(0.3, 0.8))
    return kind, cell
