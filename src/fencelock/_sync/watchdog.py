# Generated from _async/watchdog.py by scripts/unasync.py: do not edit, edit that file instead.
"""The renewal watchdog: one per client, keeping its renewed leases alive and telling them the moment they are lost.

It owns liveness, as etcd's `concurrency.Session` does; the lease only reports it. One runner per client (a task
here, a daemon thread in the synchronous twin), never one per lease:

- leases wait in a heap ordered by when they are next due;
- everything due in one tick goes to the backend in one batch per server (`extend_many`: one script call per 100
  leases and slot), sent in the background, so a server that does not answer never stops the timer, nor the
  renewals on the others;
- a lease whose validity runs out without a confirmed renewal is lost at that moment, by the local monotonic
  clock, whatever the network does; one the server says is gone or taken is lost at once.

A lease is also watched without renewal when it has an `on_lost` callback, so that the callback fires when its
validity ends. Every rule about one lease's state is `_logic.lease.LeaseState`; this runner schedules and sends.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from .._events import backend_kind, emit
from .._logic.args import ttl_ms
from .._logic.lease import Renewal, Tick
from .._logic.timing import Clock
from ._concurrency import Callbacks, Runner, Signal, alive, in_background, join, spawn

if TYPE_CHECKING:
    from .client import Backend
    from .lease import Lease


# Module constants: an Enum member's lookup costs about 80 ns, and these are compared per lease and renewal.
_DROP, _EXPIRE, _RENEW = Tick.DROP, Tick.EXPIRE, Tick.RENEW
_EXTENDED, _RETRY, _GONE, _GIVE_BACK = Renewal.EXTENDED, Renewal.RETRY, Renewal.GONE, Renewal.GIVE_BACK

EARLY_SHARE = 0.1
"""A lease may be renewed up to this share of its interval early, so that leases due close together share a
batch (10,000 leases taken one after another would otherwise each come due alone)."""


class Watchdog:
    def __init__(self, backend: Backend, clock: Clock) -> None:
        self._backend = backend
        self._clock = clock
        self._heap: list[tuple[float, int, Lease]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()  # the heap's, and each lease's `_life.take` (see `lock`)
        self._wakeup = Signal()
        self._runner: Runner | None = None
        self._pid = os.getpid()
        self._closed = False
        self._next_wake = 0.0
        self.renewals = 0  # leases renewed so far (for benchmarks and debugging)
        self.callbacks = Callbacks()  # the `on_lost` of a loss the runner finds run here, never on the runner

    @property
    def lock(self) -> threading.Lock:
        """Held while a due lease is looked at and its renewal claimed: a lease's extend takes its turn under it
        (`LeaseState.take`), so that a renewal and an extend of one lease are never in flight at once."""
        return self._lock

    def reschedule(self, lease: Lease) -> None:
        """`lease` is due at a new time (`lease._life.due`, after its extend): look at it then."""
        with self._lock:
            self._push(lease)
            sooner = lease._life.due < self._next_wake
            if sooner:
                self._next_wake = lease._life.due
        if sooner:
            self._wakeup.set()

    def watch(self, lease: Lease) -> None:
        """Keep `lease` alive (if it renews) and watch it for loss until it is released or lost."""
        lease._watched = True
        if os.getpid() != self._pid:
            # A forked child: the parent's leases are not ours to renew, its runner did not survive, and its lock
            # may have been copied while held. Start afresh.
            self._pid, self._heap, self._runner, self._lock = os.getpid(), [], None, threading.Lock()
            self._wakeup = Signal()
        with self._lock:
            self._push(lease)
            if self._runner is None or not alive(self._runner):
                # First use, or the runner ended with its event loop (a second asyncio.run with one client).
                self._wakeup = Signal()
                self._runner = spawn(self._run, "fencelock-watchdog")
            sooner = lease._life.due < self._next_wake
            if sooner:
                self._next_wake = lease._life.due
        if sooner:
            self._wakeup.set()  # due before the runner means to look again (else: no wake-up, batches stay whole)

    def _push(self, lease: Lease) -> None:
        """(Called with `_lock` held.)"""
        heapq.heappush(self._heap, (lease._life.due, next(self._order), lease))

    def watching(self) -> int:
        return len(self._heap)

    def _run(self) -> None:
        while not self._closed:
            now = self._clock()
            batches: dict[object, tuple[list[Lease], Signal]] = {}
            expired: list[Lease] = []
            # Which server renews a lease (`renewal_group`, where the backend has several): a batch per server,
            # so a stalled one holds up neither the others' renewals nor a release of a lease elsewhere.
            group: Callable[[str], object] | None = getattr(self._backend, "renewal_group", None)
            with self._lock:
                # Everything due now, and what is due a little later (see EARLY_SHARE): one wake-up, one batch.
                due: dict[int, Lease] = {}
                while self._heap:
                    at, _, lease = self._heap[0]
                    life = lease._life
                    if at == life.due and at > now + life.early(EARLY_SHARE):
                        break
                    heapq.heappop(self._heap)
                    if at == life.due:
                        due[id(lease)] = lease  # (else a stale entry: the lease was rescheduled since; dropped)
                # Looked at and claimed under the lock, so that an extend never takes its turn in between.
                for lease in due.values():
                    tick = lease._life.tick(now)
                    if tick is _RENEW:
                        # One batch per server (a Cluster's primaries): each one waits for its own answer only.
                        key = None if group is None else group(lease.name)
                        batch = batches.get(key)
                        if batch is None:
                            batch = batches[key] = [], Signal()
                        batch[0].append(lease)
                        lease._life.sending(batch[1], lease.ttl, now)
                    elif tick is _EXPIRE:
                        expired.append(lease)
                        continue
                    elif tick is _DROP:
                        continue
                    self._push(lease)  # looked at again when its validity ends, at the latest
            for lease in expired:
                lease._lose("its validity ran out before a renewal was confirmed", later=True)
            for renew, flight in batches.values():
                in_background(partial(self._renew, renew, flight))
            with self._lock:
                next_at = self._heap[0][0] if self._heap else None  # (a stale entry only wakes us early)
                self._next_wake = math.inf if next_at is None else next_at
            timeout = None if next_at is None else max(0.0, next_at - self._clock())
            self._wakeup.wait(timeout)
            self._wakeup.clear()

    def _renew(self, leases: list[Lease], flight: Signal) -> None:
        """Renew one tick's batch; then reschedule, or report the losses. Runs off the timer."""
        sent_at = self._clock()
        ttls = [lease.ttl for lease in leases]  # each renewal counts with the TTL it sent
        try:
            results: list[bool | None] = self._backend.extend_many(
                [(lease.name, lease.token, lease.fence, ttl_ms(ttl)) for lease, ttl in zip(leases, ttls, strict=True)])
        except Exception:  # a BackendError, or a failure that escaped the backend's boundary: no answer either way
            results = [None] * len(leases)
        except BaseException:
            flight.set()  # whatever failed, nobody waits for this batch's answer for ever (a release would hang)
            raise
        now = self._clock()
        wake = False
        for lease, ttl, extended in zip(leases, ttls, results, strict=True):
            life = lease._life
            outcome = life.renewed(extended, ttl, sent_at, now)
            if outcome is _EXTENDED:
                self.renewals += 1
            elif outcome is _RETRY:
                emit("renewal_failed", lease.name, backend_kind(self._backend), "renew", fence=lease.fence,
                     error=f"no answer; retried while {life.valid_until - now:.3f} s of validity remain")
            else:
                if outcome is _GONE:
                    lease._lose("the server says it was deleted or taken by another holder", later=True)
                elif outcome is _GIVE_BACK:
                    # Reported lost on time, then the late renewal got through: give that key back.
                    in_background(partial(self._backend.release, lease.name, lease.token, lease.fence))
                continue  # no longer watched
            with self._lock:
                self._push(lease)
            wake = wake or life.due < self._next_wake
        flight.set()
        if wake:
            self._wakeup.set()

    def close(self) -> None:
        """Stop the runner (the leases stay held until they expire or are released)."""
        self._closed = True
        self._wakeup.set()
        runner, self._runner = self._runner, None
        if runner is not None and self._pid == os.getpid():
            join(runner, 5.0)

