"""Time decisions: the `wait` deadline, how long a waiter may block, back-off, and lease validity.

All times are seconds on a monotonic clock that the caller passes in (`now`), so every rule here is tested
with a fake clock; `lease_clock` is the one the clients pass.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .outcomes import Attempt

Clock = Callable[[], float]


def _boot_time() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


lease_clock: Clock = _boot_time if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
"""The clock of every lease's validity and every deadline: CLOCK_BOOTTIME where the system has it (Linux). Unlike
CLOCK_MONOTONIC it keeps counting while the machine is suspended, as the server's TTL does meanwhile."""

DRIFT_FACTOR = 0.01
DRIFT_FLOOR = 0.002


class Deadline:
    """One deadline for a whole acquisition: every retry and wake-up counts against it, none re-arms it."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at  # math.inf: no deadline

    @classmethod
    def after(cls, wait: float | None, now: float) -> Deadline:
        return cls(math.inf if wait is None else now + wait)

    def remaining(self, now: float) -> float:
        return max(0.0, self.at - now)

    def expired(self, now: float) -> bool:
        return now >= self.at


def drift(ttl: float) -> float:
    """Allowance for clock rate differences between client and server: 1 % of the TTL plus 2 ms."""
    return ttl * DRIFT_FACTOR + DRIFT_FLOOR


def validity_end(ttl: float, sent_at: float) -> float:
    """Monotonic instant after which a lease granted for `ttl` may already have expired on the server.

    Counted from `sent_at`, the moment *before* the request went out: the server started the TTL later than
    that, so the lease is valid at least until `sent_at + ttl - drift`.
    """
    return sent_at + ttl - drift(ttl)


def granted_from(attempt_sent: float, attempt: Attempt, now: float) -> float:
    """The instant a granted lease's validity counts from (`validity_end`'s `sent_at`).

    `attempt_sent`: when the attempt began. A backend may name when the request that last started the lease's TTL
    went out, `attempt.valid_from` (decisions 2026-12-05-etcd-burst, 2026-12-05-redlock-burst): later than the
    attempt's start if it waited in the client first, earlier if the TTL was started before. Never past `now`: a
    start in the future is no sending at all, and the attempt's start is used.
    """
    if attempt.valid_from is None or attempt.valid_from > now:
        return attempt_sent
    return attempt.valid_from


OVERHANG_MAX = 4.0
"""How many times its TTL a lease's key (etcd lease, ZooKeeper session) may be kept by the server after its holder
stopped: an extend to a shorter TTL keeps the key where it is within this factor, and moves it to a shorter lease
(or session) beyond it (docs/decisions/2026-12-04-extend-shorter.md)."""


def overhangs(kept: float, needed: float) -> bool:
    """Whether a key kept `kept` (seconds, or any unit) after its holder stops outlives a lease that needs `needed`
    by more than `OVERHANG_MAX` allows: then an extend to that shorter TTL moves the key."""
    return kept > OVERHANG_MAX * needed


MAX_BLOCK_SHARE = 0.25
"""A waiter's retry travels with its wait (one pipeline), so its lease counts from before the wait began:
one wait never takes more than this share of the waiter's own TTL from the lease it may win."""


def block_for(deadline: Deadline, now: float, holder_ttl: float | None, cap: float, ttl: float) -> float:
    """How long a waiter may block for a wake-up before it must try again.

    It never blocks past the caller's deadline, nor past the moment the current holder's key expires by itself
    (`holder_ttl`, seconds, from the failed attempt; None when unknown), nor longer than `cap` (one blocking
    call must end before the socket timeout does), nor longer than `MAX_BLOCK_SHARE` of its own `ttl`.
    """
    limit = min(deadline.remaining(now), cap, ttl * MAX_BLOCK_SHARE)
    if holder_ttl is not None:
        limit = min(limit, max(holder_ttl, 0.0))
    return limit


def backoff(attempt: int, rng: random.Random, base: float = 0.005, cap: float = 0.2) -> float:
    """Full-jitter exponential back-off after `attempt` failed attempts (0, 1, 2, ...)."""
    return rng.uniform(0.0, min(cap, base * (2 ** min(attempt, 16))))


OVERSLEPT_SHARE = 0.1
"""A wait for replies that woke later than its deadline by more than this share of its timeout (and 10 ms) was
kept from listening by its own client (a busy event loop, a starved thread), not by the servers."""


def overslept(deadline: float, woke: float, timeout: float) -> float:
    """Seconds more to wait for replies, once, after a wait that was due to end at `deadline` woke at `woke`: as long
    as it overslept, at most `timeout` again, when it overslept by more than `OVERSLEPT_SHARE`; else 0.

    Replies may have arrived in time and not been read while the client could not run: time the client could not
    listen is not the servers' (a node is never counted as failed for it: issue 14). A node that is really slow
    still times out, at most twice its timeout after the request started."""
    late = woke - deadline
    if late <= max(timeout * OVERSLEPT_SHARE, 0.01):
        return 0.0
    return min(late, timeout)


def renewal_retry(now: float, valid_until: float, every: float) -> float:
    """When to try again after a renewal that got no answer: soon, and never after the validity ends."""
    return min(now + min(max(every / 4, 0.01), 1.0), valid_until)
