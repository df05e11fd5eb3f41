"""Redlock on real nodes that lose data in the ways a node can: restarted from an older snapshot (its marker comes
back), restarted empty one at a time with no client in between (a rolling restart), repaired under a prefix with
glob characters, and repaired while another client with a longer repair delay holds a lease. Each time, an
independent client reads every node: no two valid leases, and no fence repeats or goes backwards."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisNodes, RedisServer
from fencelock.testing.timing import slack

from ._support import _holds
from .test_redlock_restarts import _until_given_up

DELAY = 1.5  # the repair delay of these tests: longer than every TTL they use
MARKER = "fencelock:redlock:node"


class _Three:
    """Three independent nodes, each behind a proxy that can cut it off (`cut`), and their direct clients."""

    def __init__(self, *servers: RedisServer) -> None:
        self.servers = list(servers)
        self.proxies = [Proxy(s.host, s.port, name=f"link{i}").start() for i, s in enumerate(servers)]

    def urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=0.3" for proxy in self.proxies]

    @contextlib.contextmanager
    def cut(self, *indices: int) -> Iterator[None]:
        """Nothing reaches nodes `indices`, and nothing sent meanwhile reaches them later."""
        proxies = [self.proxies[i] for i in indices]
        for proxy in proxies:
            proxy.stall()
        try:
            yield
        finally:
            _until_given_up(proxies)
            for proxy in proxies:
                proxy.heal()

    def hwm(self, i: int, name: str, prefix: str = "fencelock") -> int:
        value: Any = self.servers[i].client().get(redis_keys(name, prefix).fence)
        return int(value or 0)

    def marker(self, i: int, prefix: str = "fencelock") -> str | None:
        value: Any = self.servers[i].client().get(f"{prefix}:redlock:node")
        return None if value is None else bytes(value).decode()

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        for server in self.servers:
            server.close()


@pytest.fixture
def three() -> Iterator[_Three]:
    nodes = _Three(*(RedisServer(name=f"node{i}").start() for i in range(3)))
    yield nodes
    nodes.close()


def _restart_empty(node: RedisServer) -> None:
    node.kill()  # no fsync, no snapshot: everything the node knew is gone
    node.restart()


# -- 1: a node restarted from an older snapshot -----------------------------------------------------------------

def test_a_node_restarted_from_an_older_snapshot_does_not_count_until_its_quarantine_and_repair(three: _Three,
                                                                                              name: str) -> None:
    """Redis's default persistence (RDB snapshots) brings a crashed node back as it was at its last snapshot: its
    marker and incarnation are back, X's key and hwm written after it are not. The restart is told apart (the
    server's run_id changed, and it does not run AOF with fsync always): the node does not count, so Y is not
    granted while X is valid (it used to be, with X's fence again); after the quarantine Y gets a higher fence."""
    a = three.servers[0]
    x = fencelock.connect(three.urls(), repair_delay=DELAY)
    x.acquire(name + ":warm", ttl=1.0, wait=2.0).release()     # the deployment is marked
    a.client().save()                                           # A's snapshot: marked, without what follows
    with three.cut(2):
        lx = x.acquire(name, ttl=DELAY, wait=0)                 # X holds {A, B}
    assert [_holds(s, name, lx.token) for s in three.servers] == [True, True, False]
    a.kill()
    a.restart()                                                 # A comes back from its snapshot
    assert three.marker(0) is not None                          # its marker is back ...
    assert not _holds(a, name, lx.token)                        # ... without X's key
    assert three.hwm(0, name) < lx.fence                        # ... or X's fence

    y = fencelock.connect(three.urls(), repair_delay=DELAY)
    with pytest.raises(fencelock.LockError) as refused:
        y.acquire(name, ttl=DELAY, wait=0)
    assert not isinstance(refused.value, fencelock.LockLost)
    assert lx.remaining() > 0                                   # X is still valid, and the only holder
    assert [_holds(s, name, lx.token) for s in three.servers[1:]] == [True, False]
    assert three.marker(0) is None                              # A is out until repaired
    ly = y.acquire(name, ttl=DELAY, wait=2 * DELAY + slack(5.0))
    assert lx.remaining() <= 0
    assert ly.fence > lx.fence
    ly.release()
    deadline = time.monotonic() + slack(5.0)
    while (three.marker(0) is None or three.hwm(0, name) < lx.fence) and time.monotonic() < deadline:
        with contextlib.suppress(fencelock.LockError):
            y.acquire(name + ":heal", ttl=1.0, wait=1.0).release()   # (heals A in the background)
        time.sleep(0.05)
    assert three.hwm(0, name) >= lx.fence                       # repaired from the others: it knows X's fence
    x.close()
    y.close()


# -- 4: a rolling restart -----------------------------------------------------------------------------------------

def test_a_rolling_restart_of_every_node_with_no_client_between_never_hands_out_a_lower_fence(name: str) -> None:
    """Every node restarted empty, one at a time, with no client in between: nothing is left anywhere of the
    deployment, which is then a new one. Its fences start from the nodes' clocks (µs), so the next holder's fence
    is above every earlier one and a guard accepts it (it used to be 1 again, and the guard refused it)."""
    nodes = RedisNodes(3).start()
    db = sqlite3.connect(":memory:")
    guard = fencelock.SQLGuard()
    guard.create_table(db.cursor())
    try:
        locks = fencelock.connect(nodes.urls)
        fences = []
        for _ in range(3):
            with locks.lock(name, ttl=1.0) as lease:
                with db:
                    guard.check(db.cursor(), name, lease.fence)
                fences.append(lease.fence)
        locks.close()
        for node in nodes.nodes:                 # never a majority down at once, and no client looks between
            _restart_empty(node)
            time.sleep(0.2)
        later = fencelock.connect(nodes.urls)    # the next run: a new process
        with later.lock(name, ttl=1.0, wait=slack(5.0)) as lease:
            assert lease.fence > max(fences)
            with db:
                guard.check(db.cursor(), name, lease.fence)   # the guard accepts the new holder
            markers: list[Any] = [node.client().get(MARKER) for node in nodes.nodes]
            floors = [int(bytes(m).decode()[len("floor:"):]) for m in markers]
            assert min(floors) > max(fences)     # every node's fences count from its clock, above the old ones
        later.close()
    finally:
        nodes.close()


# -- 2: a repair under a prefix with glob characters --------------------------------------------------------------

def test_a_repair_reads_the_fences_under_a_prefix_with_glob_characters(three: _Three, name: str) -> None:
    """prefix="app[1]": the repair's SCAN pattern used the prefix unescaped, matched no fence key, and the repaired
    node forgot every fence; the next grant on it and a node that had missed them went backwards."""
    prefix = "app[1]"
    a = three.servers[0]
    x = fencelock.connect(three.urls(), prefix=prefix, repair_delay=DELAY)
    x.acquire(name + ":warm", ttl=0.5, wait=2.0).release()
    with three.cut(2):                               # C misses these grants: {A, B} remember them
        for _ in range(3):
            last = x.acquire(name, ttl=0.5, wait=2.0)
            last.release()
    assert three.hwm(1, name, prefix) == last.fence > three.hwm(2, name, prefix)
    _restart_empty(a)
    deadline = time.monotonic() + DELAY + slack(5.0)
    while three.marker(0, prefix) is None:            # A is repaired after its quarantine, from B and C
        assert time.monotonic() < deadline
        with contextlib.suppress(fencelock.LockError):
            x.acquire(name + ":heal", ttl=0.5, wait=0.5).release()
        time.sleep(0.05)
    assert three.hwm(0, name, prefix) == three.hwm(1, name, prefix)  # it found B's fence key
    y = fencelock.connect(three.urls(), prefix=prefix, repair_delay=DELAY)
    with three.cut(1):                               # on {A, C}: the repaired node and the one that missed
        ly = y.acquire(name, ttl=0.5, wait=2.0)
        ly.release()
    assert ly.fence > last.fence
    x.close()
    y.close()


# -- 3: clients with different repair delays ----------------------------------------------------------------------

def test_a_client_with_a_shorter_repair_delay_does_not_shorten_the_quarantine_a_longer_lease_needs(
        three: _Three, name: str) -> None:
    """L (repair_delay 4 s) holds a 3.5 s lease on {A, B}; A restarts empty. S (repair_delay 1 s) would repair A
    after 1 s and be granted on {A, C} while L's lease is valid. The others' record of live TTLs keeps A's
    quarantine at least 3.5 s, so S is granted only once L's lease is over (checked on every node)."""
    a, b = three.servers[0], three.servers[1]
    long_ = fencelock.connect(three.urls(), repair_delay=4.0)
    long_.acquire(name + ":warm", ttl=1.0, wait=2.0).release()
    with three.cut(2):
        held = long_.acquire(name, ttl=3.5, wait=0)
    _restart_empty(a)
    short = fencelock.connect(three.urls(), repair_delay=1.0)
    lease = short.acquire(name, ttl=0.5, wait=8.0)
    assert not any(_holds(s, name, held.token) for s in three.servers)  # L's key is gone everywhere
    assert held.remaining() <= 0
    assert not _holds(b, name, held.token)
    assert lease.fence > held.fence
    lease.release()
    long_.close()
    short.close()
