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
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import fencelock
from fencelock.testing.faults import CLOSE, LATE, RESET_AFTER, Request, Rule
from fencelock.testing.invariants import History, Watcher, check

from .cells import _HEALTHY, _RULES, FIRE_TIMEOUT, HELD_BACK, OBSERVE, PAST_TTL, PAST_TTL_FAULT, RENEW, Cell, target_of
from .rigs import SOCKET_TIMEOUT, Front, Rig
from .steps import Story, _prepare, _request, _wait_for


def _rule(cell: Cell, rig: Rig, fired: threading.Event) -> Callable[[Any], Rule]:
    names, nth = target_of(cell.request, rig.kind, cell.fault)
    nth = max(nth, cell.nth)

    def match(request: Request) -> bool:
        return request.name in names

    def make(server: Any) -> Rule:
        kind = _RULES.get(cell.fault, LATE)  # idle: an observer (a late reply by 0 s) that says when it passed
        delay = 0.0 if cell.fault in _HEALTHY else PAST_TTL if cell.fault == PAST_TTL_FAULT else cell.held_back
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
        if cell.fault in _HEALTHY:
            await asyncio.sleep(0.02)
            # The close first: a request is matched by one rule, and on HTTP the set-up the close hits is the cell's
            # own request (the first of a new connection), which the observer would take otherwise.
            rules = rig.arm(lambda _: Rule(CLOSE, rig.handshake)) if cell.fault == "handshake" else []
            rules += rig.arm(_rule(cell, rig, fired))
            rig.close_idle()
        else:
            rules = rig.arm(_rule(cell, rig, fired))
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
            targets = sorted(target_of(cell.request, rig.kind, cell.fault)[0])
            problems.append(f"the fault never fired: no {targets} request was seen; the proxies saw "
                            f"{[p.names(started) for p in rig.faulted]}; the calls raised "
                            f"{[(op.what, repr(op.error)) for op in history.ops if op.error is not None]}")
        await _after_the_fault(story, cell)
    finally:
        rig.clear()
        watcher.stop()
        await front.close(locks)
    return problems + check(history, watcher.samples, quorum=rig.quorum, straggle=rig.straggle, lag=rig.lag)


async def _after_the_fault(story: Story, cell: Cell) -> None:
    """The fault has ended: the same client releases what it holds and works again; the watcher looks last."""
    for timer in story.timers:
        await asyncio.to_thread(timer.join)
    if cell.fault == "lose" and story.rig.kind == "redlock":
        # A reply lost on an open connection ends for the client when it gives that connection up, one socket
        # timeout after the send; until then the per-node order rule counts that node as not answering for
        # this caller, and a Redlock node answers within its node timeout, which is shorter
        # (docs/decisions/2026-12-01-order-after-a-lost-reply.md).
        await asyncio.sleep(SOCKET_TIMEOUT)
    await story.release_all()
    await story.liveness()
    if any(record.renewing for record in story.history.leases):
        await asyncio.sleep(RENEW + 0.1)  # a renewal that goes on after the end would show by now
    story.watcher.sample(story.name)


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
        box.append(sum(len([n for n in proxy.names(since) if n not in rig.background]) for proxy in rig.faulted))

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

            def kth(seen_request: Request) -> bool:  # the k-th request on any faulted node
                if seen_request.name in rig.background:
                    return False
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
        await _after_the_fault(story, cell)
    finally:
        rig.clear()
        watcher.stop()
        await front.close(locks)
    return check(history, watcher.samples, quorum=rig.quorum, straggle=rig.straggle, lag=rig.lag)
