"""Redlock's rounds of one client under a burst: how many run at once, and who goes next, without I/O.

A round sends one request to every node at once and gives each node `default_node_timeout` to answer. A node's
connections are capped (`_async/_transport.MAX_OPEN`), so a round started while more rounds are under way than
those connections carry waited in the client for a connection, and its node timeout ran out there: healthy nodes
counted as failed, and acquires failed (issue 14). A round (an acquire's, a release's, an extend's) therefore starts
only when it has a turn: at most `ROUNDS_AT_ONCE` of one client's rounds run at once, and the others wait for theirs
in arrival order (a held lease's and an attempt's next round first), *before* their clock starts. A lease's validity
counts from the start of the round that granted it (`Attempt.valid_from`), so time spent waiting here is not taken
from it. Why: docs/decisions/2026-12-05-redlock-burst.md.

No I/O and no threads here: the caller holds one lock around every call and wakes the waiter a call returns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

W = TypeVar("W", bound=Hashable)

ROUNDS_AT_ONCE = 32
"""A client's acquire rounds under way at once: half of a node's capped connections (`MAX_OPEN`, 64), so that each
round finds a connection to every node at once, and releases, extends and give-backs (which go first
there) still find one free; a watchdog's renewals go through the client's pool, not these."""

TURN_LIMIT = 30.0
"""Seconds a round may wait for its turn (measured: about 2,000 acquires a second through one asyncio client on
three local nodes, so tens of thousands at once pass). Past it the request fails with a `BackendError` that says
the client is overloaded and that nothing was sent: a burst the client cannot carry fails in bounded time, never
queues for ever."""


class Turns(Generic[W]):
    """Which of one client's rounds may start: at most `limit` at once; the others in arrival order, the `urgent`
    first: a held lease's (a release, an extend), so that a burst of acquires never starves them, and an attempt's
    next round (it proposes again), so that an acquire under way finishes before new ones start."""

    __slots__ = ("_queues", "limit", "running")

    def __init__(self, limit: int = ROUNDS_AT_ONCE) -> None:
        if limit < 1:
            raise ValueError(f"limit: at least one round must be able to run, got {limit}")
        self.limit = limit
        self.running = 0
        # Rounds waiting for a turn, oldest first: a held lease's, then the acquires'.
        self._queues: tuple[OrderedDict[W, None], OrderedDict[W, None]] = (OrderedDict(), OrderedDict())

    def __len__(self) -> int:
        """Rounds waiting for a turn."""
        return len(self._queues[0]) + len(self._queues[1])

    def ask(self, waiter: W, urgent: bool = False) -> bool:
        """A turn for a round: True if it may start now; else it waits, and `done` hands it one in turn."""
        if self.running < self.limit and not len(self):
            self.running += 1
            return True
        self._queues[0 if urgent else 1][waiter] = None
        return False

    def done(self) -> W | None:
        """A round is over: returns the waiter its turn goes to (now running), or None (nobody waits)."""
        for queue in self._queues:
            if queue:
                waiter, _ = queue.popitem(last=False)
                return waiter
        self.running = max(0, self.running - 1)
        return None

    def withdraw(self, waiter: W) -> bool:
        """`waiter` stops waiting (its turn did not come within `TURN_LIMIT`, or it was cancelled). False if it was
        not waiting: it was handed a turn meanwhile, which it must pass on (`done`)."""
        for queue in self._queues:
            if waiter in queue:
                del queue[waiter]
                return True
        return False


def turn_error(what: str, waited: float, waiting: int, limit: int = ROUNDS_AT_ONCE) -> str:
    """The message of a request (`what`: "acquire", "release", "extend") whose round got no turn within `waited`
    seconds, `waiting` rounds still queued."""
    return (f"this Redlock client is overloaded: the {what}'s round waited {waited:.1f} s for a turn ({limit} "
            f"rounds run at once, {waiting} more were waiting); nothing was sent. Fewer concurrent acquires "
            f"through one client, or more clients, carry the load")
