# Generated from _async/lease.py by scripts/unasync.py: do not edit, edit that file instead.
"""A lease: one granted acquisition of a lock, its token, fence and validity, and the right to extend or release it.

Its state (`_logic.lease.LeaseState`) is shared with the watchdog, which renews it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._errors import BackendError, LockError, LockLost, never_sent
from .._events import backend_kind, emit
from .._logic.args import check_ttl, ttl_ms
from .._logic.lease import LeaseState
from .._logic.outcomes import Released, State
from .._logic.timing import Clock
from ._concurrency import Signal, cancel, current_task, event_loop, run_result

if TYPE_CHECKING:
    from .client import Backend
    from .watchdog import Watchdog

log = logging.getLogger("fencelock")

OnLost = Callable[["Lease"], object]
"""Called once, with the lease, when it is lost: in the caller's thread or task when its own call finds the loss
(once that call has ended its turn on the lease, so the callback may call back into it), else off the watchdog
(a thread of the client's callbacks; asyncio: soon on the loop, where a slow one must be an `def`, whose
coroutine runs as a task)."""

_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


_CANCELLED: Any = object()  # a release interrupted half-way (a cancellation, KeyboardInterrupt): not an outcome


class _Release:
    """A release under way: what a concurrent `release()` of the same lease waits for, and then reports."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = Signal()
        self.error: BaseException | None = _CANCELLED

    def joined(self) -> None:
        """The outcome for a caller that joined: return, or raise the same error (a copy: each caller its own)."""
        error = self.error
        if error is None:
            return
        again = type(error).__new__(type(error))
        again.args, again.__dict__ = error.args, dict(error.__dict__)
        raise again from error.__cause__


