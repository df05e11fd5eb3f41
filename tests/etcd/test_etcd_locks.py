"""The etcd lock on the shared member: keys and leases, fences, waiting and FIFO hand-off, renewal and extension,
and the operators' methods (status, list, force release)."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from typing import Any

import pytest

import fencelock
from fencelock._etcd.rules import BLOCK_CAP
from fencelock.testing.etcd import EtcdDeployment, EtcdServer
from fencelock.testing.timing import slack
from tests.conftest import until
from tests.etcd.helpers import keys_of, lease_ttl, leases_of, queued


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> EtcdDeployment:
    return EtcdDeployment(etcd_server)


@pytest.fixture
def locks(etcd_server: EtcdServer) -> Any:
    client = fencelock.connect(etcd_server.url)
    yield client
    client.close()


# ------------------------------------------------------------------------------------------------ the basics


def test_a_lease_is_one_key_on_its_own_lease_and_the_fence_is_its_create_revision(
        etcd: EtcdDeployment, etcd_server: EtcdServer, name: str) -> None:
    locks = fencelock.connect(etcd_server.url)
    before = leases_of(etcd_server)
    asked = time.monotonic()
    lease = locks.acquire(name, ttl=5.0, wait=0)
    remaining, now = lease.remaining(), time.monotonic()
    [kv] = keys_of(etcd_server, name)
    assert base64.b64decode(kv["value"]).decode() == lease.token == etcd.holder(name)
    assert int(kv["create_revision"]) == lease.fence
    assert lease_ttl(etcd_server, int(kv["lease"])) in (4, 5)  # whole seconds; 5 granted
    assert leases_of(etcd_server) - before == {int(kv["lease"])}
    # validity: the TTL asked for, never the rounded-up lease, counted from before the request
    assert asked + 5.0 - 0.052 - now <= remaining <= 5.0 - 0.052
    lease.release()
    assert keys_of(etcd_server, name) == []
    lease.release()  # a second release does nothing
    # The client keeps the released lease, without its key, for its next acquisition of that TTL...
    answer = etcd_server.request("/v3/lease/timetolive", {"ID": int(kv["lease"]), "keys": True})
    assert int(answer["TTL"]) > 0
    assert "keys" not in answer
    again = locks.acquire(name + ":again", ttl=5.0, wait=0)
    [kv2] = keys_of(etcd_server, name + ":again")
    assert kv2["lease"] == kv["lease"]
    again.release()
    # ... and ends it when it is closed.
    locks.close()
    assert lease_ttl(etcd_server, int(kv["lease"])) == -1
    assert leases_of(etcd_server) - before == set()


def test_fences_increase_with_every_grant(locks: fencelock.Locks, name: str) -> None:
    fences = []
    for _ in range(20):
        with locks.lock(name, ttl=5.0, wait=0) as lease:
            fences.append(lease.fence)
    assert fences == sorted(set(fences))


def test_a_held_lock_is_refused_with_wait_zero_and_the_attempt_leaves_nothing(
        locks: fencelock.Locks, etcd_server: EtcdServer, name: str) -> None:
    with locks.lock(name, ttl=5.0) as lease:
        before = leases_of(etcd_server)
        with pytest.raises(fencelock.NotAcquired) as info:
            locks.acquire(name, wait=0)
        assert not isinstance(info.value, fencelock.AcquireTimeout)
        assert [base64.b64decode(kv["value"]).decode() for kv in keys_of(etcd_server, name)] == [lease.token]
        assert leases_of(etcd_server) - before == set()


def test_wait_is_one_deadline_and_giving_up_revokes_the_waiters_lease(
        locks: fencelock.Locks, etcd_server: EtcdServer, name: str) -> None:
    with locks.lock(name, ttl=10.0):
        before = leases_of(etcd_server)
        started = time.monotonic()
        with pytest.raises(fencelock.AcquireTimeout):
            locks.acquire(name, ttl=10.0, wait=1.0)
        took = time.monotonic() - started
        assert 1.0 <= took < 1.0 + slack(0.6)
        assert len(keys_of(etcd_server, name)) == 1
        assert leases_of(etcd_server) - before == set()


def test_a_waiter_whose_key_vanished_while_it_waited_is_not_granted(locks: fencelock.Locks,
                                                                     etcd_server: EtcdServer, name: str) -> None:
    """Jepsen's etcd 3.4.3 finding: a waiter must look at its own key after its wait, not assume it won."""
    backend: Any = locks.backend
    holder = locks.acquire(name, ttl=10.0)
    got: dict[str, fencelock.Lease] = {}

    def waiter(tag: str) -> None:
        got[tag] = locks.acquire(name, ttl=10.0, wait=20.0)

    threads = {}
    for tag, count in (("w", 1), ("x", 2)):
        threads[tag] = threading.Thread(target=waiter, args=(tag,))
        threads[tag].start()
        until(lambda count=count: backend.status(name).queued == count, 5.0, f"waiter {tag} queued")
    w_key = keys_of(etcd_server, name)[1]["key"]
    etcd_server.request("/v3/kv/deleterange", {"key": w_key})  # w's key goes while w watches the holder's
    holder.release()
    threads["x"].join(10)
    assert "x" in got
    time.sleep(0.5)
    assert "w" not in got, "a waiter whose key had gone was granted the lock beside the real holder"
    got["x"].release()
    threads["w"].join(10)
    assert got["w"].fence > got["x"].fence  # w queued again, behind x
    got["w"].release()


