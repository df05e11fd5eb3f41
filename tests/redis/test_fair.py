"""Fair waiting on real servers (single Redis and Redis Cluster): arrival order, dead and impatient waiters, and
fair and non-fair clients mixed on one name."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock.testing import ClusterDeployment, RedisDeployment
from tests.conftest import RedisFamily, SharedDeployments


@pytest.fixture(params=["redis", "cluster"])
def fair_deployment(request: pytest.FixtureRequest, shared_deployments: SharedDeployments) -> RedisFamily:
    """Fair waiting is offered on a single Redis and a Redis Cluster (Redlock refuses it: see the last test)."""
    found = shared_deployments.get(request.param)
    assert isinstance(found, RedisDeployment | ClusterDeployment)
    return found


def _queue(deployment: RedisFamily, name: str) -> list[Any]:
    raw: Any = deployment.raw()
    return list(raw.lrange(redis_keys(name).queue, 0, -1))


def _wait_for_queue(deployment: RedisFamily, name: str, length: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(_queue(deployment, name)) < length:
        assert time.monotonic() < deadline, f"the queue never reached {length}"
        time.sleep(0.01)


def test_eight_waiters_acquire_in_the_order_they_queued(fair_deployment: RedisFamily, name: str) -> None:
    locks = fencelock.connect(fair_deployment.target)
    holder = locks.acquire(name, ttl=10.0, wait=0)
    order: list[int] = []

    def waiter(i: int) -> None:
        client = fencelock.connect(fair_deployment.target)
        with client.lock(name, ttl=5.0, wait=20.0, fair=True):
            order.append(i)
            time.sleep(0.01)
        client.close()

    threads = []
    for i in range(8):
        threads.append(threading.Thread(target=waiter, args=(i,)))
        threads[-1].start()
        _wait_for_queue(fair_deployment, name, i + 1)  # queued one after the other: a known order
    holder.release()
    for thread in threads:
        thread.join()
    assert order == list(range(8))
    assert _queue(fair_deployment, name) == []
    locks.close()


def test_asyncio_fair_waiters_keep_their_order(fair_deployment: RedisFamily, name: str) -> None:
    async def main() -> list[int]:
        locks = fencelock.aio.connect(fair_deployment.target)
        holder = await locks.acquire(name, ttl=10.0, wait=0)
        order: list[int] = []

        async def waiter(i: int) -> None:
            async with locks.lock(name, ttl=5.0, wait=20.0, fair=True):
                order.append(i)
                await asyncio.sleep(0.01)

        tasks = []
        for i in range(5):
            tasks.append(asyncio.ensure_future(waiter(i)))
            await asyncio.to_thread(_wait_for_queue, fair_deployment, name, i + 1)
        await holder.release()
        await asyncio.gather(*tasks)
        await locks.aclose()
        return order

    assert asyncio.run(main()) == list(range(5))


def test_a_waiter_that_gives_up_leaves_the_queue_at_once(fair_deployment: RedisFamily, name: str) -> None:
    locks = fencelock.connect(fair_deployment.target)
    holder = locks.acquire(name, ttl=10.0, wait=0)
    with pytest.raises(fencelock.AcquireTimeout):
        locks.acquire(name, ttl=5.0, wait=0.3, fair=True)
    assert _queue(fair_deployment, name) == []
    with pytest.raises(fencelock.NotAcquired):
        locks.acquire(name, ttl=5.0, wait=0, fair=True)
    assert _queue(fair_deployment, name) == []
    holder.release()
    locks.close()


def test_a_waiter_killed_while_queued_does_not_stall_the_others(fair_deployment: RedisFamily, name: str) -> None:
    locks = fencelock.connect(fair_deployment.target)
    holder = locks.acquire(name, ttl=10.0, wait=0)
    code = textwrap.dedent(f"""
        import fencelock
        fencelock.connect({fair_deployment.target!r}).acquire({name!r}, ttl=5.0, wait=60.0, fair=True)
    """)
    doomed = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    _wait_for_queue(fair_deployment, name, 1)  # it is the head of the queue
    got: list[float] = []
    thread = threading.Thread(target=lambda: got.append(
        (locks.acquire(name, ttl=5.0, wait=20.0, fair=True), time.monotonic())[1]))
    thread.start()
    _wait_for_queue(fair_deployment, name, 2)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    released_at = time.monotonic()
    holder.release()
    thread.join()
    # The dead head's entry expires (2 x the 1.5 s blocking cap + 1 s = 4 s), and the next waiter goes on.
    assert got
    assert got[0] - released_at < 4.0 + 1.5 + 0.5
    locks.close()


def test_fair_and_unfair_clients_on_one_name_stay_mutually_exclusive(fair_deployment: RedisFamily,
                                                                     name: str) -> None:
    inside = 0
    overlaps = 0
    count = 0
    guard = threading.Lock()

    def worker(fair: bool) -> None:
        nonlocal inside, overlaps, count
        client = fencelock.connect(fair_deployment.target)
        for _ in range(10):
            with client.lock(name, ttl=5.0, wait=30.0, fair=fair):
                with guard:
                    inside += 1
                    overlaps += inside > 1
                    count += 1
                time.sleep(0.002)
                with guard:
                    inside -= 1
        client.close()

    threads = [threading.Thread(target=worker, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == 0
    assert count == 60


def test_fair_is_refused_on_redlock(redlock_nodes: Any, name: str) -> None:
    locks = fencelock.connect(redlock_nodes.urls)
    with pytest.raises(ValueError, match="fair=True needs a single Redis"):
        locks.acquire(name, fair=True)
    with pytest.raises(ValueError, match="fair=True needs a single Redis"):
        locks.lock(name, fair=True)
    with pytest.raises(TypeError, match="fair must be True or False"):
        locks.acquire(name, fair="yes")  # type: ignore[arg-type]
    locks.close()


def test_a_forced_release_wakes_the_fair_queues_head_at_once(fair_deployment: RedisFamily, name: str) -> None:
    """`force_release` pushes the head's own wake-up in its script: the head does not wait for its block to end."""
    locks = fencelock.connect(fair_deployment.target)
    holder = locks.acquire(name, ttl=30.0, wait=0)
    granted: list[float] = []

    def waiter() -> None:
        client = fencelock.connect(fair_deployment.target)
        try:
            with client.lock(name, ttl=5.0, wait=20.0, fair=True):
                granted.append(time.monotonic())
        finally:
            client.close()

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        _wait_for_queue(fair_deployment, name, 1)
        time.sleep(0.2)  # the head is blocked on its own wake list by now
        forced = time.monotonic()
        assert locks.force_release(name).held
        thread.join(timeout=10)
        assert granted, "the fair head was never granted"
        # Without the push the head would take the lock only when its block ends (block_cap: 0.75 x the 2 s
        # socket timeout), or when its queue entry is refreshed.
        assert granted[0] - forced < 0.5, granted[0] - forced
        with pytest.raises(fencelock.LockLost):  # the old holder learns that its lock was taken from it
            holder.release()
    finally:
        thread.join(timeout=10)
        locks.close()


