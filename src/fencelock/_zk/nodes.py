"""Our node in one lock's queue, and the one thread that deletes held nodes whose TTL ran out unextended."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._logic.timing import Clock, Deadline, lease_clock
from .rules import Child, child_name, encode_lease
from .session import Committed, ZKSession, nothing


@dataclass(eq=False)
class Node:
    """Our node in one lock's queue: the session it lives in, and its czxid there (which tells it from any other
    node); its `fence` is the czxid it was granted with, which a move to another session keeps."""

    session: ZKSession
    directory: str
    child: Child
    czxid: int
    expires: Deadline = field(default_factory=lambda: Deadline(0.0))  # held only: deleted then unless extended
    waited: bool = False      # it was not at the head of the queue at once
    fence: int = 0            # 0: its czxid
    moving: ZKSession | None = None  # a move to this session went out and its outcome is unknown
    releasing: bool = False   # a release went out (its answer may never have come)
    before: Child | None = None  # waiting: the node ahead of it, last seen in a listing (None: list again)
    wakeup: Any = None        # waiting: what `woken` sets (the current attempt's `Wakeup`)

    def __post_init__(self) -> None:
        self.fence = self.fence or self.czxid

    def woken(self, _event: Any = None) -> None:
        """The watch on the node ahead fired (kazoo's thread). One bound method per node: kazoo keeps a set of
        watchers per path, so the attempts of one waiter add one watcher to the node ahead, not one each."""
        wakeup = self.wakeup
        if wakeup is not None:
            wakeup.set()

    @property
    def path(self) -> str:
        return f"{self.directory}/{child_name(self.child)}"

    def data(self, ttl_ms: int) -> bytes:
        """What the node carries for a TTL of `ttl_ms` (and its fence, once a move re-created it)."""
        return encode_lease(ttl_ms, None if self.fence == self.czxid else self.fence)

    def delete(self, then: Callable[[], None] = nothing, record: bool = False) -> None:
        """Delete this node now, or after the next reconnect (`ZKSession.delete_known`); `then` runs once the
        server confirmed. `record`: leave its fence on the lock's node, in the same transaction."""
        self.session.delete_known(self.path, self.directory, self.child.token, then,
                                  self.fence if record else None)

    def release_request(self) -> Committed:
        """Delete this (held) node and leave its fence on the lock's node, in one transaction."""
        return self.session.release_request(self.path, self.directory, self.fence)


@dataclass
class Expiry:
    """One daemon thread that deletes held nodes whose TTL ran out unextended (a heap of due times)."""

    fire: Callable[[tuple[str, str], Node], None]
    clock: Clock = lease_clock
    _heap: list[tuple[float, int, tuple[str, str], Node]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None
    _closed: bool = False

    def schedule(self, key: tuple[str, str], node: Node) -> None:
        with self._cond:
            if self._closed:
                return
            heapq.heappush(self._heap, (node.expires.at, next(self._order), key, node))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fencelock-zk-expiry", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = self.clock()
                due = Deadline(self._heap[0][0]) if self._heap else None
                if due is None or not due.expired(now):
                    self._cond.wait(None if due is None else due.remaining(now))
                    continue
                _, _, key, node = heapq.heappop(self._heap)
            try:
                self.fire(key, node)
            except Exception:
                pass

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()
