"""Which of a client's requests goes out next: at most `limit` at once, the others queued by urgency, each queue
oldest first (decision 2026-12-05-etcd-burst).

`Admission` does no I/O and never waits: the client asks it whether a request may go (`enter`), tells it when one
is done (`done`), and wakes the request that it names as the next one.
"""

from __future__ import annotations

import contextvars
import enum
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class Urgency(enum.IntEnum):
    """A request's place in line: a lower value goes first."""

    RENEWAL = 0
    """Keep-alives and extends of leases this client holds, and the checks that go with them: a held lease runs out
    if these wait."""
    ONGOING = 1
    """The later requests of an acquire attempt whose lease was granted (its put, its looks): the lease's TTL runs
    meanwhile. Ahead of new work, so that a lease once granted is not left waiting behind every other grant; there
    are never many (a grant goes only when none of these waits)."""
    RELEASE = 2
    """Releases and revokes: nothing runs out while they wait (a lease being released is still renewed), but they
    go ahead of new work, so that no burst of acquires keeps a lock from being released."""
    NEW = 3
    """What starts new work: an attempt's lease grant (its validity counts from the grant's sending, so its wait
    here costs it nothing), operators' reads."""


class Admission(Generic[T]):
    """At most `limit` requests out at once; the others wait in `Urgency`'s order (renewals first, new work last),
    each oldest first. A request waits only while all `limit` are out, so a slot freed always goes to the next one."""

    __slots__ = ("_queues", "_waiting", "limit", "out")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.out = 0  # requests holding a slot: sent, or handed a slot and about to be sent
        self._queues: tuple[deque[T], ...] = tuple(deque() for _ in Urgency)
        self._waiting: set[T] = set()  # the tickets in the queues (one withdrawn is left there, and skipped)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def enter(self, ticket: T, urgency: Urgency) -> bool:
        """True: `ticket` goes now (it holds a slot until `done`). False: it waits until `done` names it."""
        if self.out < self.limit:
            self.out += 1
            return True
        self._queues[urgency].append(ticket)
        self._waiting.add(ticket)
        return False

    def queued(self, ticket: T) -> bool:
        """Still waiting (not handed a slot yet)."""
        return ticket in self._waiting

    def withdraw(self, ticket: T) -> bool:
        """A waiting request stops waiting (its caller gave up, or its wait timed out): it will not go. False if it
        was not waiting: it was handed a slot meanwhile, which it must use or pass on (`done`)."""
        if ticket not in self._waiting:
            return False
        self._waiting.discard(ticket)
        return True

    def done(self) -> T | None:
        """A request holding a slot is done: the ticket that has its slot now (wake it), or None (the slot is free)."""
        for queue in self._queues:
            while queue:
                ticket = queue.popleft()
                if ticket in self._waiting:
                    self._waiting.discard(ticket)
                    return ticket  # (the slot passes on: `out` stays)
        self.out -= 1
        return None

    def close(self) -> list[T]:
        """Every waiting request, oldest first by urgency, taken out of line (the client is closing: wake them,
        they will not go)."""
        tickets = [ticket for queue in self._queues for ticket in queue if ticket in self._waiting]
        for queue in self._queues:
            queue.clear()
        self._waiting.clear()
        return tickets


_caller_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("fencelock_caller_deadline",
                                                                               default=None)


@contextmanager
def caller_deadline(at: float | None) -> Iterator[None]:
    """While in it, a request waiting for its turn in the client gives up by `at` (on the client's `now()` clock;
    None: no deadline of the caller's): an acquire's `wait` is one deadline, also when the client is overloaded."""
    token = _caller_deadline.set(at)
    try:
        yield
    finally:
        _caller_deadline.reset(token)


def no_caller_deadline() -> None:
    """In a background task started by a caller (a cleanup): its requests are not bound by the caller's deadline."""
    _caller_deadline.set(None)


def turn_wait(limit: float, floor: float, now: float) -> float:
    """How long a request may wait for its turn: `limit`, or less where its caller's deadline (`caller_deadline`)
    comes first, but at least `floor` (one request's timeout: an acquire with no wait left still gets its one try)."""
    at = _caller_deadline.get()
    if at is None:
        return limit
    return min(limit, max(at - now, floor))