class Lease:
    """One granted acquisition of a lock: its name, token and fence, and the right to extend or release it."""

    __slots__ = (
        "__weakref__",
        "_backend",
        "_clock",
        "_granted_at",
        "_life",
        "_loop",
        "_on_lost",
        "_pid",
        "_releasing",
        "_task",
        "_tell",
        "_watchdog",
        "_watched",
        "fence",
        "name",
        "token",
        "ttl",
    )

    def __init__(self, backend: Backend, clock: Clock, name: str, token: str, fence: int, ttl: float,
                 valid_until: float, *, watchdog: Watchdog, renew_every: float | None = None,
                 on_lost: OnLost | None = None) -> None:
        self._backend = backend
        self._clock = clock
        self._watchdog = watchdog  # its client's: renews it (if watched), and its lock guards `_life.take`
        self._watched = False
        self._releasing: _Release | None = None  # the release under way, which a concurrent release() joins
        self._pid = _pid
        self._loop = event_loop()  # (made by acquire, under its client's loop)
        # Its validity, next due time, renewal in flight (a Signal) and state, shared with the watchdog.
        self._life: LeaseState[Signal] = LeaseState(ttl, valid_until, renew_every)
        self._on_lost = on_lost
        self._tell = False  # the caller's own call found the loss: `on_lost` runs when that call ends (`_told`)
        self._task: Any = None  # the task to cancel when the lease is lost (asyncio lock() only)
        self._granted_at = clock()
        self.name = name
        self.token = token
        self.fence = fence
        self.ttl = ttl

    def __repr__(self) -> str:
        # The token is a capability (it releases the lock): it is never printed.
        return (f"<Lease {self.name!r} fence={self.fence} {self._life.state.value} "
                f"remaining={self.remaining():.3f}s>")

    @property
    def _valid_until(self) -> float:
        return self._life.valid_until

    @property
    def _in_flight(self) -> Signal | None:
        return self._life.renewal

    def remaining(self) -> float:
        """Seconds of validity left, by the local monotonic clock (0 once released or lost)."""
        return self._life.remaining(self._clock())

    @property
    def held(self) -> bool:
        """True while the lease is neither released nor known to be lost, its validity has not run out, and no
        release of it was asked for (the server may free the lock as soon as a release lands)."""
        return self.remaining() > 0.0

    @property
    def lost(self) -> bool:
        """True once the lease is known lost: the server said so, or its validity ran out unrenewed.

        Read by the local monotonic clock: it turns true on time even when the network gives no answer.
        """
        return self._life.is_lost(self._clock())

    def ensure(self) -> None:
        """Raise `LockLost` if the lease is lost or released, or a release of it was asked for. Call it before each
        critical write, and send the fence along."""
        if self.lost:
            raise LockLost(f"the lease was lost: {self._life.lost_reason or 'its validity ran out'}", name=self.name)
        if self._life.state is State.RELEASED:
            raise LockLost("the lease was released", name=self.name)
        if self._life.uncertain_at is not None:
            raise LockLost("a release of the lease was sent and its answer never came: it may be released (call "
                           "release() again to know)", name=self.name)
        if self._life.releasing:
            raise LockLost("a release of the lease was asked for: the lock may be released at any moment (if the "
                           "release failed, call release() again)", name=self.name)

    def _lose(self, reason: str, op: str = "renew", *, later: bool = False) -> None:
        """Mark the lease lost (once): tell the `on_lost` callback, and cancel the task holding it (asyncio).
        `later` (the watchdog found it): the callback runs off the watchdog (`Callbacks`), never holding it up;
        else in the caller's thread or task, when its call has ended its turn on the lease, before it returns
        (`_told`): a callback that calls back into the lease (release, extend) never waits for that very call."""
        if not self._life.lose(reason):
            return
        emit("lost", self.name, backend_kind(self._backend), op, fence=self.fence,
             held=self._clock() - self._granted_at, error=reason)
        if later and self._on_lost is not None:
            self._watchdog.callbacks.call(self._notify)  # (asyncio: before the task's cancellation is delivered)
        if self._task is not None and self._task is not current_task():
            cancel(self._task)
        if not later and self._on_lost is not None:
            self._tell = True

    def _told(self) -> None:
        """The caller's call ended its turn: run the `on_lost` its call found, if any (once)."""
        if self._tell:
            self._tell = False
            self._notify()

    def _notify(self) -> None:
        """Call `on_lost`; a failure is logged, never raised (asyncio: a coroutine it returns runs as a task)."""
        assert self._on_lost is not None
        what = f"the on_lost callback of lock {self.name!r} failed"
        try:
            result = self._on_lost(self)
        except Exception:
            log.exception("%s", what)
            return
        run_result(result, what)

    def _check_owner(self, action: str) -> None:
        if _pid != self._pid:
            raise LockError(f"cannot {action} a lease acquired by process {self._pid} from its forked child "
                            f"{_pid}", name=self.name)
        if event_loop() is not self._loop:
            raise LockError(f"cannot {action} a lease under another event loop than the one that acquired it "
                            "(its client's connections belong to that loop)", name=self.name)

    def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to `ttl` seconds (default: its TTL) from now. Raises `LockLost` if no longer ours, or if
        the server confirmed only after `ttl` had run out. A renewal (or another extend) in flight is waited for
        first: one request that sets the key's expiry at a time, so they land in the order they were sent."""
        self._check_owner("extend")
        new_ttl = self.ttl if ttl is None else check_ttl(ttl, self.name)
        mine = Signal()
        started = self._clock()
        while True:
            if self._life.state is not State.HELD:
                raise LockLost(f"cannot extend a lease that is {self._life.state.value}", name=self.name)
            if self._releasing is not None:  # (its answer would say "gone", and report the lease lost: it is not)
                raise LockLost("cannot extend a lease while it is being released", name=self.name)
            if self._life.uncertain_at is not None:
                raise LockLost("cannot extend a lease whose release may have gone through (its answer never came): "
                               "call release() again", name=self.name)
            if self._life.releasing:
                raise LockLost("cannot extend a lease whose release was asked for (it failed before it was sent: "
                               "call release() again)", name=self.name)
            with self._watchdog.lock:
                before = self._life.take(mine)
            if before is None:
                break
            try:
                before.wait(None)  # (a renewal's batch always ends: its requests are bounded)
            except BaseException as exc:
                self._interrupted(exc, "extend", started)
                raise
        try:
            self._extend(new_ttl)
        finally:
            with self._watchdog.lock:
                self._life.done(mine)
            mine.set()
            if self._watched:
                self._watchdog.reschedule(self)
            self._told()

    def _extend(self, new_ttl: float) -> None:
        sent_at = self._clock()
        kind = backend_kind(self._backend)
        # The server may apply it before its answer comes: until then a shorter TTL caps what the lease claims.
        due = self._life.due
        self._life.extending(new_ttl, sent_at)
        if self._watched and self._life.due < due:
            self._watchdog.reschedule(self)  # (looked at when that shorter TTL runs out)
        try:
            extended = self._backend.extend(self.name, self.token, self.fence, ttl_ms(new_ttl))
        except BaseException as exc:
            # Unknown outcome (no reply, a reset, a cancellation): the server may have applied the new TTL, now or
            # later. A shorter one then bounds what the lease may claim; a longer one is not counted until confirmed.
            self._life.extend_unknown(new_ttl, sent_at, self._clock())
            if isinstance(exc, BackendError):
                emit("failed", self.name, kind, "extend", fence=self.fence, duration=self._clock() - sent_at,
                     error=str(exc))
            self._interrupted(exc, "extend", sent_at)
            raise
        if not extended:
            self._lose("the server says it is gone (expired, removed or evicted) or another holder took it", "extend")
            raise LockLost("the lock was gone (expired, removed or evicted) or taken by another holder before it "
                           "could be extended",
                           name=self.name)
        self.ttl = new_ttl
        if not self._life.extended(new_ttl, sent_at, self._clock()):
            # Lost by our clock; the key may still be on the server (the request itself was late): give it back.
            self._lose("the extension was confirmed only after its TTL had run out", "extend")
            with contextlib.suppress(BackendError):
                self._backend.release(self.name, self.token, self.fence)
            raise LockLost("the extension was confirmed only after its TTL had run out", name=self.name)
        emit("extend", self.name, kind, "extend", fence=self.fence, duration=self._clock() - sent_at)

    def _interrupted(self, exc: BaseException, op: str, started: float) -> None:
        """A `cancelled` event if `exc` interrupted the call (an asyncio cancellation, KeyboardInterrupt)."""
        if not isinstance(exc, Exception):
            emit("cancelled", self.name, backend_kind(self._backend), op, fence=self.fence,
                 duration=self._clock() - started, error=type(exc).__name__)

    def release(self) -> None:
        """Give the lock back. Raises `LockLost` if it had expired or been taken; a second release does nothing.

        Renewal stops at the call, whatever its outcome. On a network error or a cancellation the lease keeps its
        token and stays releasable until its validity ends: call it again (the error's `lease` is this lease).
        Releases called at once (two threads or tasks) send one request, and each caller gets its outcome.
        """
        self._check_owner("release")
        if self._life.state is State.RELEASED:
            return
        # Whatever happens next, the holder wants out: renewal ends now, so a release that fails (or is cancelled)
        # leaves a key that its TTL frees, never one renewed for ever; and the lease claims nothing from now on.
        self._life.release_asked()
        while True:
            with self._watchdog.lock:
                ongoing = self._releasing
                if ongoing is None:
                    ongoing = self._releasing = _Release()
                    break
            ongoing.done.wait(None)
            if ongoing.error is not _CANCELLED:  # (else it was interrupted half-way: this caller sends its own)
                ongoing.joined()
                return
        started = self._clock()
        try:
            self._release()
        except BaseException as exc:
            self._interrupted(exc, "release", started)
            ongoing.error = exc if isinstance(exc, Exception) else _CANCELLED
            if isinstance(exc, LockError):
                exc.lease = self  # so that the caller can retry: `err.lease.release()`
            raise
        else:
            ongoing.error = None
        finally:
            self._releasing = None
            ongoing.done.set()
            self._told()

    def _release(self) -> None:
        flight = self._life.renewal
        if flight is not None:
            flight.wait(None)  # a renewal on the wire must not land after our release
        if self._life.state is State.LOST:
            # Lost by our clock, maybe not on the server (it was slow, not gone): delete our key if it is still
            # there, so it does not block others for a TTL. The loss is reported either way.
            try:
                self._backend.release(self.name, self.token, self.fence)
            except BackendError:
                pass
            raise LockLost(f"the lease was lost: {self._life.lost_reason}", name=self.name)
        sent_at = self._clock()
        try:
            answer = self._backend.release(self.name, self.token, self.fence)
        except BaseException as exc:
            # The server may or may not have deleted the key (unless the request never left): only a confirmed
            # answer changes the state.
            if not never_sent(exc):
                self._life.release_unknown(sent_at)
            if isinstance(exc, BackendError):
                emit("failed", self.name, backend_kind(self._backend), "release", fence=self.fence,
                     duration=self._clock() - sent_at, error=str(exc))
            raise
        if self._life.release_answered(answer, sent_at):
            now = self._clock()
            emit("release", self.name, backend_kind(self._backend), "release", fence=self.fence,
                 held=now - self._granted_at, duration=now - sent_at)
            return
        gone = answer in (Released.EXPIRED, Released.UNSURE)
        why = "was gone from the server (expired, removed or evicted)" if gone else "was taken by another holder"
        self._lose(f"it {why}", "release")
        raise LockLost(f"the lease {why} before it was released", name=self.name)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if _pid == self._pid:
            self.release()
