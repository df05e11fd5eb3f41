"""The front end every backend shares: the backend's interface, argument checks, the acquire loop and the `lock()`
context. The lease it grants is `lease.AsyncLease`: the token lives there and nowhere else, so two tasks or threads
sharing one client can never release each other's locks.
"""

from __future__ import annotations

import builtins
import secrets
import threading
import weakref
from functools import partial
from types import TracebackType
from typing import Protocol

from .._errors import BackendError, LockError, LockLost
from .._events import backend_kind, emit
from .._logic.acquiring import Acquiring, Block, GiveBack, Grant, Sleep, Step, Try
from .._logic.admission import caller_deadline
from .._logic.args import (
    DEFAULT_TTL,
    DEFAULT_WAIT,
    AcquireArgs,
    check_acquire,
    check_name,
    check_pattern,
    ttl_ms,
)
from .._logic.outcomes import Attempt, Released, State
from .._logic.status import LockStatus
from .._logic.timing import Clock, lease_clock
from .._redis.redlock import NodesReport
from ._concurrency import (
    Signal,
    current_task,
    event_loop,
    in_background,
    is_cancellation,
    now,
    shielded,
    sleep,
    uncancel,
    undo_if_interrupted,
)
from .lease import AsyncLease, OnLost
from .waiting import AsyncSeat, AsyncWaitingRooms
from .watchdog import AsyncWatchdog

TOKEN_BYTES = 16
"""128 bits from `secrets`, one token per acquisition."""

DRAIN_LIMIT = 5.0
"""Seconds `aclose` waits at most for the acquires in flight to end (each one's requests are bounded)."""