def test_waiters_are_served_in_arrival_order(locks: fencelock.Locks, name: str) -> None:
    holder = locks.acquire(name, ttl=10.0)
    order: list[int] = []
    fences: list[int] = []
    errors: list[BaseException] = []

    def waiter(i: int) -> None:
        try:
            with locks.lock(name, ttl=10.0, wait=20.0) as lease:
                order.append(i)
                fences.append(lease.fence)
                time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    threads = []
    for i in range(4):
        thread = threading.Thread(target=waiter, args=(i,))
        thread.start()
        threads.append(thread)
        until(lambda i=i: locks.backend.status(name).queued == i + 1, 5.0, f"waiter {i} queued")
    holder.release()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert order == [0, 1, 2, 3]
    assert fences == sorted(fences)
    assert fences[0] > holder.fence


def test_a_release_wakes_the_waiter_at_once_not_at_its_next_poll(locks: fencelock.Locks, name: str) -> None:
    holder = locks.acquire(name, ttl=30.0)
    got: list[float] = []
    thread = threading.Thread(target=lambda: got.append(time.monotonic()) if locks.acquire(name, ttl=30.0, wait=20)
                              else None)
    thread.start()
    until(lambda: locks.backend.status(name).queued == 1, 5.0, "the waiter queued")
    time.sleep(BLOCK_CAP / 2)  # half-way through its watch: a poller would look again only at its end
    released_at = time.monotonic()
    holder.release()
    thread.join(10)
    assert got, "the waiter never got the lock"
    assert got[0] - released_at < BLOCK_CAP / 4


