"""The waiting room: one client's waiters on one name, and which of them may talk to the server.

Waiters take a seat in arrival order. The first seated waiter (the head) is the only one that may block on the
server for a wake-up; the others wait here until they become the head. Short requests (an attempt that does not
block) of the room's waiters pass a gate of `slots` places, taken in arrival order. So the waiters of one name
hold at most `slots + 1` connections however many they are. Why: `docs/design/waiting.md`.

No I/O and no threads here: the caller holds one lock around every call and wakes the seat a call returns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

S = TypeVar("S", bound=Hashable)

SLOTS = 4
"""Short requests of one room's waiters in flight at once (non-fair): a burst of new waiters does not open a
connection each."""

FAIR_SLOTS = 1
"""Fair waiters send one at a time, in arrival order: their entries reach the server's queue in the order they
took their seats, so the room's head is this client's earliest waiter in the server's queue."""


class Room(Generic[S]):
    """Seats in arrival order, and the gate for their short requests (see the module docstring)."""

    __slots__ = ("_asking", "_free", "_seats")

    def __init__(self, slots: int) -> None:
        self._seats: OrderedDict[S, None] = OrderedDict()
        self._asking: OrderedDict[S, None] = OrderedDict()  # waiting for a place in the gate, oldest first
        self._free = slots

    def __len__(self) -> int:
        return len(self._seats)

    def join(self, seat: S) -> None:
        self._seats[seat] = None

    def seats(self) -> list[S]:
        """Every seat, in arrival order."""
        return list(self._seats)

    def head(self) -> S | None:
        """The seat that may block on the server (None: the room is empty)."""
        return next(iter(self._seats), None)

    def leave(self, seat: S) -> S | None:
        """`seat` is gone (granted, gave up, failed, cancelled). Returns the new head if it just became one."""
        was_head = self.head() == seat
        self._seats.pop(seat, None)
        self.withdraw(seat)
        return self.head() if was_head else None

    def ask(self, seat: S) -> bool:
        """A place in the gate: True if taken now; else the seat queues, and `release` hands it one in turn.

        The head goes before every other seat that asks: its turn to wait on the server must not wait for the
        short requests of those behind it."""
        if self._free > 0 and not self._asking:
            self._free -= 1
            return True
        self._asking[seat] = None
        if seat == self.head():
            self._asking.move_to_end(seat, last=False)
        return False

    def release(self) -> S | None:
        """A place is free again: returns the seat it goes to (now holding it), or None (no one asked)."""
        if self._asking:
            seat, _ = self._asking.popitem(last=False)
            return seat
        self._free += 1
        return None

    def withdraw(self, seat: S) -> bool:
        """`seat` stops asking (timeout, cancellation). False if it was not asking: it may hold a place then."""
        if seat not in self._asking:
            return False
        del self._asking[seat]
        return True