class AsyncBackend(Protocol):
    """What a lock service must do for the front end. Each method is one request; none makes a decision."""

    shown: str
    block_cap: float
    supports_fair: bool
    always_queues: bool
    """True where every waiter joins a queue (etcd, ZooKeeper): a waiter that gives up must always `leave`."""

    def retry_after(self, exc: BackendError, failures: int) -> float | None:
        """Seconds to wait before trying again after `failures` failed requests in a row; None: do not."""
        ...

    async def try_acquire(self, name: str, token: str, ttl_ms: int, wait: float, fair: bool) -> Attempt:
        """One attempt; with `wait` > 0 it first waits up to that long for a release to wake it. `fair`: queue."""
        ...

    async def leave(self, name: str, token: str) -> None:
        """A fair waiter gives up: out of the queue at once."""
        ...

    async def release(self, name: str, token: str, fence: int) -> Released: ...
    async def extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool: ...

    async def extend_many(self, leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
        """The watchdog's batch: (name, token, fence, ttl_ms) each; True extended, False not ours, None unknown."""
        ...

    # Operators' requests (`fencelock status / list / release --force`). Read behind every holder's back; no
    # token is ever part of the answer.

    async def status(self, name: str) -> LockStatus:
        """The lock as the server sees it now."""
        ...

    async def scan(self, pattern: str) -> list[LockStatus]:
        """Every HELD lock whose name matches the glob `pattern` (fnmatch), without blocking the server (Redis:
        SCAN, never KEYS); sorted by name."""
        ...

    async def force_release(self, name: str) -> LockStatus:
        """Remove the lock whoever holds it; returns what was removed (held=False: nothing was)."""
        ...

    async def aclose(self) -> None: ...


_UNUSED = object()  # a client no event loop has used yet


class AsyncLocks:
    """A client for one lock service. Thread- and task-safe; holds no per-lock state of its own."""

    def __init__(self, backend: AsyncBackend, *, clock: Clock = lease_clock) -> None:
        self._backend = backend
        self._clock = clock
        self._watchdog = AsyncWatchdog(backend, clock)
        self._rooms = AsyncWaitingRooms()  # this client's waiters, by name (see `waiting`)
        self._closed = False  # set by aclose: cleanups still running in the background then close after them
        self._finished = False  # aclose has closed the backend: nothing may open a connection any more
        self._acquiring = 0  # acquires in flight, which aclose waits for (they give back what they were granted)
        self._acquiring_lock = threading.Lock()
        self._drained = Signal()  # set once the client is closed and no acquire is in flight
        self._loop: object = _UNUSED  # the event loop this client belongs to, from its first use
        # Where closing the client frees its locks on the server (ZooKeeper: a session's nodes go with it), the
        # leases it granted, so that aclose can mark those still held lost before the next holder may be granted.
        self._leases: weakref.WeakSet[AsyncLease] = weakref.WeakSet()

    @property
    def backend(self) -> AsyncBackend:
        return self._backend

    @property
    def watchdog(self) -> AsyncWatchdog:
        """The client's one renewal watchdog (see `fencelock._async.watchdog`)."""
        return self._watchdog

    def __repr__(self) -> str:
        return f"<Locks {self._backend.shown}>"

    async def acquire(self, name: str, *, ttl: float = DEFAULT_TTL, wait: float | None = DEFAULT_WAIT,
                      renew: bool | float = False, on_lost: OnLost | None = None,
                      fair: bool = False) -> AsyncLease:
        """Acquire `name` for `ttl` seconds, waiting at most `wait` seconds (None: for ever; 0: one attempt).

        `renew=True` keeps the lease alive (extended every ttl/3; a number: every that many seconds) until it is
        released; `on_lost(lease)` is called once if it is lost. `fair=True` serves waiters in arrival order
        (single Redis and Cluster). Raises `NotAcquired` (`AcquireTimeout` when
        `wait` > 0) if the lock stayed busy, `BackendError` if the server failed. Never returns a lease that the
        server did not grant.
        """
        return await self._acquire_checked(self._check(name, ttl, wait, renew, on_lost, fair))

    def _check(self, name: object, ttl: object, wait: object, renew: object, on_lost: object, fair: object,
               cancel_on_lost: object = True) -> AcquireArgs:
        """The one argument rule of `acquire()` and `lock()` (`_logic.args.check_acquire`), for this backend."""
        return check_acquire(name, ttl, wait, renew, on_lost, fair, cancel_on_lost=cancel_on_lost,
                             supports_fair=self._backend.supports_fair, where=self._backend.shown)

    async def _acquire_checked(self, args: AcquireArgs) -> AsyncLease:
        """`acquire` with its arguments checked: a seat among this client's waiters on the name, then the loop."""
        self._check_usable(args.name)
        with self._acquiring_lock:
            self._acquiring += 1
        try:
            # This client's waiters on one name share its connections (`waiting`); etcd's and ZooKeeper's own
            # queues already make each waiter watch one key over the client's one connection.
            seat = None if self._backend.always_queues else self._rooms.seat(args.name, args.fair)
            try:
                return await self._acquire(args, seat)
            finally:
                if seat is not None:
                    seat.leave()
        finally:
            self._unhold()

    async def _acquire(self, args: AcquireArgs, seat: AsyncSeat | None) -> AsyncLease:
        """The acquire loop; `seat`: its place among this client's waiters on the name. Every decision is
        `Acquiring`'s (`_logic.acquiring`); the loop only carries it out."""
        name, ttl, fair, renew_every, on_lost = args.name, args.ttl, args.fair, args.renew_every, args.on_lost
        backend = self._backend
        clock = self._clock
        token = secrets.token_hex(TOKEN_BYTES)
        ms = ttl_ms(ttl)
        kind = backend_kind(backend)
        plan = Acquiring(name, ttl, args.wait, fair=fair, always_queues=backend.always_queues,
                         block_cap=backend.block_cap, retry_after=backend.retry_after,
                         behind=lambda: seat is not None and not seat.is_head(), clock=clock)
        forget_later = partial(self._forget_later, name, token, plan.queued)  # (counted from `_hold` on)
        emit("acquire", name, kind, "acquire")
        step: Step = plan.start()
        # An interruption (a cancellation) once a request went out forgets the attempt in the background,
        # after the caller's requests still in flight (one during a request, a wait or a give-back has its own).
        sent = asking = False
        try:
            while True:
                if self._closed:  # (aclose waits for this acquire, which gives back what it may have been granted)
                    raise await self._closed_while(name, token, plan.queued, sent)
                if isinstance(step, (Try, Block)) and step.waited is not None:
                    emit("wait", name, kind, "acquire", waited=step.waited)
                if isinstance(step, Try):
                    request = partial(undo_if_interrupted, partial(backend.try_acquire, name, token, ms, step.block,
                                                                   fair), forget_later, self._hold)
                    left = plan.wait_left()  # (the most it may wait for a turn among this client's requests)
                    try:
                        with caller_deadline(None if left is None else now() + left):
                            if seat is None or step.block > 0.0:
                                sent = asking = True
                                attempt = await request()
                            else:
                                async with seat.gate():  # a short request: at most the room's slots at once
                                    sent = asking = True
                                    attempt = await request()
                    except BackendError as exc:
                        asking = False
                        if not self._closed:  # (else: the connection was closed under it, see the loop's top)
                            step = plan.failed(exc)
                        continue
                    except LockError:
                        if self._closed:  # (the room's gate, woken by aclose)
                            raise await self._closed_while(name, token, plan.queued, sent) from None
                        raise
                    asking = False
                    step = plan.answered(attempt)
                elif isinstance(step, Grant):
                    lease = AsyncLease(backend, clock, name, token, step.fence, ttl, step.valid_until,
                                       watchdog=self._watchdog, renew_every=renew_every, on_lost=on_lost)
                    if renew_every is not None or on_lost is not None:
                        self._watchdog.watch(lease)
                    if getattr(backend, "close_ends_leases", False):  # (asked only now: after the arguments' checks)
                        with self._acquiring_lock:
                            self._leases.add(lease)
                    waited = clock() - plan.started
                    emit("grant", name, kind, "acquire", fence=step.fence, waited=waited, duration=waited)
                    return lease
                elif isinstance(step, GiveBack):
                    await shielded(self._forget(name, token, False))
                    step = plan.given_back()
                elif isinstance(step, Sleep):
                    await sleep(step.seconds)  # (short: a retry's back-off; the loop's top then sees aclose)
                    step = plan.slept()
                elif isinstance(step, Block):
                    assert seat is not None  # only a seated waiter is ever behind another
                    try:
                        await seat.wait_turn(step.timeout)
                    except BaseException:
                        if self._closed:
                            raise await self._closed_while(name, token, plan.queued, sent) from None
                        if step.forget_if_interrupted:
                            self._hold()
                            in_background(forget_later, ours=True)
                        raise
                    step = plan.turned()
                else:
                    if step.leave:
                        await shielded(self._leave(name, token))
                    if step.forget:
                        self._hold()
                        in_background(forget_later, ours=True)
                        if seat is not None and isinstance(step.error, BackendError):
                            seat.fail(step.error)  # the waiters behind this one would meet the same fault, in turn
                    waited = clock() - plan.started
                    emit(step.event, name, kind, "acquire", waited=waited, duration=waited,
                         error=str(step.error) if step.forget else None)
                    raise step.error
        except BaseException as exc:
            if not isinstance(exc, Exception):  # interrupted by its caller (a cancellation, KeyboardInterrupt)
                waited = clock() - plan.started
                emit("cancelled", name, kind, "acquire", waited=waited, duration=waited, error=type(exc).__name__)
                if sent and not asking and not isinstance(step, (Block, GiveBack)):
                    self._hold()
                    in_background(forget_later, ours=True)
            raise

    async def _closed_while(self, name: str, token: str, queued: bool, sent: bool) -> LockError:
        """The error of an acquire whose client was closed while it ran. What it sent may have been granted (a
        wait ended by `aclose` runs its attempt): that key is given back now, before `aclose` closes the
        connections (it waits for this), and never returned as a lease."""
        given = ""
        if sent and not self._finished and await shielded(self._forget(name, token, queued)):
            given = "; the lock its attempt was granted meanwhile was given back"
        return LockError(f"this client of {self._backend.shown} was closed while the acquire ran{given}",
                         name=name)

    async def _forget(self, name: str, token: str, queued: bool) -> bool:
        """Best effort: delete a key this acquisition may have created (True if there was one), and leave the
        fair queue. If the server cannot be reached, the key expires with its TTL, the queue entry with its own.
        """
        if queued:
            await self._leave(name, token)
        try:
            # Fence 0: only RELEASED matters here, meaning our key existed and is gone now.
            return await self._backend.release(name, token, 0) is Released.RELEASED
        except BackendError:
            return False

    def _hold(self) -> None:
        """A forget goes on in the background after its acquire returned: `aclose` waits for it as for an acquire
        (`_forget_later` ends the hold)."""
        with self._acquiring_lock:
            self._acquiring += 1

    def _unhold(self) -> None:
        with self._acquiring_lock:
            self._acquiring -= 1
            drained = self._closed and not self._acquiring
        if drained:
            self._drained.set()

    async def _forget_later(self, name: str, token: str, queued: bool) -> bool:
        """`_forget` in the background, after the caller has moved on (and after its request in flight, if one
        was). `aclose` waits for it (`_hold`), so the key it may have been granted is given back before the
        connections close; if it outlived that wait, the backend is closed again after it (a Redis Cluster client
        may have connected anew for it, and nobody else would close that connection)."""
        try:
            if self._finished:
                return False  # (its key, if any, goes by its TTL)
            return await self._forget(name, token, queued)
        finally:
            self._unhold()
            if self._finished:
                await self._backend.aclose()

    async def _leave(self, name: str, token: str) -> bool:
        """Best effort: leave the fair queue (True if the server confirmed). Else the entry expires by itself."""
        try:
            await self._backend.leave(name, token)
        except BackendError:
            return False
        return True

    def lock(self, name: str, *, ttl: float = DEFAULT_TTL, wait: float | None = DEFAULT_WAIT,
             renew: bool | float = True, on_lost: OnLost | None = None, cancel_on_lost: bool = True,
             fair: bool = False) -> AsyncLockContext:
        """`async with locks.lock(name) as lease:` runs the body only with the lock, and releases it on exit.

        The lease is renewed while the body runs (`renew=False` to not: it is then lost when its TTL runs out). If
        it is lost meanwhile, the exit raises `LockLost`; with asyncio the body is also cancelled at once, and the
        cancellation surfaces as `LockLost` (`cancel_on_lost=False` to let the body run on). A thread cannot be
        interrupted safely: call `lease.ensure()` before each critical write.
        """
        # The context checks its arguments now, by acquire()'s rule: a bad one fails at the `lock()` call.
        return AsyncLockContext(self, name, ttl, wait, renew, on_lost, cancel_on_lost, fair)

    # -- operators ----------------------------------------------------------------------------------------------

    async def status(self, name: str) -> LockStatus:
        """`name` as the lock service sees it now: held or free, the fence, the seconds its holder's lease has
        left on the server, and the queue length where waiters queue. Never shows a token."""
        self._check_usable(check_name(name))
        return await self._backend.status(name)

    async def list(self, pattern: str = "*") -> builtins.list[LockStatus]:
        """Every held lock whose name matches `pattern` (an fnmatch glob: `*`, `?`, `[seq]`), sorted by name.

        Redis walks its keys with SCAN (on every primary of a Cluster), so a large keyspace never blocks it.
        """
        pattern = check_pattern(pattern)
        self._check_usable(None)
        return await self._backend.scan(pattern)

    async def force_release(self, name: str) -> LockStatus:
        """Operators only: remove `name` whoever holds it. Returns what was removed (`held=False`: nothing was).

        The holder is not told; its watchdog finds the lease lost at its next renewal. The fence counter stays,
        so the next grant still gets a higher fence and guards still reject the old holder.
        """
        self._check_usable(check_name(name))
        return await self._backend.force_release(name)

    async def nodes(self) -> NodesReport:
        """Redlock only: each node's bookkeeping (reachable, ready, quarantined until when, repairable) and the
        deployment's verdict, read without changing anything (`fencelock nodes`)."""
        nodes = getattr(self._backend, "nodes", None)
        if nodes is None:
            raise ValueError(f"nodes() is for Redlock (three or more Redis node URLs), not {self._backend.shown}")
        self._check_usable(None)
        report: NodesReport = await nodes()
        return report

    def _check_usable(self, name: str | None) -> None:
        """Nothing more is sent once the client is closed (its watchdog has stopped: a lease granted now would be
        neither renewed nor reported lost), nor under another event loop than the first one that used it (its
        connections and watchdog belong to that loop)."""
        if self._closed:
            raise LockError(f"this client of {self._backend.shown} is closed; connect() again for a new one",
                            name=name)
        loop = event_loop()
        if self._loop is not loop:
            if self._loop is not _UNUSED:
                raise LockError(f"this client of {self._backend.shown} belongs to the event loop that first used "
                                "it (an earlier asyncio.run?); connect() again under this one", name=name)
            self._loop = loop

    async def aclose(self) -> None:
        """End every acquire of this client (each raises `LockError`, and gives back a grant it got meanwhile),
        stop the watchdog and close the connections this client made (leases still held expire by TTL)."""
        self._closed = True
        self._rooms.close()
        interrupt = getattr(self._backend, "interrupt", None)
        if interrupt is not None:
            interrupt()  # (Redis: a waiter's BLPOP in flight ends now; its attempt still gets its answer)
        with self._acquiring_lock:
            if not self._acquiring:
                self._drained.set()
        # Each acquire's requests are bounded (a blocking wait by `block_cap`): it ends soon, unless aclose is
        # called from inside one (a callback of its own), which must not wait for itself. (Under another event
        # loop than the client's, its acquires cannot run here: nothing to wait for.)
        if self._loop is _UNUSED or self._loop is event_loop():
            await self._drained.wait(min(self._backend.block_cap + 1.0, DRAIN_LIMIT))
        await self._watchdog.aclose()
        self._end_leases()  # (none kept unless the backend's close frees their locks)
        await self._backend.aclose()
        self._finished = True

    def _end_leases(self) -> None:
        """The backend's close frees the locks of the leases still held (ZooKeeper deletes a session's nodes): they
        are lost now, before it does, so that no lease of this client claims a lock the next holder may be granted
        (their `on_lost` runs here; an asyncio `lock()` body is cancelled with `LockLost`)."""
        with self._acquiring_lock:
            held = [lease for lease in self._leases if lease._life.state is State.HELD]
            self._leases.clear()
        for lease in held:
            lease._lose("its client was closed, and the server deleted its lock with the client's session", "close")
            lease._told()

    async def __aenter__(self) -> AsyncLocks:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


class AsyncLockContext:
    """The `lock()` context: acquires on entry (or raises), releases on exit. Not re-entrant."""

    __slots__ = ("_args", "_lease", "_locks")

    def __init__(self, locks: AsyncLocks, name: str, ttl: float, wait: float | None, renew: bool | float,
                 on_lost: OnLost | None, cancel_on_lost: bool, fair: bool) -> None:
        self._locks = locks
        self._args = locks._check(name, ttl, wait, renew, on_lost, fair, cancel_on_lost)
        self._lease: AsyncLease | None = None

    async def __aenter__(self) -> AsyncLease:
        if self._lease is not None:
            raise LockError("this lock() context is already entered; call lock() again for another lease",
                            name=self._args.name)
        lease = await self._locks._acquire_checked(self._args)
        if self._args.cancel_on_lost:
            lease._task = current_task()  # asyncio: the body is cancelled the moment the lease is lost
        if not lease._watched:
            # Not renewed and no on_lost: watched all the same, so that the end of its validity is a loss told at
            # once (the body cancelled, the "lost" event), not found only at the exit.
            self._locks.watchdog.watch(lease)
        self._lease = lease
        return lease

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        task, lease._task = lease._task, None
        cancelled_for_loss = task is not None and lease._life.state is State.LOST and is_cancellation(exc)
        try:
            await lease.__aexit__(exc_type, exc, tb)
        except LockLost as lost:
            if cancelled_for_loss:
                uncancel(task)  # the cancellation was ours: it surfaces as LockLost, not as a cancelled task
                raise lost from exc
            raise
