# Generated from _async/waiting.py by scripts/unasync.py: do not edit, edit that file instead.
"""A client's waiting rooms: its waiters on one name share a bounded number of connections (`_logic.waiting`).

The head of a room blocks on the server for a wake-up; the others wait here for their turn, and their short
requests pass the room's gate. Thread- and task-safe: one lock guards every room, never held across a wait.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

from .._errors import BackendError, LockError, QuorumUnavailable
from .._logic.waiting import FAIR_SLOTS, SLOTS, Room
from ._concurrency import Signal


class WaitingRooms:
    """One room per (name, fair) that has waiters; a room goes when its last waiter leaves."""

    def __init__(self) -> None:
        self._rooms: dict[tuple[str, bool], Room[Seat]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    def close(self) -> None:
        """The client is closing: every waiter waiting here for its turn or a place wakes now, and its wait
        raises `LockError` (`Seat._check`)."""
        with self._lock:
            self._closed = True
            for room in self._rooms.values():
                for seat in room.seats():
                    seat._turn.set()
                    seat._place.set()

    def seat(self, name: str, fair: bool) -> Seat:
        """A seat for one acquisition, behind this client's other waiters on `name`; `leave` it at the end."""
        if os.getpid() != self._pid:
            # A forked child: the parent's waiters do not exist here (they would be heads nobody moves on from),
            # and the lock may have been copied while held. Start afresh.
            self._rooms, self._lock, self._pid = {}, threading.Lock(), os.getpid()
        key = name, fair
        with self._lock:
            room = self._rooms.get(key)
            if room is None:
                room = self._rooms[key] = Room(FAIR_SLOTS if fair else SLOTS)
            seat = Seat(self, key, room)
            room.join(seat)
            # Its first request's place in the gate, asked now, under the same lock: the gate lets seats send in
            # the order they sat down (for fair waiters: the order their entries reach the server's queue).
            seat._first = room.ask(seat)
        return seat

    def __len__(self) -> int:
        """Rooms with waiters in them."""
        return len(self._rooms)


class Seat:
    """One waiter's place in its room: whether it may block on the server, its wait for that, its gate."""

    __slots__ = ("_failure", "_first", "_gone", "_key", "_lock", "_place", "_raised", "_room", "_rooms", "_turn")

    def __init__(self, rooms: WaitingRooms, key: tuple[str, bool], room: Room[Seat]) -> None:
        self._rooms = rooms
        self._lock = rooms._lock
        self._key = key
        self._room = room
        self._turn = Signal()   # set when this seat becomes the head
        self._place = Signal()  # set when the gate hands this seat a place it asked for
        self._gone = False
        self._first: bool | None = None  # the place asked for at `seat`, not used yet: True held, False asked
        self._failure: BackendError | None = None  # another waiter's request failed while this one waited
        self._raised: BackendError | None = None   # what `_check` raised for it (not passed on again)

    def is_head(self) -> bool:
        """True: no earlier waiter of this client on this name is left, so this one may block on the server."""
        with self._lock:
            return self._room.head() is self

    def wait_turn(self, timeout: float | None) -> bool:
        """Wait until this seat is the head, at most `timeout` seconds (None: no limit). True: it is."""
        if self.is_head():
            return True
        turn = self._turn.wait(timeout)
        self._check()
        return turn

    def fail(self, exc: BackendError) -> None:
        """This waiter's request failed (the server failed, or could not be reached): the others waiting in the
        room fail with that error now, rather than each one after its own timeout, in turn. (Not for an error
        that was itself passed on: the waiters who came since have met no failure.)"""
        if exc is self._raised:
            return
        with self._lock:  # (the signals too: `_answered` must never clear a failure whose wake-up comes later)
            for seat in self._room.seats():
                if seat is not self:
                    seat._failure = exc
                    seat._turn.set()
                    seat._place.set()

    def _check(self) -> None:
        """Raise the failure another waiter met while this one waited (`fail`), or `LockError` if the client
        was closed meanwhile (`close`)."""
        if self._rooms._closed:
            raise LockError("the client was closed while this acquire waited", name=self._key[0])
        exc = self._failure
        if exc is None:
            return
        kind = type(exc) if type(exc) in (BackendError, QuorumUnavailable) else BackendError
        self._raised = kind(f"{exc.args[0] if exc.args else exc} (met by an earlier waiter on this lock, while "
                            "this one waited behind it)", name=exc.name)
        raise self._raised from (exc.__cause__ or exc)

    def _answered(self) -> None:
        """A request of this seat's own got through: a failure seen by another waiter is not this one's."""
        with self._lock:
            if self._failure is None:
                return
            self._failure = None
            if self._room.head() is not self:
                self._turn.clear()  # (set by `fail`, not by a turn: a real turn finds the seat the head)

    def leave(self) -> None:
        """Out of the room (granted, gave up, failed, cancelled); the next waiter becomes the head. Idempotent."""
        with self._lock:
            if self._gone:
                return
            self._gone = True
            unused, self._first = self._first, None
            head = self._room.leave(self)
            seat = self._room.release() if unused else None  # the place it held and never used
            if not len(self._room) and self._rooms._rooms.get(self._key) is self._room:
                del self._rooms._rooms[self._key]
        if head is not None:
            head._turn.set()
        if seat is not None:
            seat._place.set()

    def gate(self) -> Gate:
        """`with seat.gate():` around one short request: at most the room's slots are in flight at once."""
        return Gate(self)

    def _ask(self) -> Signal | None:
        """A place in the gate now (None), or the signal that is set when the gate hands this seat one."""
        with self._lock:
            first, self._first = self._first, None
            if first is not None:  # asked at `seat`
                return None if first else self._place
            self._place = Signal()
            if self._room.ask(self):
                return None
            return self._place

    def _withdraw(self) -> bool:
        """Stop asking; False if the gate handed this seat a place meanwhile (it must be given back)."""
        with self._lock:
            return self._room.withdraw(self)

    def _give_back(self) -> None:
        with self._lock:
            seat = self._room.release()
        if seat is not None:
            seat._place.set()


class Gate:
    """One place in a room's gate, for the length of an `with` block."""

    __slots__ = ("_seat",)

    def __init__(self, seat: Seat) -> None:
        self._seat = seat

    def __enter__(self) -> None:
        signal = self._seat._ask()
        if signal is None:
            return
        try:
            signal.wait(None)
            self._seat._check()  # woken by another waiter's failure (`fail`), maybe without a place
        except BaseException:
            if not self._seat._withdraw():  # handed a place (maybe just as we stopped waiting): pass it on
                self._seat._give_back()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._seat._give_back()
        if exc_type is None:
            self._seat._answered()
