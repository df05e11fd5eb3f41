"""Redlock start-up and repair on real nodes: no state of the nodes' bookkeeping is a dead end.

Every test starts from nodes no client has touched (nothing initialises them first, as users will run it) or
from a deployment in use, injects one fault of the issue (many clients at once, nodes stopped at first contact,
a client killed mid-initialisation, a node emptied mid-repair, a majority emptied, an older version's keys), and
checks both liveness (a grant comes within the repair delay plus a few timeouts) and safety (fences increase).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock._redis.redlock import Gate, plan_heal
from fencelock.testing.conformance import ConformanceSuite
from fencelock.testing.redis_deployments import RedlockDeployment
from fencelock.testing.servers import RedisNodes, RedisServer

MARKER = "fencelock:redlock:node"
FLOOR = 10**15  # a fence at least this big came from a node's clock (µs since 1970), not from counting


@pytest.fixture
def fresh() -> Iterator[RedisNodes]:
    """Five nodes nobody has looked at yet."""
    nodes = RedisNodes(5).start()
    yield nodes
    nodes.close()


def _urls(nodes: list[RedisServer], socket_timeout: float = 0.5) -> list[str]:
    return [f"{node.url}?socket_timeout={socket_timeout}" for node in nodes]


def _marker(node: RedisServer) -> str | None:
    value: Any = node.client().get(MARKER)
    return None if value is None else bytes(value).decode()


def _floor(node: RedisServer) -> int:
    value = _marker(node) or ""
    return int(value[6:]) if value.startswith("floor:") else 0


def _hwm(node: RedisServer, name: str) -> int:
    value: Any = node.client().get(redis_keys(name).fence)
    return int(value or 0)


def _until_marked(nodes: list[RedisServer], locks: fencelock.Locks, name: str, timeout: float) -> None:
    """Acquire and release until every node has its marker (each attempt that meets an unready node heals)."""
    deadline = time.monotonic() + timeout
    while any(_marker(node) is None for node in nodes):
        assert time.monotonic() < deadline, [_marker(node) for node in nodes]
        try:
            locks.acquire(name + ":heal", ttl=1.0, wait=1.0).release()
        except fencelock.QuorumUnavailable:
            pass
        time.sleep(0.1)


# -- many clients at once on a new deployment -------------------------------------------------------------------

WORKER = textwrap.dedent("""
    import json, sys, time
    import fencelock
    urls = sys.argv[1:]
    for line in sys.stdin:
        started = time.monotonic()
        locks = fencelock.connect(urls, repair_delay=30.0)
        try:
            lease = locks.acquire("job", ttl=2.0, wait=20.0)
            got = time.monotonic()
            time.sleep(0.01)
            releasing = time.monotonic()
            lease.release()
            out = {"fence": lease.fence, "started": started, "got": got, "releasing": releasing}
        except fencelock.LockError as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
        finally:
            locks.close()
        print(json.dumps(out), flush=True)
