"""The ZooKeeper backend on a real standalone ZooKeeper that stays healthy: the API (fences that increase, waiters
served first come first served and woken by the release, TTLs, operators' calls), asyncio, URLs, TTLs and
sessions, and waits and TTLs counted on the client's clock. Every test has its own chroot (the `zk` fixture)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import fencelock
from fencelock.testing.proxy import Proxy
from fencelock.testing.timing import slack
from fencelock.testing.zookeeper import ZooKeeperDeployment, ZooKeeperServer, four_letter_word
from tests.conftest import until


def _received(zk: ZooKeeperDeployment) -> int:
    """Packets the server has received so far (the `srvr` four-letter word)."""
    for line in four_letter_word(zk.server.host, zk.server.port, "srvr").splitlines():
        if line.startswith("Received:"):
            return int(line.split(":")[1])
    raise AssertionError("srvr gave no Received: line")


@pytest.fixture
def locks(zk: ZooKeeperDeployment) -> Any:
    client = zk.connect()
    yield client
    client.close()


# -- the API --------------------------------------------------------------------------------------------------

def test_acquire_release_and_fences_that_increase(locks: fencelock.Locks, zk: ZooKeeperDeployment,
                                                  name: str) -> None:
    fences = []
    for _ in range(3):
        lease = locks.acquire(name, ttl=5.0, wait=0)
        assert zk.holder(name) == lease.token
        assert len(zk.nodes(name)) == 1
        assert 4.0 < lease.remaining() <= 5.0
        assert lease.token not in repr(lease)
        fences.append(lease.fence)
        lease.release()
        assert zk.nodes(name) == []
    assert fences == sorted(fences)
    assert len(set(fences)) == 3
    with zk.client() as client:
        assert client.get_children(zk._directory(name)) == []


def test_a_held_lock_refuses_wait_zero_and_the_refused_node_is_gone(locks: fencelock.Locks,
                                                                   zk: ZooKeeperDeployment, name: str) -> None:
    with locks.lock(name, ttl=5.0) as lease:
        with pytest.raises(fencelock.NotAcquired) as info:
            locks.acquire(name, wait=0)
        assert not isinstance(info.value, fencelock.AcquireTimeout)
        assert info.value.name == name
        assert zk.nodes(name) == [zk.nodes(name)[0]]
        assert zk.holder(name) == lease.token


def test_wait_is_one_deadline_and_a_waiter_that_gives_up_leaves_the_queue(locks: fencelock.Locks,
                                                                         zk: ZooKeeperDeployment,
                                                                         name: str) -> None:
    with locks.lock(name, ttl=10.0) as lease:
        started = time.monotonic()
        with pytest.raises(fencelock.AcquireTimeout):
            locks.acquire(name, ttl=5.0, wait=0.7)
        took = time.monotonic() - started
        assert 0.7 <= took < 0.7 + slack(0.5), took
        assert zk.nodes(name) == [n for n in zk.nodes(name) if n.startswith(lease.token)]
        assert len(zk.nodes(name)) == 1


def test_waiters_are_served_first_come_first_served(zk: ZooKeeperDeployment, name: str) -> None:
    holder_client = zk.connect()
    holder = holder_client.acquire(name, ttl=10.0, wait=0)
    order: list[int] = []
    clients = [zk.connect() for _ in range(4)]

    def wait_in_line(i: int) -> None:
        with clients[i].lock(name, ttl=10.0, wait=20.0):
            order.append(i)
            time.sleep(0.02)

    threads = []
    for i in range(4):
        thread = threading.Thread(target=wait_in_line, args=(i,))
        thread.start()
        threads.append(thread)
        until(lambda i=i: len(zk.nodes(name)) == i + 2, 10.0, f"waiter {i} queued")
    holder.release()
    for thread in threads:
        thread.join(30)
    assert order == [0, 1, 2, 3]
    for client in [holder_client, *clients]:
        client.close()


def test_a_waiter_is_woken_by_the_release_not_by_polling(locks: fencelock.Locks, zk: ZooKeeperDeployment,
                                                         name: str) -> None:
    holder = locks.acquire(name, ttl=10.0, wait=0)
    other = zk.connect()
    other.acquire(name + ":warm", ttl=5.0, wait=0).release()  # its session is up before we count
    before = _received(zk)
    timer = threading.Timer(0.6, holder.release)
    started = time.monotonic()
    timer.start()
    waiter = other.acquire(name, ttl=5.0, wait=5.0)
    woke = time.monotonic() - started
    timer.join()
    requests = _received(zk) - before
    assert 0.6 <= woke < 0.75, woke
    # create, list, watch; the release; list after the wake-up; a ping or two: polling would be dozens
    assert requests <= 12, f"{requests} requests while one waiter waited 0.6 s"
    waiter.release()
    other.close()


def test_a_crashed_holders_lock_is_free_after_its_ttl(locks: fencelock.Locks, zk: ZooKeeperDeployment,
                                                      name: str) -> None:
    """A lease neither extended nor released loses its node after its TTL, as a Redis key expires."""
    old = locks.acquire(name, ttl=0.4, wait=0)
    started = time.monotonic()
    new = locks.acquire(name, ttl=5.0, wait=5.0)
    took = time.monotonic() - started
    assert 0.35 <= took < 0.4 + slack(0.2), took
    assert new.fence > old.fence
    with pytest.raises(fencelock.LockLost):
        old.release()
    assert zk.holder(name) == new.token
    new.release()


def test_an_expired_lease_nobody_took_reports_loss_and_its_node_is_gone(locks: fencelock.Locks,
                                                                         zk: ZooKeeperDeployment,
                                                                         name: str) -> None:
    lease = locks.acquire(name, ttl=0.2, wait=0)
    time.sleep(0.35)
    assert zk.nodes(name) == []
    with pytest.raises(fencelock.LockLost, match="expired"):
        lease.release()


def test_extend_keeps_the_node_past_its_first_ttl(locks: fencelock.Locks, zk: ZooKeeperDeployment,
                                                  name: str) -> None:
    lease = locks.acquire(name, ttl=0.5, wait=0)
    time.sleep(0.3)
    lease.extend(ttl=2.0)
    time.sleep(0.5)
    assert zk.holder(name) == lease.token
    assert 1.0 < lease.remaining() < 2.0
    lease.release()


def test_a_retried_create_finds_its_own_node(locks: fencelock.Locks, zk: ZooKeeperDeployment, name: str) -> None:
    """The answer to a create is lost: the retry (same token) must find that node, not queue a second one."""
    holder = locks.acquire(name, ttl=10.0, wait=0)
    backend: Any = locks.backend
    token = "f" * 32
    first = backend.try_acquire(name, token, 5000, 0.0, False)
    assert not first.granted
    backend._queued.clear()  # as if the create's answer never came: the node is not known, only that it was sent
    backend._sent.add((name, token))
    second = backend.try_acquire(name, token, 5000, 0.0, False)
    assert not second.granted
    assert [n for n in zk.nodes(name) if n.startswith(token)] == [zk.nodes(name)[1]]
    backend.leave(name, token)
    assert zk.nodes(name) == [zk.nodes(name)[0]]
    holder.release()


def test_a_node_deleted_behind_our_back_is_a_lost_lease(locks: fencelock.Locks, zk: ZooKeeperDeployment,
                                                        name: str) -> None:
    told: list[str] = []
    with pytest.raises(fencelock.LockLost), locks.lock(name, ttl=1.5, wait=0,  # noqa: PT012
                                                       on_lost=lambda lease: told.append(lease.name)) as lease:
        time.sleep(0.1)
        zk.steal(name)
        stolen = time.monotonic()
        while not lease.lost:
            assert time.monotonic() - stolen < slack(1.0), "the loss was not noticed within one renewal interval"
            time.sleep(0.01)
        with pytest.raises(fencelock.LockLost):
            lease.ensure()
    assert told == [name]


def test_operators_see_status_list_and_force_release(locks: fencelock.Locks, zk: ZooKeeperDeployment,
                                                     name: str) -> None:
    backend: Any = locks.backend
    free = backend.status(name)
    assert (free.held, free.fence, free.queued) == (False, None, 0)
    lease = locks.acquire(name, ttl=10.0, wait=0)
    other = locks.acquire(name + "/other", ttl=10.0, wait=0)
    waiter = threading.Thread(target=lambda: _swallow(lambda: locks.acquire(name, ttl=5.0, wait=3.0)))
    waiter.start()
    until(lambda: len(zk.nodes(name)) == 2, 5.0, "the waiter queued")
    status = backend.status(name)
    assert (status.name, status.held, status.fence, status.queued) == (name, True, lease.fence, 1)
    assert 8.0 < status.remaining <= 10.0  # the TTL from the node's write time (one machine: one wall clock)
    assert [s.name for s in backend.scan("*")] == sorted([name, name + "/other"])
    assert [s.name for s in backend.scan(name + "/*")] == [name + "/other"]
    removed = backend.force_release(name)
    assert removed.held
    assert removed.fence == lease.fence
    waiter.join(10)
    with pytest.raises(fencelock.LockLost):
        lease.release()
    assert backend.force_release(name + ":never").held is False
    other.release()
    assert backend.status(name + "/other").fence == other.fence  # a free lock shows its last holder's fence


def _swallow(work: Callable[[], Any]) -> None:
    try:
        lease = work()
        lease.release()
    except fencelock.LockError:
        pass


# -- asyncio --------------------------------------------------------------------------------------------------

def test_asyncio_has_the_same_api_and_a_cancelled_waiter_leaves_no_node(zk: ZooKeeperDeployment,
                                                                        name: str) -> None:
    async def main() -> None:
        locks = zk.aconnect()
        try:
            lease = await locks.acquire(name, ttl=5.0, wait=0)
            assert zk.holder(name) == lease.token
            waiter = asyncio.ensure_future(locks.acquire(name, ttl=5.0, wait=10.0))
            deadline = time.monotonic() + 5
            while len(zk.nodes(name)) < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            deadline = time.monotonic() + 5
            while len(zk.nodes(name)) > 1:
                assert time.monotonic() < deadline, "the cancelled waiter's node stayed"
                await asyncio.sleep(0.01)
            with pytest.raises(fencelock.NotAcquired):
                await locks.acquire(name, wait=0)
            await lease.release()
            async with locks.lock(name, ttl=5.0, wait=0) as second:
                assert second.fence > lease.fence
            assert zk.nodes(name) == []
        finally:
            await locks.aclose()

    asyncio.run(main())


def test_asyncio_body_is_cancelled_when_the_node_is_deleted(zk: ZooKeeperDeployment, name: str) -> None:
    async def main() -> None:
        locks = zk.aconnect()
        try:
            with pytest.raises(fencelock.LockLost):  # noqa: PT012
                async with locks.lock(name, ttl=1.5, wait=0):
                    await asyncio.sleep(0.1)
                    zk.steal(name)
                    await asyncio.sleep(5.0)  # cancelled long before this ends
        finally:
            await locks.aclose()

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < slack(2.0)


# -- URLs, TTLs and sessions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["zookeeper://", "zookeeper:///chroot", "zookeeper://h:0", "zookeeper://h:99999",
                                 "zookeeper://h:2181,h:2181", "zookeeper://u:secret@h:2181",
                                 "zookeeper://h:2181/a//b", "zookeeper://h:2181/a/../b",
                                 "zookeeper://h:2181/zookeeper", "zookeeper://h:2181?timeout=0",
                                 "zookeeper://h:2181?timeout=x", "zookeeper://h:2181?nope=1", "zookeeper://h b"])
def test_bad_urls_are_value_errors_naming_the_url(url: str) -> None:
    with pytest.raises(ValueError, match=r"url .* not a valid ZooKeeper URL") as info:
        fencelock.connect(url)
    assert "secret" not in str(info.value)


def test_a_ttl_longer_than_the_servers_longest_session_is_refused(locks: fencelock.Locks, name: str) -> None:
    with pytest.raises(ValueError, match=r"ttl 10.*maxSessionTimeout.*lock") as info:
        locks.acquire(name, ttl=100.0, wait=0)
    assert "raise maxSessionTimeout in the server's zoo.cfg" in str(info.value)  # the setting to change


def test_sessions_are_shared_by_ttl_and_honour_the_negotiated_timeout(locks: fencelock.Locks, name: str) -> None:
    backend: Any = locks.backend
    for ttl in (0.05, 0.1, 0.15):  # all below the server's minimum session timeout (0.2 s): one session
        # (wait: a grant that took longer than a 50 ms TTL, connecting included, counts as refused)
        locks.acquire(f"{name}:{ttl}", ttl=ttl, wait=2.0).release()
    locks.acquire(name, ttl=30.0, wait=0).release()
    locks.acquire(name, ttl=29.0, wait=0).release()
    sessions = {id(s): s for s in backend._sessions.values()}.values()
    timeouts = sorted(s.negotiated_ms for s in sessions)
    assert timeouts[0] == 200  # learned: the server's minSessionTimeout
    assert timeouts[1:] == [32768]  # 29 s and 30 s share the step above them
    assert len(timeouts) <= 3  # 0.05 s asked for one step before the minimum was known


def test_missing_kazoo_names_the_extra() -> None:
    code = ("import sys; sys.modules['kazoo'] = None\n"
            "import fencelock\n"
            "try:\n    fencelock.connect('zookeeper://127.0.0.1:1')\n"
            "except ImportError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "pip install 'fencelock[zookeeper]'" in out.stdout


# -- the client's clock -----------------------------------------------------------------------------------------

class SetClock:
    """A fake monotonic clock: it stands still, or jumps `step` seconds at every read."""

    def __init__(self, step: float = 0.0) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_waits_and_held_ttls_count_on_the_clock_the_client_was_given(zk: ZooKeeperDeployment,
                                                                     name: str) -> None:
    from fencelock._sync.zookeeper import ZooKeeperBackend
    from fencelock._zk.url import parse_zookeeper_url

    clock = SetClock(step=1e6)  # every read is past the end of any wait below
    client = fencelock.Locks(ZooKeeperBackend(parse_zookeeper_url(zk.target), prefix=zk.prefix, clock=clock),
                             clock=clock)
    holder = zk.connect()
    try:
        with holder.lock(name, ttl=10.0) as lease:
            # An hour's wait by the real clock; by the client's, over at the first look at the queue.
            answers: list[Any] = []
            watcher = threading.Thread(target=lambda: answers.append(
                client.backend.try_acquire(name, "f" * 32, 10_000, 3600.0, False)), daemon=True)
            watcher.start()
            watcher.join(slack(30.0))
            assert answers, "the backend's wait went by the real clock, not the client's"
            assert not answers[0].granted
            assert zk.holder(name) == lease.token
            assert len(zk.nodes(name)) == 2  # the holder's, and the waiter's behind it
            client.backend.leave(name, "f" * 32)
            with pytest.raises(fencelock.AcquireTimeout):
                client.acquire(name, ttl=10.0, wait=3600.0)
            assert lease.held  # the holder kept the lock all along: the waiter gave up before any release
            assert len(zk.nodes(name)) == 1
        # A held node is deleted when its TTL ends by the client's clock: not while that clock stands still,
        # however long the real one runs; at once when it moves past the TTL.
        clock.step = 0.0
        mine = client.acquire(name, ttl=1.0, wait=0)
        time.sleep(2.5)
        assert zk.holder(name) == mine.token, "the held node's TTL ran by the real clock"
        clock.now += 10.0
        until(lambda: zk.nodes(name) == [], slack(5.0), "the held node is deleted once the client's clock "
              "passed its TTL")
    finally:
        client.close()
        holder.close()


def test_asyncio_a_waiter_cancelled_while_it_watches_leaves_the_queue_at_once(zk: ZooKeeperDeployment,
                                                                              name: str) -> None:
    """A cancelled waiter stops waiting for its predecessor's watch with the cancellation: its node leaves the queue
    then, not when the wait (up to `BLOCK_CAP`) would have ended."""
    from fencelock._async.zookeeper_queue import BLOCK_CAP

    async def main() -> None:
        holder, waiter = zk.aconnect(), zk.aconnect()
        try:
            held = await holder.acquire(name, ttl=30.0, wait=0)
            task = asyncio.ensure_future(waiter.acquire(name, ttl=30.0, wait=30.0))
            await asyncio.to_thread(until, lambda: zk.queued(name) == 1, 5.0, "the waiter queued")
            await asyncio.sleep(0.05)  # watching its predecessor
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(until, lambda: zk.queued(name) == 0, slack(1.0), "the cancelled waiter's node left")
            assert zk.holder(name) == held.token
            await held.release()
        finally:
            await waiter.aclose()
            await holder.aclose()

    assert slack(1.0) < BLOCK_CAP - 0.2  # else this test could not tell a cancelled wait from one that timed out
    asyncio.run(main())


def test_list_asks_for_every_idle_names_queue_at_once(zookeeper_server: ZooKeeperServer, zk: ZooKeeperDeployment,
                                                      name: str) -> None:
    """list() over many names that were locked once and are free now costs a few round trips, not one per name:
    through a link that delays every byte by 50 ms, 200 idle names took 200 listings in a row (10 s or more)."""

    async def fill() -> None:
        locks = zk.aconnect()
        try:
            for i in range(0, 200, 50):
                leases = await asyncio.gather(*(locks.acquire(f"{name}:{j:03d}", ttl=5.0, wait=0)
                                                for j in range(i, i + 50)))
                await asyncio.gather(*(lease.release() for lease in leases))
        finally:
            await locks.aclose()

    asyncio.run(fill())
    holder = zk.connect()
    with Proxy("127.0.0.1", zookeeper_server.port, delay=0.05) as proxy:
        operator = fencelock.connect(f"zookeeper://127.0.0.1:{proxy.port}{zk.chroot}")
        try:
            held = holder.acquire(f"{name}:held", ttl=60.0, wait=0)
            operator.status(f"{name}:000")  # the session is open
            started = time.monotonic()
            found = operator.list(f"{name}*")
            took = time.monotonic() - started
            held.release()
        finally:
            operator.close()
            holder.close()
    assert [(status.name, status.fence) for status in found] == [(f"{name}:held", held.fence)]
    assert took < slack(2.0)
