"""The etcd backend's waiters: each acquisition's record (`Held`), and this client's one watch per name, shared by
its waiters on the name, whose deletes wake only the waiter right behind each deleted key (decision
2026-12-05-etcd-many-waiters)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .._etcd.rules import BLOCK_CAP, Kv, name_dir
from ._concurrency import Runner, Signal, spawn
from .etcd_gateway import AsyncGateway


class Wake:
    """One waiter's place in its name's shared watch: `signal` is set once the key before its own, or its own, is
    deleted, or once the watch ended without knowing (the waiter looks again)."""

    __slots__ = ("before", "key", "signal", "token")

    def __init__(self, token: str, key: bytes, before: bytes) -> None:
        self.token, self.key, self.before = token, key, before
        self.signal = Signal()


class SharedWatch:
    """This client's one watch on a name's keys, shared by all its waiters on the name: one connection, however many
    wait, and a delete wakes only the waiter right behind it (etcd's `concurrency.Mutex` does the same per waiter)."""

    __slots__ = ("ended", "runner", "seen", "wakes")

    def __init__(self, seen: int) -> None:
        self.wakes: dict[bytes, set[Wake]] = {}  # by each key whose delete wakes them (before, own)
        self.seen = seen  # every delete up to this revision was passed on: the next watch starts after it
        self.ended = False
        self.runner: Runner | None = None


@dataclass
class Held:
    """One acquisition's lease and key on the server (from its first attempt until it is released or gives up)."""

    key: bytes
    lease: int
    seconds: int      # the lease's TTL as the server granted it
    asked: int        # the lease's TTL as we asked for it
    rev: int = 0      # our key's create revision, once known
    version: int = 1  # our key's version as last known: 1 once put, one more per move applied
    moving: tuple[int, int, int] | None = None  # a move to this (lease, seconds, asked) went out, outcome unknown
    releasing: bool = False  # a release went out (its answer may never have come)
    granted: bool = False    # a lease was granted on it (not a waiter any more)
    fresh_at: float = 0.0    # when the request that last started the lease's TTL (its grant, a refresh) went out
    wake: Wake | None = None  # its place in the name's shared watch, while it waits
    seen: tuple[Kv | None, Kv | None, Kv | None, int] | None = None  # its last look, which `wake` watches on from


class AsyncSharedWatches:
    """This client's shared watches, by name: the first waiter on a name starts its watch, the last one's leaving ends
    it. `held` is the backend's acquisitions by token (a wake whose acquisition ended or moved on is dropped);
    `closed` tells whether the backend is closing (no watch goes on then)."""

    def __init__(self, gateway: AsyncGateway, prefix: str, held: dict[str, Held],
                 closed: Callable[[], bool]) -> None:
        self._gateway = gateway
        self._prefix = prefix
        self._held = held
        self._closed = closed
        self._watches: dict[str, SharedWatch] = {}  # by name: the shared watch of this client's waiters
        self._lock = threading.Lock()  # (never held across an await)

    def watch(self, name: str, token: str, held: Held, before: bytes, revision: int) -> Wake:
        """`held`'s place in the name's shared watch, waiting for `before` (read at `revision`) to be deleted; the
        watch starts with the first waiter and ends with the last."""
        with self._lock:
            wake = held.wake
            shared = self._watches.get(name)
            if wake is not None and wake.before == before and shared is not None and not shared.ended:
                return wake  # (still in place: a wake-up or the watch's end sets its signal)
            wake = held.wake = Wake(token, held.key, before)
            if shared is None or shared.ended:
                shared = self._watches[name] = SharedWatch(revision)
                shared.runner = spawn(partial(self._run, name, shared), "fencelock-etcd-watch")
            elif shared.seen > revision:
                wake.signal.set()  # a delete after our look went by already: look again
            for key in (before, held.key):
                shared.wakes.setdefault(key, set()).add(wake)
            return wake

    def unwatch(self, name: str, held: Held) -> None:
        with self._lock:
            wake, held.wake, held.seen = held.wake, None, None
            shared = self._watches.get(name)
            if wake is not None and shared is not None:
                self._drop(shared, wake)

    @staticmethod
    def _drop(shared: SharedWatch, wake: Wake) -> None:
        for key in (wake.before, wake.key):
            wakes = shared.wakes.get(key)
            if wakes is not None:
                wakes.discard(wake)
                if not wakes:
                    del shared.wakes[key]

    def _deleted(self, shared: SharedWatch, key: bytes, revision: int) -> None:
        """The shared watch saw `key` deleted at `revision`: wake the waiters behind it (and its own)."""
        with self._lock:
            shared.seen = max(shared.seen, revision)
            woken = shared.wakes.pop(key, set())
            for wake in woken:
                self._drop(shared, wake)
        for wake in woken:
            wake.signal.set()

    async def _run(self, name: str, shared: SharedWatch) -> None:
        """The shared watch of a name: one stream after another while any of this client's waiters on the name
        waits; each goes on after the last delete the one before passed on, so none is missed. A fault ends it:
        every waiter looks again (and meets the fault), and the next one to wait starts a new watch."""
        directory = name_dir(self._prefix, name)
        try:
            while True:
                with self._lock:
                    for wakes in list(shared.wakes.values()):
                        for wake in list(wakes):
                            held = self._held.get(wake.token)
                            if held is None or held.wake is not wake:
                                self._drop(shared, wake)  # its acquisition ended or moved on
                    if not shared.wakes or self._closed():
                        break
                    start = shared.seen + 1
                if not await self._gateway.watch_deletes(directory, start, BLOCK_CAP,
                                                         partial(self._deleted, shared)):
                    break
        finally:
            with self._lock:
                shared.ended = True
                if self._watches.get(name) is shared:
                    del self._watches[name]
                woken = {wake for wakes in shared.wakes.values() for wake in wakes}
                shared.wakes = {}
            for wake in woken:
                wake.signal.set()
