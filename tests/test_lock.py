"""The lock's behaviour on real servers: a single Redis and a Redis Cluster of three masters (see conftest)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pytest

import fencelock

from .conftest import Deployment


def test_acquire_gives_a_fenced_lease_and_release_frees_the_lock(locks: fencelock.Locks, name: str,
                                                                  deployment: Deployment) -> None:
    lease = locks.acquire(name, ttl=5.0, wait=0)
    assert lease.name == name
    assert isinstance(lease.fence, int)
    assert lease.fence >= 1
    assert len(lease.token) == 32
    assert int(lease.token, 16) >= 0
    assert 4.9 < lease.remaining() <= 5.0 - 0.052
    assert deployment.holder(name) == lease.token
    lease.release()
    assert deployment.holder(name) is None
    assert lease.remaining() == 0.0


def test_fences_strictly_increase_with_every_grant(locks: fencelock.Locks, name: str) -> None:
    fences = []
    for _ in range(30):
        with locks.lock(name, ttl=5.0, wait=0) as lease:
            fences.append(lease.fence)
    assert fences == sorted(set(fences))
    assert len(fences) == 30


def test_tokens_are_unique_per_acquisition(locks: fencelock.Locks, name: str) -> None:
    tokens = set()
    for _ in range(200):
        lease = locks.acquire(name, ttl=5.0, wait=0)
        tokens.add(lease.token)
        lease.release()
    assert len(tokens) == 200


def test_a_held_lock_is_refused_with_wait_zero(locks: fencelock.Locks, name: str) -> None:
    with locks.lock(name, ttl=5.0):
        with pytest.raises(fencelock.NotAcquired) as info:
            locks.acquire(name, wait=0)
        assert not isinstance(info.value, fencelock.AcquireTimeout)
        assert info.value.name == name


def test_wait_is_one_deadline_for_all_retries(locks: fencelock.Locks, name: str, deployment: Deployment) -> None:
    with locks.lock(name, ttl=10.0):
        for wait in (0.05, 0.3, 1.0):
            started = time.monotonic()
            with pytest.raises(fencelock.AcquireTimeout):
                locks.acquire(name, wait=wait)
            took = time.monotonic() - started
            # The last attempt may start just before the deadline: it adds one attempt's time (Redlock: one
            # fan-out to five nodes, which a busy 2-core machine can stretch).
            slack = 0.2 if deployment.kind == "redlock" else 0.1
            assert wait <= took < wait + slack, (wait, took)


def test_the_context_body_never_runs_without_the_lock(locks: fencelock.Locks, name: str) -> None:
    ran = False
    with locks.lock(name, ttl=5.0), pytest.raises(fencelock.NotAcquired), locks.lock(name, wait=0):
        ran = True
    assert not ran


def test_the_context_releases_on_exit_even_when_the_body_raises(locks: fencelock.Locks, name: str,
                                                                 deployment: Deployment) -> None:
    with pytest.raises(RuntimeError, match="boom"), locks.lock(name, ttl=5.0):
        raise RuntimeError("boom")
    assert deployment.holder(name) is None


def test_extend_resets_the_ttl_and_the_validity(locks: fencelock.Locks, name: str, deployment: Deployment) -> None:
    lease = locks.acquire(name, ttl=0.5, wait=0)
    time.sleep(0.3)
    lease.extend(ttl=5.0)
    assert lease.remaining() > 4.8
    assert lease.ttl == 5.0
    assert deployment.pttl(name) > 4800
    time.sleep(0.3)
    assert deployment.holder(name) == lease.token  # outlived the first TTL
    lease.release()


def test_a_second_release_does_nothing(locks: fencelock.Locks, name: str) -> None:
    lease = locks.acquire(name, ttl=5.0, wait=0)
    lease.release()
    lease.release()
    other = locks.acquire(name, ttl=5.0, wait=0)  # a new holder is not disturbed by a late double release
    lease.release()
    with pytest.raises(fencelock.NotAcquired):
        locks.acquire(name, wait=0)
    other.release()


def test_an_expired_lease_taken_by_another_raises_lock_lost_and_leaves_the_new_key(
        locks: fencelock.Locks, name: str, deployment: Deployment) -> None:
    old = locks.acquire(name, ttl=0.1, wait=0)
    time.sleep(0.15)
    new = locks.acquire(name, ttl=5.0, wait=0)
    assert new.fence > old.fence
    with pytest.raises(fencelock.LockLost) as info:
        old.release()
    assert info.value.name == name
    with pytest.raises(fencelock.LockLost):
        old.extend()
    assert deployment.holder(name) == new.token
    new.release()


def test_an_expired_lease_nobody_took_still_reports_loss_on_release(locks: fencelock.Locks, name: str) -> None:
    lease = locks.acquire(name, ttl=0.05, wait=0)
    time.sleep(0.1)
    with pytest.raises(fencelock.LockLost, match="expired"):
        lease.release()


def test_leases_sharing_a_client_across_threads_cannot_release_each_other(locks: fencelock.Locks,
                                                                         name: str) -> None:
    """redis-py's async Lock kept the token in a thread-local: one task released another's lock."""
    first = locks.acquire(name, ttl=0.1, wait=0)
    time.sleep(0.15)
    second: list[fencelock.Lease] = []
    thread = threading.Thread(target=lambda: second.append(locks.acquire(name, ttl=5.0, wait=0)))
    thread.start()
    thread.join()
    with pytest.raises(fencelock.LockLost):
        first.release()
    with pytest.raises(fencelock.NotAcquired):
        locks.acquire(name, wait=0)  # still held by the second thread's lease
    second[0].release()


def test_mutual_exclusion_and_fence_order_under_contention(deployment: Deployment, name: str) -> None:
    """Threads with their own clients contend; critical sections never overlap and fences follow grant order."""
    inside = 0
    overlaps = 0
    grants: list[int] = []
    guard = threading.Lock()

    def worker() -> None:
        nonlocal inside, overlaps
        client = fencelock.connect(deployment.url)
        try:
            for _ in range(15):
                with client.lock(name, ttl=5.0, wait=20.0) as lease:
                    with guard:
                        inside += 1
                        overlaps += inside > 1
                        grants.append(lease.fence)
                    time.sleep(0.001)
                    with guard:
                        inside -= 1
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == 0
    assert len(grants) == 60
    assert grants == sorted(grants)
    assert len(set(grants)) == 60


def test_a_waiter_is_woken_by_the_release_not_by_polling(locks: fencelock.Locks, name: str,
                                                         deployment: Deployment) -> None:
    holder = locks.acquire(name, ttl=10.0, wait=0)
    timer = threading.Timer(0.6, holder.release)
    before = _calls(deployment, "evalsha")
    started = time.monotonic()
    timer.start()
    waiter = locks.acquire(name, ttl=5.0, wait=5.0)
    woke = time.monotonic() - started
    timer.join()
    # minus the holder's release; Redlock sends each request to every node
    attempts = (_calls(deployment, "evalsha") - before) // deployment.nodes_per_request - 1
    assert 0.6 <= woke < 0.7, woke
    assert attempts <= 3, f"{attempts} acquire attempts while waiting 0.6 s: that is polling"
    waiter.release()


def test_a_waiter_retries_when_a_crashed_holders_key_expires(locks: fencelock.Locks, name: str) -> None:
    locks.acquire(name, ttl=0.4, wait=0)  # never released: the holder "crashed"
    started = time.monotonic()
    lease = locks.acquire(name, ttl=5.0, wait=5.0)
    took = time.monotonic() - started
    assert 0.35 <= took < 0.55, took
    lease.release()


def test_names_with_braces_work_and_stay_in_one_slot(locks: fencelock.Locks) -> None:
    for odd in ("}", "{", "{}", "a}b{c", "%7B", "orders:{42}"):
        with locks.lock(odd, ttl=5.0, wait=0) as lease:
            assert lease.name == odd
            with pytest.raises(fencelock.NotAcquired):
                locks.acquire(odd, wait=0)


def test_a_forked_child_never_releases_its_parents_lease(locks: fencelock.Locks, name: str,
                                                         deployment: Deployment) -> None:
    lease = locks.acquire(name, ttl=10.0, wait=0)
    pid = os.fork()
    if pid == 0:  # the child: an explicit release is refused, and leaving the context releases nothing
        code = 0
        try:
            lease.release()
            code = 1
        except fencelock.LockError:
            pass
        try:
            lease.extend()
            code = 1
        except fencelock.LockError:
            pass
        with lease:
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert deployment.holder(name) == lease.token
    lease.release()


def test_a_redis_client_can_be_passed_in_and_is_not_closed(deployment: Deployment, name: str) -> None:
    target = deployment.target()
    locks = fencelock.connect(target)
    with locks.lock(name, ttl=5.0, wait=0) as lease:
        assert lease.fence >= 1
    locks.close()
    for raw in deployment.raws():
        assert raw.ping()


# -- asyncio ---------------------------------------------------------------------------------------------------

def test_asyncio_has_the_same_api(deployment: Deployment, name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(deployment.url)
        async with locks:
            lease = await locks.acquire(name, ttl=5.0, wait=0)
            with pytest.raises(fencelock.NotAcquired):
                await locks.acquire(name, wait=0)
            await lease.extend(2.0)
            assert 1.9 < lease.remaining() <= 2.0
            await lease.release()
            async with locks.lock(name, ttl=5.0, wait=0) as second:
                assert second.fence > lease.fence
            with pytest.raises(fencelock.AcquireTimeout):
                async with locks.lock(name, ttl=5.0), locks.lock(name, wait=0.2):
                    pass

    asyncio.run(main())


def test_asyncio_tasks_sharing_a_client_are_mutually_exclusive(deployment: Deployment, name: str) -> None:
    async def main() -> list[int]:
        locks = fencelock.aio.connect(deployment.url)
        inside = 0
        fences: list[int] = []

        async def task() -> None:
            nonlocal inside
            for _ in range(10):
                async with locks.lock(name, ttl=5.0, wait=20.0) as lease:
                    inside += 1
                    assert inside == 1
                    fences.append(lease.fence)
                    await asyncio.sleep(0.001)
                    inside -= 1

        await asyncio.gather(*(task() for _ in range(5)))
        await locks.aclose()
        return fences

    fences = asyncio.run(main())
    assert fences == sorted(fences)
    assert len(set(fences)) == 50


def _calls(deployment: Deployment, command: str) -> int:
    """How many times `command` ran, summed over the deployment's nodes (INFO commandstats)."""
    total = 0
    for raw in deployment.raws():
        stats: Any = raw.info("commandstats")
        per_node = stats.values() if deployment.kind == "cluster" else [stats]
        total += sum(int(node.get(f"cmdstat_{command}", {}).get("calls", 0)) for node in per_node)
    return total
