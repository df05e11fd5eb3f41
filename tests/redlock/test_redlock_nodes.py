"""Redlock on five real, independent Redis nodes, some stopped or slow: two stopped nodes neither stop nor slow a
grant, three make it fail on time with no key left behind, a slow node slows no grant that has a quorum, and no
request overtakes an earlier one on its way to a slow node. The behaviour every backend shares (API, errors, bad
input, cancellation, guards) runs on Redlock through the `deployment` fixture."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock._redis.redlock import default_node_timeout
from fencelock.testing.faults import LATE, FaultProxy, Rule
from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisNodes, RedisServer
from fencelock.testing.timing import slack
from tests.conftest import lock_value

from . import _support
from ._support import _holds, _urls

five = _support.five   # the same fixture, for this module's tests


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


def _runs(proxy: FaultProxy, since: float) -> list[str]:
    """The acquires and releases a node received since `since`, a NOSCRIPT's EVAL after its EVALSHA as one."""
    sent = [n for n in proxy.names(since) if n in ("redlock_acquire", "redlock_release")]
    return [n for k, n in enumerate(sent) if k == 0 or sent[k - 1] != n]


def _until_runs_start(proxies: list[FaultProxy], since: float, prefix: list[str], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while any(_runs(p, since)[:len(prefix)] != prefix for p in proxies) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_quorum_granted_after_the_ttl_ran_out_is_given_back_and_tried_again_not_called_busy(
        five: RedisNodes, name: str, front: str) -> None:
    """Three nodes' grants come back after the TTL: nobody held the lock, so wait=0 gives the grant back on every
    node and proposes once more, and gets it (before, this raised NotAcquired "held by another holder").

    The give-back returns at a quorum: on a late node whose reply was not read yet it follows that reply, so
    the client stays open until every late node got it (closed before, it never goes: see the next test)."""
    proxies = [FaultProxy("127.0.0.1", node.port, name=f"faults-{i}").start() for i, node in enumerate(five.nodes)]
    try:
        urls = [f"redis://127.0.0.1:{p.port}/0?socket_timeout=2" for p in proxies]
        given_back = ["redlock_acquire", "redlock_release"]
        rules: list[Rule] = []
        since = 0.0

        def warmed() -> None:
            # The warm lease's release returns at a quorum: wait until it ran on every node (its key gone), so that
            # no part of it is read as this name's give-back. (CI saw it: on a node that had not loaded the script,
            # the release's EVAL after NOSCRIPT came after `since`.)
            deadline = time.monotonic() + 3.0
            while any(lock_value(node.client(), f"{name}:warm") is not None for node in five.nodes):
                assert time.monotonic() < deadline, "the warm lease's release never reached every node"
                time.sleep(0.01)
            time.sleep(0.05)  # (and its reply passed the proxy)

        def arm() -> None:
            # After a first grant (another name): the client knows the nodes' floor, so its first proposal for the
            # name is granted, late. (A new client's first proposal is stale: its second round, granted in time, is
            # counted from its own start, and would be kept.)
            nonlocal since
            rules.extend(p.arm(Rule(LATE, "redlock_acquire", delay=0.25)) for p in proxies[:3])
            since = time.monotonic()

        lease: fencelock.Lease | fencelock.aio.Lease
        if front == "sync":
            with fencelock.connect(urls, node_timeout=1.0) as locks:
                locks.acquire(f"{name}:warm", ttl=0.2, wait=0).release()
                warmed()
                arm()
                lease = locks.acquire(name, ttl=0.2, wait=0)
                _until_runs_start(proxies[:3], since, given_back)
        else:
            async def main() -> fencelock.aio.Lease:
                async with fencelock.aio.connect(urls, node_timeout=1.0) as locks:
                    await (await locks.acquire(f"{name}:warm", ttl=0.2, wait=0)).release()
                    await asyncio.to_thread(warmed)
                    arm()
                    got = await locks.acquire(name, ttl=0.2, wait=0)
                    await asyncio.to_thread(_until_runs_start, proxies[:3], since, given_back)
                    return got

            lease = asyncio.run(main())
        assert all(rule.hit.is_set() for rule in rules)
        tried_again = 0
        for proxy in proxies[:3]:
            runs = _runs(proxy, since)
            assert runs[:2] == given_back, runs  # the late grant, given back
            tried_again += runs[:3] == [*given_back, "redlock_acquire"]
        # The second attempt returns at its quorum: with the two nodes not faulted, one of these is enough.
        assert tried_again >= 1
        # A quorum of nodes granted the second round's proposal, the lease's fence (their hwm: it has no TTL).
        fence = redis_keys(name).fence
        assert sum(int(node.client().get(fence) or 0) == lease.fence for node in five.nodes) >= 3
    finally:
        for proxy in proxies:
            proxy.close()


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_give_back_still_behind_a_late_reply_when_the_client_closes_is_never_sent_and_the_key_expires(
        five: RedisNodes, name: str, front: str) -> None:
    """Node 2's late grant is still unread when the lease is granted (nodes 0 and 1 answered late too, so the
    first round was given back, at a quorum without node 2) and the client is closed at once. Its give-back and
    the second round's acquire wait behind that reply: close() cancels them, so they never reach node 2, not
    even once its reply came, and node 2's key of the first round frees by its TTL."""
    late = 1.0  # node 2's reply comes this long after its request: well after close()
    proxies = [FaultProxy("127.0.0.1", node.port, name=f"faults-{i}").start() for i, node in enumerate(five.nodes)]
    try:
        for i, delay in ((0, 0.25), (1, 0.25), (2, late)):
            proxies[i].arm(Rule(LATE, "redlock_acquire", delay=delay))
        urls = [f"redis://127.0.0.1:{p.port}/0?socket_timeout=2" for p in proxies]
        since = time.monotonic()
        lease: fencelock.Lease | fencelock.aio.Lease
        if front == "sync":
            with fencelock.connect(urls, node_timeout=2.0) as locks:
                lease = locks.acquire(name, ttl=0.2, wait=0)
        else:
            async def main() -> fencelock.aio.Lease:
                async with fencelock.aio.connect(urls, node_timeout=2.0) as locks:
                    return await locks.acquire(name, ttl=0.2, wait=0)

            lease = asyncio.run(main())
        assert time.monotonic() - since < late  # (closed before node 2's reply came)
        assert lease.fence > 0
        time.sleep(max(0.0, since + late - time.monotonic()) + 0.3)  # node 2's reply is delivered meanwhile
        assert _runs(proxies[2], since) == ["redlock_acquire"]  # nothing followed it, before close or after
        assert lock_value(five.nodes[2].client(), name) is None  # the first round's key expired (ttl 0.2 s)
    finally:
        for proxy in proxies:
            proxy.close()