@pytest.mark.parametrize("fair", [True, False])
def test_asyncio_a_waiter_cancelled_in_its_wait_leaves_no_key_and_no_queue_entry(fair_deployment: RedisFamily,
                                                                                  name: str, fair: bool) -> None:
    """A waiter blocks in BLPOP with its acquire right behind it on the wire. Cancelled there, its request still
    runs to its end (the release wakes it, the acquire may grant), and the undo then gives the lock back: the
    lock ends free, with no queue entry, and the next waiter gets it."""

    async def main() -> None:
        locks = fair_deployment.aconnect()
        other = fair_deployment.aconnect()
        try:
            holder = await locks.acquire(name, ttl=10.0, wait=0)
            task = asyncio.ensure_future(locks.acquire(name, ttl=10.0, wait=5.0, fair=fair))
            if fair:
                await asyncio.to_thread(_wait_for_queue, fair_deployment, name, 1)
            else:
                await asyncio.sleep(0.2)  # its first attempt was refused; it blocks now
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await holder.release()  # wakes the cancelled waiter's BLPOP: its acquire runs, then its undo
            for _ in range(150):
                if fair_deployment.holder(name) is None and not _queue(fair_deployment, name):
                    break
                await asyncio.sleep(0.02)
            assert fair_deployment.holder(name) is None
            assert _queue(fair_deployment, name) == []
            after = await other.acquire(name, ttl=5.0, wait=1.0, fair=fair)
            assert after.fence > holder.fence
            await after.release()
        finally:
            await locks.aclose()
            await other.aclose()

    asyncio.run(main())