""")

TRIALS = 20
WORKERS = 8


def test_eight_processes_at_once_on_five_new_nodes_all_get_the_lock_at_once_every_time(fresh: RedisNodes) -> None:
    """Concurrent start-up: 8 processes connect to 5 never-used nodes at the same moment, 20 times over (the
    nodes emptied between trials). Every worker gets the lock, none waits for a quarantine (the repair delay is
    30 s, longer than the 20 s wait), every node ends marked as a new deployment (claimed for one digest, with
    a floor from its clock taken then: nothing went through a repair), and the grants do not overlap and have
    increasing fences in the order they were held."""
    urls = _urls(fresh.nodes, socket_timeout=2.0)
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, *urls], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True) for _ in range(WORKERS)]
    try:
        for trial in range(TRIALS):
            for node in fresh.nodes:
                node.client().flushall()  # a new deployment: no client has seen these data sets
            flushed = int(time.time() * 1_000_000)
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write("go\n")
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.flush()
            results = []
            for worker in workers:
                assert worker.stdout is not None
                results.append(json.loads(worker.stdout.readline()))
            errors = [r for r in results if "error" in r]
            assert not errors, (trial, errors)
            held = sorted(results, key=lambda r: r["got"])
            for earlier, later in itertools.pairwise(held):
                # (monotonic clocks are one clock across processes here; a later grant returns after the earlier
                # holder began its release, since the TTL is far longer than the hold)
                assert earlier["releasing"] <= later["got"], (trial, earlier, later)
                assert earlier["fence"] < later["fence"], (trial, held)
            assert flushed - 1_000_000 < min(_floor(node) for node in fresh.nodes), trial
            assert max(_floor(node) for node in fresh.nodes) < int(time.time() * 1_000_000) + 1_000_000, trial
            claims = {node.client().hget("fencelock:redlock:incarnation", "claim") for node in fresh.nodes}
            assert len(claims) == 1, (trial, claims)
            assert None not in claims, (trial, claims)
            # The first grant of each trial came about at once: no quarantine, no repair (generous bound for a
            # loaded machine; a quarantine would take 30 s).
            assert min(r["got"] - r["started"] for r in results) < 5.0, (trial, results)
    finally:
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.close()
        for worker in workers:
            worker.wait(timeout=30)
            assert worker.stdout is not None
            worker.stdout.close()


class _HealCount:
    """How many heals a Redlock backend ran, and the most at once (its `_heal`, wrapped on the instance)."""

    def __init__(self, backend: Any, front: str) -> None:
        self.started = self.running = self.most = 0
        self._lock = threading.Lock()
        heal = backend._heal

        def enter() -> None:
            with self._lock:
                self.started += 1
                self.running += 1
                self.most = max(self.most, self.running)

        def leave() -> None:
            with self._lock:
                self.running -= 1

        def counted(timeout: float) -> Any:
            enter()
            try:
                return heal(timeout)
            finally:
                leave()

        async def acounted(timeout: float) -> Any:
            enter()
            try:
                return await heal(timeout)
            finally:
                leave()

        backend._heal = counted if front == "sync" else acounted


def _release(lease: fencelock.Lease) -> None:
    """Release, again if it was left unsure (a busy machine's slow node: not what this test is about)."""
    for attempt in range(5):
        try:
            lease.release()
            return
        except fencelock.QuorumUnavailable:
            if attempt == 4:
                raise


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_many_first_waiters_of_one_new_client_share_one_heal(fresh: RedisNodes, front: str) -> None:
    """One new client on five new nodes, many waiters on one name at once (threads, or tasks): the first attempts
    meet unready nodes and each calls for a heal. They share one: never two heals of one client at once (a heal
    per attempt sent its own gate and mark requests to every node, opening dozens of connections on a loaded
    machine), and every waiter is granted, in fence order."""
    urls = _urls(fresh.nodes, socket_timeout=2.0)
    count = 40 if front == "sync" else 300
    fences: list[int] = []
    if front == "sync":
        locks = fencelock.connect(urls, node_timeout=2.0)  # (a loaded machine's slow reply is not the point)
        heals = _HealCount(locks._backend, front)
        barrier = threading.Barrier(count)

        def one() -> None:
            barrier.wait()
            lease = locks.acquire("first", ttl=10.0, wait=60.0)
            fences.append(lease.fence)
            _release(lease)

        try:
            threads = [threading.Thread(target=one) for _ in range(count)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(90.0)
        finally:
            locks.close()
    else:
        async def main() -> _HealCount:
            alocks = fencelock.aio.connect(urls, node_timeout=2.0)
            counted = _HealCount(alocks._backend, front)
            try:
                async def one() -> None:
                    lease = await alocks.acquire("first", ttl=10.0, wait=60.0)
                    fences.append(lease.fence)
                    for attempt in range(5):
                        try:
                            await lease.release()
                            break
                        except fencelock.QuorumUnavailable:
                            if attempt == 4:
                                raise
                await asyncio.wait_for(asyncio.gather(*(one() for _ in range(count))), 90.0)
            finally:
                await alocks.aclose()
            return counted
        heals = asyncio.run(main())
    assert fences == sorted(fences)
    assert len(set(fences)) == count
    assert heals.started >= 1, "the new nodes were never healed"
    assert heals.most == 1, (heals.most, heals.started)


class TestContentionOnUntouchedNodes:
    """The conformance suite's contention tests (threads with clients of their own; spawned processes), each on
    five Redlock nodes nobody initialised: every contender's first acquire meets a new deployment at once."""

    test_threads_contend_from_the_first_acquire = (
        ConformanceSuite.test_mutual_exclusion_and_fence_order_under_contention)
    test_processes_contend_from_the_first_acquire = (
        ConformanceSuite.test_mutual_exclusion_and_fence_order_across_processes)

    @pytest.fixture
    def deployment(self) -> Iterator[RedlockDeployment]:
        untouched = RedlockDeployment.start(initialise=False)
        try:
            assert not any(raw.exists(MARKER) for raw in untouched.raws())
            yield untouched
        finally:
            untouched.close()


# -- a minority down at first contact ---------------------------------------------------------------------------

DELAY = 1.5  # the repair delay of these tests: longer than every TTL they use


def test_two_of_five_nodes_stopped_at_first_contact_the_lock_comes_after_the_repair_delay(fresh: RedisNodes,
                                                                                          name: str) -> None:
    """A minority down at first contact: at once the error says which nodes are out and until when (never
    "busy"); by repair_delay the lock is granted, with a fence from the clock floor. The stopped nodes join when
    they come back, and a grant that needs them (two of the first three stopped) still gets a higher fence."""
    nodes = fresh.nodes
    locks = fencelock.connect(_urls(nodes), repair_delay=DELAY)
    for i in (3, 4):
        nodes[i].pause()
    try:
        with pytest.raises(fencelock.QuorumUnavailable, match="only 0 of 5 nodes are ready") as caught:
            locks.acquire(name, ttl=1.0, wait=0)
        states = {state.node: state.state for state in caught.value.nodes}
        assert sorted(states.values()) == ["fresh", "fresh", "fresh", "unreachable", "unreachable"], states
        assert caught.value.retry_in is not None
        assert 0 < caught.value.retry_in <= DELAY
        first = locks.acquire(name, ttl=1.0, wait=DELAY + 5.0)  # waits out the quarantine, then the floor
        assert first.fence > FLOOR
        first.release()
    finally:
        for i in (3, 4):
            nodes[i].resume()
    _until_marked(nodes, locks, name, timeout=DELAY + 10.0)
    assert min(_floor(nodes[i]) for i in (3, 4)) >= min(_floor(nodes[i]) for i in (0, 1, 2)) > FLOOR
    for i in (0, 1):
        nodes[i].pause()
    try:
        later = locks.acquire(name, ttl=1.0, wait=2.0)  # on {2, 3, 4}: two nodes that were stopped
        assert later.fence > first.fence
        later.release()
    finally:
        for i in (0, 1):
            nodes[i].resume()
    locks.close()


def test_a_wait_shorter_than_the_quarantine_ends_with_quorum_unavailable_never_acquire_timeout(
        fresh: RedisNodes, name: str) -> None:
    """Say why: an acquire whose wait ends before the quarantine does raises QuorumUnavailable at the end of
    the wait (it kept trying meanwhile), not AcquireTimeout; a wait that covers the quarantine gets the lock."""
    nodes = fresh.nodes
    locks = fencelock.connect(_urls(nodes), repair_delay=4.0)
    nodes[4].pause()
    told: list[fencelock.LockEvent] = []
    unsubscribe = fencelock.subscribe(told.append)
    try:
        started = time.monotonic()
        with pytest.raises(fencelock.QuorumUnavailable, match="repairable in"):
            locks.acquire(name, ttl=1.0, wait=1.0)
        assert time.monotonic() - started >= 1.0
        out = [e for e in told if e.kind == "node_out" and e.name == name]  # operators hear of it (WARNING)
        assert out
        assert all(e.backend == "redlock" and e.error for e in out)
        lease = locks.acquire(name, ttl=1.0, wait=8.0)
        assert lease.fence > FLOOR
        lease.release()
    finally:
        unsubscribe()
        nodes[4].resume()
    locks.close()


# -- a client killed in the middle of initialisation ------------------------------------------------------------

KILLED_INITIALISER = textwrap.dedent("""
    import os, sys
    import fencelock
    from fencelock._redis.redlock import Gate, deployment_id
    k, urls = int(sys.argv[1]), sys.argv[2:]
    backend = fencelock.connect(urls, repair_delay=float(os.environ["DELAY"])).backend
    views = backend._look(1.0)
    assert all(view is not None and view.gate is Gate.FRESH for view in views), views
    deployment = deployment_id(views)
    for i in range(len(urls)):
        assert backend._mark(i, views[i], "claim", deployment)
    for i in range(k):
        assert backend._mark(i, views[i], "fresh", deployment)
    os._exit(9)  # dies here: every node claimed, k of them marked, the others never
""")


@pytest.mark.parametrize("marked", [0, 2, 3])
def test_a_client_killed_after_marking_some_new_nodes_leaves_no_dead_end(fresh: RedisNodes, name: str,
                                                                         marked: int) -> None:
    """No dead end after a crashed initialisation (the client claimed every node for the new deployment, then
    died after marking some): with none marked, the next client sees the same new deployment and finishes it at
    once; with a quorum marked the lock is there at once; with fewer, by the repair delay (the unmarked nodes
    get the clock floor). Every node ends marked, and fences increase."""
    nodes = fresh.nodes
    urls = _urls(nodes)
    killed = subprocess.run([sys.executable, "-c", KILLED_INITIALISER, str(marked), *urls],
                            env={**os.environ, "DELAY": str(DELAY)}, timeout=60)
    assert killed.returncode == 9
    assert [_marker(node) is not None for node in nodes] == [i < marked for i in range(5)]
    locks = fencelock.connect(urls, repair_delay=DELAY)
    if marked >= 3 or marked == 0:
        lease = locks.acquire(name, ttl=1.0, wait=0)
    else:
        with pytest.raises(fencelock.QuorumUnavailable):
            locks.acquire(name, ttl=1.0, wait=0)
        lease = locks.acquire(name, ttl=1.0, wait=DELAY + 5.0)
        assert lease.fence > FLOOR
    lease.release()
    _until_marked(nodes, locks, name, timeout=DELAY + 10.0)
    after = locks.acquire(name, ttl=1.0, wait=2.0)
    assert after.fence > lease.fence
    after.release()
    locks.close()


# -- a node emptied again in the middle of its repair -----------------------------------------------------------

def _restart_empty(node: RedisServer) -> None:
    node.kill()      # no fsync, no AOF: everything the node knew is gone
    node.restart()


def test_a_node_restarted_empty_during_its_repair_is_not_marked_with_what_it_lost(fresh: RedisNodes,
                                                                                  name: str) -> None:
    """Repair is tied to the incarnation: a repair planned for node 2's data set, finishing after node 2 lost
    its data again, must not mark the new data set (which holds none of the repaired fences). That data set goes
    through a quarantine of its own, is then repaired, and the fence stays above everything granted before."""
    nodes = fresh.nodes
    locks = fencelock.connect(_urls(nodes), repair_delay=DELAY)
    for _ in range(3):
        locks.acquire(name, ttl=1.0, wait=2.0).release()
    granted = max(_hwm(node, name) for node in nodes)
    _restart_empty(nodes[2])
    backend: Any = locks.backend
    assert backend._look(1.0)[2].gate is Gate.FRESH  # first look at the new data set: its quarantine starts
    time.sleep(DELAY + 0.2)
    plan = plan_heal(backend._look(1.0), 5)
    (repair,) = plan.repairs
    assert repair.node == 2
    assert not repair.clock
    _restart_empty(nodes[2])                          # ... and loses it again before the repair lands
    assert backend._look(1.0)[2].gate is Gate.FRESH  # a new incarnation, seen now
    assert backend._repair_node(repair) is False
    assert _marker(nodes[2]) is None
    assert _hwm(nodes[2], name) == 0
    time.sleep(DELAY + 0.2)
    _until_marked(nodes, locks, name, timeout=10.0)
    assert _hwm(nodes[2], name) >= granted
    for i in (0, 1):
        nodes[i].pause()
    try:
        lease = locks.acquire(name, ttl=1.0, wait=2.0)  # {2, 3, 4}: the twice-emptied node counts
        assert lease.fence > granted
        lease.release()
    finally:
        for i in (0, 1):
            nodes[i].resume()
    locks.close()


def test_a_majority_restarted_empty_is_usable_again_after_the_delay_with_higher_fences(fresh: RedisNodes,
                                                                                       name: str) -> None:
    """No dead end when a majority loses its data: the two ready nodes cannot repair the three from a quorum,
    so those get the clock floor after their quarantine; every later fence is above every earlier one."""
    nodes = fresh.nodes
    locks = fencelock.connect(_urls(nodes), repair_delay=DELAY)
    for _ in range(3):
        locks.acquire(name, ttl=1.0, wait=2.0).release()
    granted = max(_hwm(node, name) for node in nodes)
    for i in (0, 1, 2):
        _restart_empty(nodes[i])
    with pytest.raises(fencelock.QuorumUnavailable, match="only 2 of 5 nodes are ready"):
        locks.acquire(name, ttl=1.0, wait=0)
    lease = locks.acquire(name, ttl=1.0, wait=DELAY + 5.0)
    assert lease.fence > max(granted, FLOOR)
    lease.release()
    locks.close()


# -- keys an older fencelock left -------------------------------------------------------------------------------

def test_the_old_dead_end_state_left_by_an_older_version_is_left_after_the_delay(fresh: RedisNodes,
                                                                                  name: str) -> None:
    """Stale keys: every node holds the older version's `seen` (some a `quarantine` too) and none is marked,
    the state older clients could never leave. It is not taken for a new deployment; after the delay every
    node is marked, and the error meanwhile is QuorumUnavailable."""
    nodes = fresh.nodes
    for i, node in enumerate(nodes):
        node.client().set("fencelock:redlock:seen", "1")
        if i % 2:
            node.client().set("fencelock:redlock:quarantine", "1", px=60_000)
    locks = fencelock.connect(_urls(nodes), repair_delay=DELAY)
    with pytest.raises(fencelock.QuorumUnavailable, match="quarantined"):
        locks.acquire(name, ttl=1.0, wait=0)
    lease = locks.acquire(name, ttl=1.0, wait=DELAY + 5.0)
    assert lease.fence > FLOOR
    lease.release()
    locks.close()


# -- operators ---------------------------------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fencelock", *args], capture_output=True, text=True, timeout=60)


def test_fencelock_nodes_shows_each_node_and_the_verdict_and_looking_starts_no_quarantine(fresh: RedisNodes,
                                                                                          name: str) -> None:
    """Operators can see it: `fencelock nodes` (and `Locks.nodes()`) lists every node's state and the verdict,
    as text and as JSON, never a password; looking at new nodes changes nothing (they stay new, so the first
    acquire still counts them at once)."""
    nodes = fresh.nodes
    urls = _urls(nodes)
    args = [arg for url in urls for arg in ("--url", url)]
    new = _cli("nodes", *args, "--json")
    assert new.returncode == 0, new.stderr  # a new deployment can be granted: the first acquire marks it
    report = json.loads(new.stdout)
    assert [node["state"] for node in report["nodes"]] == ["fresh"] * 5
    assert report["available"] is True
    assert "new deployment" in report["verdict"]
    assert [node["quarantine_left"] for node in report["nodes"]] == [None] * 5  # no quarantine started
    assert not any(node.client().exists("fencelock:redlock:incarnation") for node in nodes)
    locks = fencelock.connect(urls, repair_delay=DELAY)
    locks.acquire(name, ttl=1.0, wait=0).release()  # at once: the look did not start a window
    ready = locks.nodes()
    assert ready.verdict.available
    assert all(node.ready for node in ready.nodes)
    nodes[4].pause()
    try:
        secret = urls[3].replace("redis://", "redis://:hunter2@")  # a node that refuses the password
        shown = _cli("nodes", *args[:6], "--url", secret, "--url", urls[4])
    finally:
        nodes[4].resume()
    assert shown.returncode == 0, shown.stderr
    assert "hunter2" not in shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["NODE", "STATE", "READY", "REPAIRABLE", "IN", "COUNTS"]
    states = [line.split()[1] for line in lines[1:6]]
    assert states[:3] == ["ready"] * 3
    assert states[4] == "unreachable"  # (node 3, given a password it does not need, may or may not answer)
    assert lines[6].startswith("available: ")
    locks.close()
