"""The one wait rule etcd's and ZooKeeper's backends share (`_logic.timing.Deadline`), and ZooKeeper's expiry of
held nodes, driven by a fake clock with no server."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencelock._logic.timing import Deadline
from fencelock._zk.nodes import Expiry, Node
from fencelock._zk.rules import Child


class FakeClock:
    def __init__(self, now: float = 500.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_wait_of_zero_is_one_look_and_no_watch() -> None:
    clock = FakeClock()
    assert Deadline.after(0.0, clock()).expired(clock())


def test_a_waiter_watches_for_what_is_left_and_is_refused_when_the_wait_is_over() -> None:
    clock = FakeClock()
    deadline = Deadline.after(5.0, clock())
    clock.now += 1.5  # the join and a look
    assert not deadline.expired(clock())
    assert deadline.remaining(clock()) == pytest.approx(3.5)  # the watch lasts at most that
    clock.now += 3.5  # the watch ran out
    assert deadline.expired(clock())
    assert deadline.remaining(clock()) == 0.0


@given(st.floats(0.0, 1e6), st.floats(0.0, 1e6), st.floats(0.0, 1e6))
def test_a_wait_never_ends_early_nor_watches_past_its_end(wait: float, start: float, elapsed: float) -> None:
    deadline = Deadline.after(wait, start)
    now = start + elapsed
    assert deadline.expired(now) == (now >= start + wait)
    assert deadline.remaining(now) >= 0.0
    assert deadline.remaining(now) == pytest.approx(max(0.0, wait - elapsed), abs=1e-6)


class Expired:
    """An `Expiry` on a fake clock, recording the tokens of the nodes it expires, in order."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.tokens: list[str] = []
        self._fired = threading.Condition()
        self.expiry = Expiry(self._fire, clock)

    def _fire(self, key: tuple[str, str], node: Node) -> None:
        with self._fired:
            self.tokens.append(key[1])
            self._fired.notify_all()

    def hold(self, token: str, ttl: float) -> None:
        node = Node(cast(Any, None), "/locks/n", Child(1, token), czxid=1)
        node.expires = Deadline.after(ttl, self.clock())
        self.expiry.schedule(("n", token), node)

    def wait_for(self, count: int, timeout: float) -> bool:
        with self._fired:
            return self._fired.wait_for(lambda: len(self.tokens) >= count, timeout)


def test_a_held_node_expires_by_the_backends_clock_not_the_real_one() -> None:
    clock = FakeClock()
    expired = Expired(clock)
    try:
        expired.hold("t", 0.05)
        time.sleep(0.3)  # six TTLs of real time, none of the backend's
        assert expired.tokens == []
        clock.now += 0.05
        assert expired.wait_for(1, 5.0), "the node was not expired once the backend's clock passed its TTL"
        assert expired.tokens == ["t"]
    finally:
        expired.expiry.close()


def test_nodes_expire_in_the_order_of_their_ttls() -> None:
    clock = FakeClock()
    expired = Expired(clock)
    try:
        expired.hold("late", 2.0)
        expired.hold("early", 1.0)
        clock.now += 2.0
        assert expired.wait_for(2, 5.0)
        assert expired.tokens == ["early", "late"]
    finally:
        expired.expiry.close()
