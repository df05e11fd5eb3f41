"""The front end every backend shares: argument checks, the acquire loop, leases and the `lock()` context.

A lease is the ownership of one acquisition: its token lives in the lease and nowhere else, so two tasks or
threads sharing one client can never release each other's locks.
"""

from __future__ import annotations

import os
import secrets
import time
from functools import partial
from types import TracebackType
from typing import Protocol

from .._errors import AcquireTimeout, BackendError, LockError, LockLost, NotAcquired
from .._logic.args import DEFAULT_TTL, DEFAULT_WAIT, check_name, check_ttl, check_wait, ttl_ms
from .._logic.outcomes import Attempt, Released, State, after_release
from .._logic.timing import Clock, Deadline, block_for, validity_end
from ._compat import in_background, shielded, sleep, undo_if_interrupted

_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)

TOKEN_BYTES = 16
"""128 bits from `secrets`, one token per acquisition."""


class AsyncBackend(Protocol):
    """What a lock service must do for the front end. Each method is one request; none makes a decision."""

    shown: str
    block_cap: float

    def retry_after(self, exc: BackendError, failures: int) -> float | None:
        """Seconds to wait before trying again after `failures` failed requests in a row; None: do not."""
        ...

    async def try_acquire(self, name: str, token: str, ttl_ms: int, wait: float) -> Attempt:
        """One attempt; with `wait` > 0 it first waits up to that long for a release to wake it."""
        ...

    async def release(self, name: str, token: str, fence: int) -> Released: ...
    async def extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool: ...
    async def aclose(self) -> None: ...


