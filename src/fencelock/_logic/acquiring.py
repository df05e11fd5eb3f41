"""The acquire loop's decisions: attempt outcomes, errors and the clock in; try, grant, sleep, block or raise out.

`Acquiring` does no I/O. The client executes each decision (one request, one sleep, one wait for its turn in the
waiting room) and reports what happened with `answered`, `failed`, `slept` or `turned`, which return the next.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from .._errors import AcquireTimeout, BackendError, NotAcquired
from .outcomes import Attempt
from .timing import Clock, Deadline, block_for, granted_from, validity_end


class Try(NamedTuple):
    """Send one attempt that first blocks up to `block` seconds for a release to wake it (0: a short request).

    `waited` is set on the first refusal only: the seconds to report in the "wait" event."""

    block: float
    waited: float | None = None


class Grant(NamedTuple):
    """Granted in time: the lease has this fence and is valid until `valid_until` (monotonic)."""

    fence: int
    valid_until: float


class GiveBack(NamedTuple):
    """Granted too late to be of use (a slow network ate the TTL): delete the key, then report `given_back`.
    Nobody held the lock: a late grant is tried again, never reported as busy."""


class Sleep(NamedTuple):
    """Back off `seconds` after a failed request, then report `slept`."""

    seconds: float


class Block(NamedTuple):
    """An earlier waiter of this client blocks on the server for this name: wait for this one's turn in the room,
    at most `timeout` seconds (None: no limit), then report `turned`. If interrupted meanwhile, forget the
    attempt in the background when `forget_if_interrupted` (a queue entry must not outlive its waiter)."""

    timeout: float | None
    forget_if_interrupted: bool
    waited: float | None = None


class Raise(NamedTuple):
    """Give up: emit `event` and raise `error`. First `leave` the queue (waiting for it), or `forget` the
    attempt in the background and pass the error on to this client's other waiters on the name."""

    error: BaseException
    event: str
    leave: bool = False
    forget: bool = False


Step = Try | Grant | GiveBack | Sleep | Block | Raise
RetryAfter = Callable[[BackendError, int], "float | None"]


class Acquiring:
    """One acquisition's decisions, from its first attempt to a grant or an error. One deadline for all of it."""

    __slots__ = ("_behind", "_clock", "_deadline", "_failures", "_fair", "_late", "_name", "_retry_after",
                 "_sent_at", "_took", "_ttl", "_wait", "_waiting", "block_cap", "queued", "started")

    def __init__(self, name: str, ttl: float, wait: float | None, *, fair: bool, always_queues: bool,
                 block_cap: float, retry_after: RetryAfter, behind: Callable[[], bool], clock: Clock) -> None:
        """`wait`: None for ever, 0 one attempt. `retry_after(exc, failures)`: the backend's back-off for an
        error (None: not worth a retry). `behind()`: an earlier waiter of this client on the name is ahead."""
        self._name = name
        self._ttl = ttl
        self._wait = wait
        self._fair = fair
        self.queued = fair or always_queues  # a waiter that gives up must leave its queue
        self.block_cap = block_cap
        self._retry_after = retry_after
        self._behind = behind
        self._clock = clock
        self.started = clock()
        self._deadline = Deadline.after(wait, self.started)
        self._failures = 0
        self._late = 0  # grants in a row that came with no validity left
        self._took = 0.0  # the last late grant's round trip, for the error
        self._waiting = False  # the first refusal was reported ("wait")
        self._sent_at = self.started

    def wait_left(self) -> float | None:
        """Seconds left of the caller's `wait` (None: it waits for ever): what a request may spend queued in the
        client (`caller_deadline`)."""
        return None if self._wait is None else self._deadline.remaining(self._clock())

    def start(self) -> Try:
        """The first attempt: a short request."""
        return self._try(0.0)

    def _try(self, block: float, waited: float | None = None) -> Try:
        self._sent_at = self._clock()  # before any wait: the validity counts from here, unless the backend names a
        #                                later start (`granted_from`)
        return Try(block, waited)

    def answered(self, attempt: Attempt) -> Grant | GiveBack | Try | Block | Raise:
        """The attempt got an answer: granted (in time, or too late), or refused."""
        self._failures = 0
        if attempt.granted:
            now = self._clock()
            valid_from = granted_from(self._sent_at, attempt, now)
            valid_until = validity_end(self._ttl, valid_from)
            if valid_until > now:
                return Grant(attempt.fence, valid_until)
            self._late += 1
            self._took = now - valid_from
            return GiveBack()
        self._late = 0
        return self._refused(attempt.holder_ttl)

    def given_back(self) -> Try | Raise:
        """The late grant was given back. The lock was free, so this is never "busy": like a failed request, the
        first is tried again at once, more only within a finite wait; then a `BackendError` says it was too slow."""
        if self._late == 1 or (self._wait is not None and not self._deadline.expired(self._clock())):
            return self._try(0.0)
        return Raise(BackendError(f"granted too late to be valid: the attempt took {self._took:.3f} s of the "
                                  f"ttl's {self._ttl} s (the grant was given back)", name=self._name),
                     "failed", leave=self.queued)

    def _refused(self, holder_ttl: float | None) -> Try | Block | Raise:
        now = self._clock()
        if self._deadline.expired(now):
            if self._wait == 0:
                return Raise(NotAcquired("the lock is held by another holder", name=self._name), "busy",
                             leave=self.queued)
            return Raise(AcquireTimeout(f"the lock stayed busy for the whole wait of {self._wait} s",
                                        name=self._name), "timeout", leave=self.queued)
        waited = None if self._waiting else now - self.started
        self._waiting = True
        if self._behind():
            # A fair waiter tries at least once per blocking period, which keeps its entry in the server's queue.
            remaining = self._deadline.remaining(now)
            limit = min(remaining, self.block_cap) if self._fair else remaining
            return Block(None if limit == math.inf else limit, self.queued, waited)
        return self._try(block_for(self._deadline, now, holder_ttl, self.block_cap, self._ttl), waited)

    def turned(self) -> Try:
        """The wait for a turn in the room ended (a turn, or its timeout): try again at once."""
        return self._try(0.0)

    def failed(self, exc: BackendError) -> Sleep | Raise:
        """The request failed. The first failure may be retried (an acquire is idempotent for one token: a retry
        finds its own grant); more only within a finite wait. Never for ever: a server that is down is an error."""
        self._failures += 1
        delay = self._retry_after(exc, self._failures)
        if delay is not None and (self._failures == 1 or (self._wait is not None
                                                          and self._clock() + delay < self._deadline.at)):
            return Sleep(delay)
        # The script may have run: forget our key, but in the background (the error is due now, the TTL bounds it).
        return Raise(exc, "failed", forget=True)

    def slept(self) -> Try:
        """The back-off is over: try again with a short request."""
        return self._try(0.0)
