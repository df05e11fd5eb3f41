"""The operators' view of locks: `status`, `list` and `force_release`, on every deployment, and the pure rules
under them (the majority view of Redlock, SCAN's glob, the command's exit statuses)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator

import pytest

import fencelock
from fencelock._cli.exits import OnLost, Step, after_loss, shell_status
from fencelock._logic.status import LockStatus, NodeView, majority_status, single_status
from fencelock._redis.keys import name_of_lock_key, redis_keys, scan_match
from fencelock.testing import Deployment
from fencelock.testing.servers import RedisNodes, RedisServer
from tests.conftest import BACKENDS, SharedDeployments, _require_server_binary, initialise_redlock


@pytest.fixture(params=list(BACKENDS))
def any_deployment(request: pytest.FixtureRequest, shared_deployments: SharedDeployments) -> Deployment:
    """Every backend in the registry (etcd and ZooKeeper too, once they are registered)."""
    return shared_deployments.get(request.param)


@pytest.fixture
def any_locks(any_deployment: Deployment) -> Iterator[fencelock.Locks]:
    client = any_deployment.connect()
    yield client
    client.close()


def glob_escape(name: str) -> str:
    return name.replace("[", "[[]")


def test_status_of_a_held_a_released_and_a_never_used_lock(any_locks: fencelock.Locks, name: str) -> None:
    locks = any_locks
    never = locks.status(name)
    assert (never.name, never.held, never.fence, never.remaining) == (name, False, None, None)
    assert never.queued in (None, 0)             # None: the service keeps no queue
    lease = locks.acquire(name, ttl=20.0)
    status = locks.status(name)
    assert status.held
    assert status.fence == lease.fence
    assert status.remaining is not None
    assert 10.0 < status.remaining <= 21.0        # (etcd counts whole seconds)
    lease.release()
    free = locks.status(name)
    assert (free.held, free.fence, free.remaining) == (False, lease.fence, None)
    assert lease.token not in repr(status)


def test_status_counts_live_fair_waiters(standalone: RedisServer, name: str) -> None:
    with fencelock.connect(standalone.url) as locks:
        lease = locks.acquire(name, ttl=20.0)

        def fair_waiter() -> None:
            with pytest.raises(fencelock.AcquireTimeout):
                locks.acquire(name, ttl=5.0, wait=1.5, fair=True)

        waiters = [threading.Thread(target=fair_waiter) for _ in range(2)]
        for waiter in waiters:
            waiter.start()
        time.sleep(0.7)
        assert locks.status(name).queued == 2
        for waiter in waiters:
            waiter.join(10)
        assert locks.status(name).queued == 0   # they gave up and left
        lease.release()


def test_list_returns_held_locks_matching_the_glob_sorted(any_locks: fencelock.Locks, name: str) -> None:
    locks = any_locks
    base = glob_escape(name)
    held = [locks.acquire(f"{name}:{suffix}", ttl=20.0) for suffix in ("b", "a", "{x}%", "a2")]
    locks.acquire(f"{name}:free", ttl=20.0).release()
    try:
        found = locks.list(f"{base}:*")
        assert [s.name for s in found] == sorted(lease.name for lease in held)
        assert all(s.held for s in found)
        assert {s.name: s.fence for s in found} == {lease.name: lease.fence for lease in held}
        assert [s.name for s in locks.list(f"{base}:a?")] == [f"{name}:a2"]
        assert [s.name for s in locks.list(f"{base}:[{{]*")] == [f"{name}:{{x}}%"]
        assert locks.list(f"{base}:zzz") == []
        assert f"{name}:a" in [s.name for s in locks.list()]
    finally:
        for lease in held:
            lease.release()


def test_force_release_removes_any_holders_lock_and_says_what(any_locks: fencelock.Locks,
                                                              any_deployment: Deployment, name: str) -> None:
    locks, deployment = any_locks, any_deployment
    lease = locks.acquire(name, ttl=20.0)
    removed = locks.force_release(name)
    assert removed.held
    assert removed.fence == lease.fence
    assert removed.remaining is not None
    assert deployment.holder(name) is None
    assert not locks.force_release(name).held        # nothing left to remove
    with pytest.raises(fencelock.LockLost):
        lease.extend()
    again = locks.acquire(name, ttl=20.0, wait=0)
    assert again.fence > lease.fence                 # the counter stays: guards still reject the old holder
    again.release()


def test_force_release_wakes_a_waiter(any_locks: fencelock.Locks, name: str) -> None:
    locks = any_locks
    locks.acquire(name, ttl=30.0)
    got: list[float] = []

    def waiter() -> None:
        lease = locks.acquire(name, ttl=5.0, wait=20.0)
        got.append(time.monotonic())
        lease.release()

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)
    removed_at = time.monotonic()
    locks.force_release(name)
    thread.join(20)
    assert got
    assert got[0] - removed_at < 2.0


def test_async_operators(any_deployment: Deployment, name: str) -> None:
    async def check() -> None:
        async with any_deployment.aconnect() as alocks:
            lease = await alocks.acquire(name, ttl=20.0)
            assert (await alocks.status(name)).fence == lease.fence
            assert [s.name for s in await alocks.list(glob_escape(name))] == [name]
            assert (await alocks.force_release(name)).held
            assert not (await alocks.status(name)).held

    asyncio.run(check())


def test_operators_check_their_arguments_before_sending(any_locks: fencelock.Locks) -> None:
    locks = any_locks
    with pytest.raises(TypeError, match="name must be a str"):
        locks.status(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        locks.force_release("")
    with pytest.raises(TypeError, match="pattern must be a str"):
        locks.list(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pattern must be a non-empty glob"):
        locks.list("")


def test_a_stalled_redlock_majority_is_quorum_unavailable(name: str) -> None:
    _require_server_binary()
    with RedisNodes(5) as servers:
        initialise_redlock(servers.urls)
        nodes = servers.nodes
        with fencelock.connect(servers.urls) as locks:
            lease = locks.acquire(name, ttl=20.0)
            nodes[0].pause()
            nodes[1].pause()
            try:
                assert locks.status(name).fence == lease.fence      # three of five still answer
                assert [s.name for s in locks.list(glob_escape(name))] == [name]
                nodes[2].pause()
                with pytest.raises(fencelock.QuorumUnavailable):
                    locks.status(name)
                with pytest.raises(fencelock.QuorumUnavailable):
                    locks.list()
            finally:
                for node in nodes[:3]:
                    node.resume()


# -- pure rules -----------------------------------------------------------------------------------------------


def view(pttl: int, fence: int, holder: str = "", queued: int = 0) -> NodeView:
    return NodeView(pttl, fence, queued, holder)


def test_single_status_reads_the_counter_as_the_holders_fence() -> None:
    assert single_status("n", view(1500, 7, "h")) == LockStatus("n", True, 7, 1.5, 0)
    assert single_status("n", view(-2, -1)) == LockStatus("n", False, None, None, 0)
    assert single_status("n", view(-1, 3, "h")) == LockStatus("n", True, 3, None, 0)  # a key without a TTL
    assert NodeView.decode([1, 2, 3, b"ab"]) == view(1, 2, "ab", 3)


def test_majority_status_needs_a_quorum_of_one_grant() -> None:
    # five nodes; grant "x" (fence 9) on three of them
    views: list[NodeView | None] = [view(900, 9, "x"), view(1000, 9, "x"), view(800, 9, "x"), view(-2, 8),
                                    None]
    assert majority_status("n", views, 5) == LockStatus("n", True, 9, 0.8, None)
    # only two nodes hold x, one holds y: nobody holds it by a majority; the highest hwm is shown
    split: list[NodeView | None] = [view(900, 9, "x"), view(900, 9, "x"), view(900, 11, "y"), view(-2, 8),
                                    view(-2, 8)]
    assert majority_status("n", split, 5) == LockStatus("n", False, 11, None, None)
    # a repair raised one node's hwm: the grant's fence is the lowest of its holders'
    repaired: list[NodeView | None] = [view(900, 9, "x"), view(900, 12, "x"), view(900, 9, "x"), None, None]
    assert majority_status("n", repaired, 5) == LockStatus("n", True, 9, 0.9, None)
    # the quorum-th longest TTL: how long a majority still holds it
    assert majority_status("n", [view(100, 1, "x"), view(5000, 1, "x"), view(3000, 1, "x")], 3) == \
        LockStatus("n", True, 1, 3.0, None)
    assert majority_status("n", [view(-2, -1), None, None], 3) is None   # no quorum answered
    assert majority_status("n", [view(-2, -1)] * 3, 3) == LockStatus("n", False, None, None, None)


def test_scan_match_narrows_on_the_server_only_where_the_glob_reads_the_same() -> None:
    assert scan_match("jobs:*") == "fencelock:{jobs:*}:lock"
    assert scan_match("a?c", "my*app") == "my\\*app:{a?c}:lock"
    for pattern in ("[ab]*", "x{y}", "100%", "a\\b"):
        assert scan_match(pattern) == "fencelock:{*}:lock"
    key = redis_keys("a{b}%c").lock
    assert name_of_lock_key(key) == "a{b}%c"
    assert name_of_lock_key(key.encode()) == "a{b}%c"
    assert name_of_lock_key("fencelock:{a}:fence") is None
    assert name_of_lock_key("other:{a}:lock") is None


def test_exit_statuses_and_the_stopping_of_a_command_whose_lock_was_lost() -> None:
    assert shell_status(0) == 0
    assert shell_status(7) == 7
    assert shell_status(-signal.SIGTERM) == 143
    assert shell_status(-signal.SIGKILL) == 137
    assert after_loss(OnLost.TERM, 10.0, 10.0, 5.0, termed=False) == Step(signal.SIGTERM, 15.0)
    assert after_loss(OnLost.TERM, 10.0, 14.9, 5.0, termed=True) == Step(None, 15.0)
    assert after_loss(OnLost.TERM, 10.0, 15.0, 5.0, termed=True) == Step(signal.SIGKILL, None)
    assert after_loss(OnLost.KILL, 10.0, 10.0, 5.0, termed=False) == Step(signal.SIGKILL, None)
    assert after_loss(OnLost.IGNORE, 10.0, 99.0, 5.0, termed=False) == Step(None, None)