class AsyncLease:
    """One granted acquisition of a lock: its name, token and fence, and the right to extend or release it."""

    __slots__ = ("_backend", "_clock", "_pid", "_state", "_uncertain_at", "_valid_until", "fence", "name",
                 "token", "ttl")

    def __init__(self, backend: AsyncBackend, clock: Clock, name: str, token: str, fence: int, ttl: float,
                 valid_until: float) -> None:
        self._backend = backend
        self._clock = clock
        self._pid = _pid
        self._state = State.HELD
        self._uncertain_at: float | None = None
        self._valid_until = valid_until
        self.name = name
        self.token = token
        self.fence = fence
        self.ttl = ttl

    def __repr__(self) -> str:
        # The token is a capability (it releases the lock): it is never printed.
        return (f"<Lease {self.name!r} fence={self.fence} {self._state.value} "
                f"remaining={self.remaining():.3f}s>")

    def remaining(self) -> float:
        """Seconds of validity left, by the local monotonic clock (0 once released or lost)."""
        if self._state is not State.HELD:
            return 0.0
        return max(0.0, self._valid_until - self._clock())

    @property
    def held(self) -> bool:
        """True while the lease is neither released nor known to be lost, and its validity has not run out."""
        return self.remaining() > 0.0

    def _check_owner(self, action: str) -> None:
        if _pid != self._pid:
            raise LockError(f"cannot {action} a lease acquired by process {self._pid} from its forked child "
                            f"{_pid}", name=self.name)

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to `ttl` seconds (default: its TTL) from now. Raises `LockLost` if no longer ours."""
        self._check_owner("extend")
        new_ttl = self.ttl if ttl is None else check_ttl(ttl, self.name)
        if self._state is not State.HELD:
            raise LockLost(f"cannot extend a lease that is {self._state.value}", name=self.name)
        sent_at = self._clock()
        if not await self._backend.extend(self.name, self.token, self.fence, ttl_ms(new_ttl)):
            self._state = State.LOST
            raise LockLost("the lock expired or was taken by another holder before it could be extended",
                           name=self.name)
        self.ttl = new_ttl
        self._valid_until = validity_end(new_ttl, sent_at)

    async def release(self) -> None:
        """Give the lock back. Raises `LockLost` if it had expired or been taken; a second release does nothing.

        On a network error or a cancellation the lease keeps its token and stays releasable: call it again.
        """
        self._check_owner("release")
        if self._state is State.RELEASED:
            return
        if self._state is State.LOST:
            raise LockLost("the lease was already lost", name=self.name)
        sent_at = self._clock()
        try:
            answer = await self._backend.release(self.name, self.token, self.fence)
        except BaseException:
            # The server may or may not have deleted the key; only a confirmed answer changes the state.
            if self._uncertain_at is None:
                self._uncertain_at = sent_at
            raise
        self._state = after_release(answer, self._uncertain_at, self._valid_until)
        if self._state is State.LOST:
            why = "expired" if answer is Released.EXPIRED else "was taken by another holder"
            raise LockLost(f"the lease {why} before it was released", name=self.name)

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if _pid == self._pid:
            await self.release()


class AsyncLocks:
    """A client for one lock service. Thread- and task-safe; holds no per-lock state of its own."""

    def __init__(self, backend: AsyncBackend, *, clock: Clock = time.monotonic) -> None:
        self._backend = backend
        self._clock = clock

    @property
    def backend(self) -> AsyncBackend:
        return self._backend

    def __repr__(self) -> str:
        return f"<Locks {self._backend.shown}>"

    async def acquire(self, name: str, *, ttl: float = DEFAULT_TTL,
                      wait: float | None = DEFAULT_WAIT) -> AsyncLease:
        """Acquire `name` for `ttl` seconds, waiting at most `wait` seconds (None: for ever; 0: one attempt).

        Raises `NotAcquired` (`AcquireTimeout` when `wait` > 0) if the lock stayed busy, `BackendError` if the
        server failed. Never returns a lease that the server did not grant.
        """
        name = check_name(name)
        ttl = check_ttl(ttl, name)
        wait_s = check_wait(wait, name)
        token = secrets.token_hex(TOKEN_BYTES)
        ms = ttl_ms(ttl)
        backend = self._backend
        clock = self._clock
        started = clock()
        deadline = None  # made at the first refusal: most acquisitions never need it
        block = 0.0      # how long the next attempt first waits for a release to wake it
        failures = 0
        while True:
            sent_at = clock()  # before any wait: the lease's validity counts from here
            try:
                attempt = await undo_if_interrupted(partial(backend.try_acquire, name, token, ms, block),
                                                    lambda: self._forget(name, token))
            except BackendError as exc:
                failures += 1
                delay = backend.retry_after(exc, failures)
                # The first failure may be retried (the acquire is idempotent for one token: a retry finds its
                # own grant); more only within a finite wait. Never for ever: a server that is down is an error.
                if delay is not None and (failures == 1 or (wait_s is not None
                                                            and clock() + delay < started + wait_s)):
                    await sleep(delay)
                    block = 0.0
                    continue
                # The script may have run. Delete our key if it did, but do not make the caller wait for a
                # server that just failed to answer: the error is due now, and the TTL bounds the key anyway.
                in_background(lambda: self._forget(name, token))
                raise
            failures = 0
            if attempt.granted:
                valid_until = validity_end(ttl, sent_at)
                if valid_until > clock():
                    return AsyncLease(backend, clock, name, token, attempt.fence, ttl, valid_until)
                # Granted too late to be of use (a slow network ate the TTL): give it back, count it as refused.
                await shielded(self._forget(name, token))
                attempt = Attempt(False, 0, None)
            now = clock()
            if deadline is None:
                deadline = Deadline.after(wait_s, started)
            if deadline.expired(now):
                if wait_s == 0:
                    raise NotAcquired("the lock is held by another holder", name=name)
                raise AcquireTimeout(f"the lock stayed busy for the whole wait of {wait_s} s", name=name)
            block = block_for(deadline, now, attempt.holder_ttl, backend.block_cap, ttl)

    async def _forget(self, name: str, token: str) -> bool:
        """Best effort: delete a key this acquisition may have created (True if there was one).

        If the server cannot be reached, the key (if any) expires with its TTL.
        """
        try:
            # Fence 0: only RELEASED matters here, meaning our key existed and is gone now.
            return await self._backend.release(name, token, 0) is Released.RELEASED
        except BackendError:
            return False

    def lock(self, name: str, *, ttl: float = DEFAULT_TTL, wait: float | None = DEFAULT_WAIT) -> AsyncLockContext:
        """`async with locks.lock(name) as lease:` runs the body only with the lock, and releases it on exit."""
        # Checked now, so that a bad argument fails at the `lock()` call, before anything is sent.
        check_ttl(ttl, check_name(name))
        check_wait(wait, name)
        return AsyncLockContext(self, name, ttl, wait)

    async def aclose(self) -> None:
        await self._backend.aclose()

    async def __aenter__(self) -> AsyncLocks:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


class AsyncLockContext:
    """The `lock()` context: acquires on entry (or raises), releases on exit. Not re-entrant."""

    __slots__ = ("_lease", "_locks", "_name", "_ttl", "_wait")

    def __init__(self, locks: AsyncLocks, name: str, ttl: float, wait: float | None) -> None:
        self._locks = locks
        self._name = name
        self._ttl = ttl
        self._wait = wait
        self._lease: AsyncLease | None = None

    async def __aenter__(self) -> AsyncLease:
        if self._lease is not None:
            raise LockError("this lock() context is already entered; call lock() again for another lease",
                            name=self._name)
        self._lease = await self._locks.acquire(self._name, ttl=self._ttl, wait=self._wait)
        return self._lease

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.__aexit__(exc_type, exc, tb)