def test_a_cancelled_asyncio_waiter_leaves_no_key_and_no_lease(etcd_server: EtcdServer, name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(etcd_server.url)
        try:
            holder = await locks.acquire(name, ttl=30.0)
            before = leases_of(etcd_server)
            task = asyncio.ensure_future(locks.acquire(name, ttl=30.0, wait=20.0))
            await queued(locks, name, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The request on the wire runs to its end (at most one watch), then the waiter leaves.
            deadline = time.monotonic() + BLOCK_CAP + 3.0
            while len(keys_of(etcd_server, name)) != 1 or leases_of(etcd_server) - before:
                assert time.monotonic() < deadline, "the cancelled waiter's key or lease is still there"
                await asyncio.sleep(0.05)
            assert (await locks.backend.status(name)).queued == 0
            await holder.release()
        finally:
            await locks.aclose()

    asyncio.run(main())


def test_asyncio_hand_off_in_arrival_order(etcd_server: EtcdServer, name: str) -> None:
    async def main() -> list[int]:
        locks = fencelock.aio.connect(etcd_server.url)
        order: list[int] = []
        try:
            holder = await locks.acquire(name, ttl=10.0)

            async def waiter(i: int) -> None:
                async with locks.lock(name, ttl=10.0, wait=20.0):
                    order.append(i)

            tasks = []
            for i in range(3):
                tasks.append(asyncio.ensure_future(waiter(i)))
                await queued(locks, name, i + 1)
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
        finally:
            await locks.aclose()
        return order

    assert asyncio.run(main()) == [0, 1, 2]


# ------------------------------------------------------------------------------------------------ liveness


def test_a_deleted_key_is_noticed_as_lost(locks: fencelock.Locks, etcd: EtcdDeployment, name: str) -> None:
    lost: list[fencelock.Lease] = []
    context = locks.lock(name, ttl=3.0, on_lost=lost.append)
    lease = context.__enter__()
    etcd.steal(name)
    until(lambda: lease.lost, 3.0, "the renewal noticed the stolen key")
    with pytest.raises(fencelock.LockLost):
        context.__exit__(None, None, None)
    assert lost == [lease]


def test_a_lease_the_server_no_longer_has_cannot_be_extended(locks: fencelock.Locks, etcd_server: EtcdServer,
                                                             name: str) -> None:
    lease = locks.acquire(name, ttl=1.0)
    until(lambda: keys_of(etcd_server, name) == [], 5.0, "the lease expired on the server")
    with pytest.raises(fencelock.LockLost):
        lease.extend()
    with pytest.raises(fencelock.LockLost):
        lease.release()


def test_renewal_keeps_a_short_lease_alive(locks: fencelock.Locks, etcd: EtcdDeployment, name: str) -> None:
    with locks.lock(name, ttl=1.0) as lease:
        time.sleep(3.0)
        lease.ensure()
        assert etcd.holder(name) == lease.token


def test_the_watchdog_renews_many_leases_in_few_requests(etcd_server: EtcdServer, name: str) -> None:
    locks = fencelock.connect(etcd_server.url)
    backend: Any = locks.backend
    try:
        leases = [locks.acquire(f"{name}:{i}", ttl=3.0, renew=True) for i in range(200)]
        time.sleep(4.0)  # past the TTL: only renewals keep them
        assert not [lease for lease in leases if lease.lost]
        renewed = locks.watchdog.renewals
        assert renewed >= 200
        assert backend.renewal_requests * 10 <= renewed  # batched: one keep-alive request carries many leases
        # One batch of all 200 at once: the gateway answers long keep-alive requests only in part (a prefix);
        # what it left unanswered is sent again, and never counts as lost.
        sent = backend.renewal_requests
        batch = [(lease.name, lease.token, lease.fence, 3000) for lease in leases]
        assert backend.extend_many(batch) == [True] * 200
        assert backend.renewal_requests - sent >= 200 // 32
        for lease in leases:
            lease.release()
    finally:
        locks.close()


def test_extending_past_the_lease_ttl_moves_the_key_to_a_longer_lease_and_keeps_the_fence(
        locks: fencelock.Locks, etcd_server: EtcdServer, name: str) -> None:
    lease = locks.acquire(name, ttl=2.0)
    [before] = keys_of(etcd_server, name)
    lease.extend(ttl=20.0)
    [after] = keys_of(etcd_server, name)
    assert after["create_revision"] == before["create_revision"] == str(lease.fence)
    assert after["lease"] != before["lease"]
    assert lease_ttl(etcd_server, int(before["lease"])) == -1
    assert lease_ttl(etcd_server, int(after["lease"])) >= 18
    assert lease.remaining() > 19.0
    lease.release()
    assert keys_of(etcd_server, name) == []


def test_extending_to_a_far_shorter_ttl_moves_the_key_to_a_short_lease_and_keeps_the_fence(
        locks: fencelock.Locks, etcd_server: EtcdServer, name: str) -> None:
    """A holder that stops renewing after extend(ttl=2) must not leave its key for the 20 s of its first lease."""
    lease = locks.acquire(name, ttl=20.0)
    [before] = keys_of(etcd_server, name)
    lease.extend(ttl=2.0)
    [after] = keys_of(etcd_server, name)
    assert after["create_revision"] == before["create_revision"] == str(lease.fence)
    assert lease_ttl(etcd_server, int(before["lease"])) == -1
    assert 0 < lease_ttl(etcd_server, int(after["lease"])) <= 2
    assert lease.remaining() <= 2.0
    lease.extend(ttl=5.0)  # longer than the 2 s lease: it moves up again
    [again] = keys_of(etcd_server, name)
    assert 2 < lease_ttl(etcd_server, int(again["lease"])) <= 5
    lease.extend(ttl=4.0)  # shorter, but within OVERHANG_MAX of it: the key stays on its lease
    assert keys_of(etcd_server, name)[0]["lease"] == again["lease"]
    lease.release()
    assert keys_of(etcd_server, name) == []


# ------------------------------------------------------------------------------------------------ operators


def test_status_scan_and_force_release(locks: fencelock.Locks, etcd_server: EtcdServer, name: str) -> None:
    backend: Any = locks.backend
    free = backend.status(name)
    assert (free.held, free.fence, free.queued) == (False, None, 0)
    holder = locks.acquire(name, ttl=10.0)
    other = locks.acquire(name + ":other", ttl=10.0)
    got: list[fencelock.Lease] = []
    thread = threading.Thread(target=lambda: got.append(locks.acquire(name, ttl=10.0, wait=10.0)))
    thread.start()
    until(lambda: backend.status(name).queued == 1, 5.0, "the waiter queued")
    status = backend.status(name)
    assert (status.held, status.fence, status.queued) == (True, holder.fence, 1)
    assert 8.0 <= status.remaining <= 10.0
    listed = backend.scan(name + "*")
    assert [s.name for s in listed] == [name, name + ":other"]
    assert [s.fence for s in listed] == [holder.fence, other.fence]
    assert backend.scan("nothing-like-this-*") == []
    removed = backend.force_release(name)
    assert (removed.held, removed.fence, removed.queued) == (True, holder.fence, 1)
    thread.join(10)
    assert got
    assert got[0].fence > holder.fence
    with pytest.raises(fencelock.LockLost):
        holder.release()
    got[0].release()
    other.release()
    assert backend.force_release(name).held is False


# ------------------------------------------------------------------------------------------------ the clock


class JumpingClock:
    """A fake monotonic clock: each read is `step` seconds after the one before."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_waits_count_on_the_clock_the_client_was_given(etcd_server: EtcdServer, name: str) -> None:
    from fencelock._etcd.url import parse_etcd_url
    from fencelock._sync.etcd import EtcdBackend

    clock = JumpingClock(1e6)  # every read is past the end of any wait below
    waiter = fencelock.Locks(EtcdBackend(parse_etcd_url(etcd_server.url), prefix="fencelock", clock=clock),
                             clock=clock)
    holder = fencelock.connect(etcd_server.url)
    try:
        with holder.lock(name, ttl=30.0) as lease:
            # An hour's wait by the real clock; by the client's, over at the first look after joining the queue.
            answers: list[Any] = []
            token = "f" * 32
            watcher = threading.Thread(target=lambda: answers.append(
                waiter.backend.try_acquire(name, token, 30_000, 3600.0, False)), daemon=True)
            watcher.start()
            watcher.join(slack(30.0))
            assert answers, "the backend's wait went by the real clock, not the client's"
            assert not answers[0].granted
            assert [kv["value"] for kv in keys_of(etcd_server, name)] == [
                base64.b64encode(lease.token.encode()).decode(), base64.b64encode(token.encode()).decode()]
            waiter.backend.leave(name, token)
            with pytest.raises(fencelock.AcquireTimeout):
                waiter.acquire(name, ttl=30.0, wait=3600.0)  # the client gives up by its clock, and leaves
            assert lease.held  # the holder kept the lock all along: the waiter gave up before any release
            assert len(keys_of(etcd_server, name)) == 1
    finally:
        waiter.close()
        holder.close()


def test_asyncio_a_waiter_cancelled_while_it_watches_leaves_the_queue_at_once(etcd: EtcdDeployment,
                                                                              name: str) -> None:
    """A cancelled waiter's watch ends with the cancellation: its key leaves the queue then, not when the watch's
    block (up to `BLOCK_CAP`) would have ended, and a release meanwhile never grants it the lock."""

    async def main() -> None:
        holder, waiter = etcd.aconnect(), etcd.aconnect()
        try:
            held = await holder.acquire(name, ttl=30.0, wait=0)
            task = asyncio.ensure_future(waiter.acquire(name, ttl=30.0, wait=30.0))
            await asyncio.to_thread(until, lambda: etcd.queued(name) == 1, 5.0, "the waiter queued")
            await asyncio.sleep(0.05)  # watching its predecessor
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(until, lambda: etcd.queued(name) == 0, slack(1.0), "the waiter's key left")
            assert etcd.holder(name) == held.token
            await held.release()
        finally:
            await waiter.aclose()
            await holder.aclose()

    assert slack(1.0) < BLOCK_CAP - 0.2  # else this test could not tell a cancelled watch from one that timed out
    asyncio.run(main())


def test_asyncio_an_extend_queued_behind_another_never_goes_out_after_the_release_started(
        etcd: EtcdDeployment, name: str) -> None:
    """extend(), release(), extend() at once: the second extend waits for the first, then finds the lease being
    released. It must say so, not send its extend, find the key gone and report the lease lost ("gone, or taken by
    another holder") while its own holder released it."""

    async def main() -> None:
        locks = etcd.aconnect()
        lost: list[str] = []
        try:
            for i in range(3):
                lease = await locks.acquire(f"{name}:{i}", ttl=5.0, wait=0, on_lost=lambda gone: lost.append(gone.name))
                first, released, second = await asyncio.gather(lease.extend(), lease.release(), lease.extend(),
                                                               return_exceptions=True)
                assert first is None
                assert released is None
                assert isinstance(second, fencelock.LockLost)
                assert "released" in str(second)
                assert etcd.holder(f"{name}:{i}") is None
        finally:
            await locks.aclose()
        assert lost == []

    asyncio.run(main())
