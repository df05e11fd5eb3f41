"""Probes from outside: ordinary use of the README's API under faults, each checking one promise with an
independent redis-py client that reads the servers directly."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisServer
from tests.conftest import _require_server_binary


@pytest.fixture
def server() -> Iterator[RedisServer]:
    _require_server_binary()
    with RedisServer(name="probe") as running:
        yield running


def _url(server: RedisServer, timeout: float = 0.5) -> str:
    return f"{server.url}?socket_timeout={timeout}"


def _pttl(raw: Any, name: str) -> int:
    return int(raw.pttl(redis_keys(name).lock))


# -- fair waiting: waiters that give up or are cancelled at random moments -------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fair_waiters_cancelled_or_timing_out_at_random_leave_the_queue_usable(server: RedisServer,
                                                                               seed: int) -> None:
    """README, fair waiting: "one that gives up or is cancelled leaves at once". Waiters of two clients, some
    cancelled and some timing out at random moments while the lock changes hands: no two hold at once, none is
    granted twice, and afterwards a newcomer gets the free lock at once (no entry left at the queue's head)."""
    name = f"probe:fair:{seed}"
    rng = random.Random(seed)
    raw: Any = server.client()

    async def main() -> None:
        one, two = fencelock.aio.connect(server.url), fencelock.aio.connect(server.url)
        inside: list[int] = []
        granted: list[int] = []
        overlaps: list[tuple[int, ...]] = []

        async def waiter(i: int, client: Any, wait: float) -> None:
            lease = await client.acquire(name, ttl=5.0, wait=wait, fair=True)
            granted.append(i)
            inside.append(i)
            if len(inside) > 1:
                overlaps.append(tuple(inside))
            try:
                await asyncio.sleep(rng.uniform(0.0, 0.03))
            finally:  # (a holder cancelled here still gives the lock back: only the waiters are under test)
                inside.remove(i)
                await asyncio.shield(lease.release())

        try:
            holder = await one.acquire(name, ttl=5.0, wait=0)
            tasks = []
            for i in range(24):
                client = one if i % 2 else two
                tasks.append(asyncio.ensure_future(waiter(i, client, rng.choice([0.05, 0.2, 0.6, 3.0, 3.0]))))
                await asyncio.sleep(rng.uniform(0.0, 0.02))
            await asyncio.sleep(0.1)
            await holder.release()
            for _ in range(10):  # cancellations at random moments while the lock is handed on
                await asyncio.sleep(rng.uniform(0.0, 0.08))
                live = [t for t in tasks if not t.done()]
                if live:
                    rng.choice(live).cancel()
            results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15.0)
            for result in results:
                assert result is None or isinstance(result, (asyncio.CancelledError, fencelock.NotAcquired)), \
                    repr(result)
            assert overlaps == []
            assert len(granted) == len(set(granted))
            # The lock is free now: a newcomer of a third client gets it at once, fair or not.
            third = fencelock.aio.connect(server.url)
            try:
                started = time.monotonic()
                lease = await third.acquire(name, ttl=5.0, wait=3.0, fair=True)
                took = time.monotonic() - started
                await lease.release()
                assert took < 0.5, f"a fair newcomer on a free lock waited {took:.2f} s"
            finally:
                await third.aclose()
        finally:
            await one.aclose()
            await two.aclose()

    asyncio.run(main())
    assert raw.get(redis_keys(name).lock) is None


# -- many threads of one sync client across a server restart ----------------------------------------------------

def test_threads_of_one_client_keep_working_across_a_server_restart(server: RedisServer) -> None:
    """One sync client shared by threads, each locking in a loop, while the server is killed and restarted
    empty: every error is a fencelock error, no thread hangs, every thread gets the lock again after the restart,
    and fences granted after it are above every fence granted before it."""
    locks = fencelock.connect(_url(server))
    stop = threading.Event()
    restarted = threading.Event()
    killing = threading.Event()
    errors: list[BaseException] = []
    before: list[int] = []
    after: dict[int, list[int]] = {i: [] for i in range(8)}

    def worker(i: int) -> None:
        name = "probe:threads:shared" if i % 2 else f"probe:threads:{i}"
        while not stop.is_set():
            started_after = restarted.is_set()  # (this acquire began once the server was back)
            try:
                with locks.lock(name, ttl=1.0, wait=2.0) as lease:
                    if started_after:
                        after[i].append(lease.fence)
                    elif not killing.is_set():  # (granted before the kill began)
                        before.append(lease.fence)
                    time.sleep(0.01)
            except fencelock.LockError:
                time.sleep(0.01)
            except BaseException as exc:  # any other error breaks the promise
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    killing.set()
    server.kill()
    time.sleep(0.3)
    server.restart()
    restarted.set()
    time.sleep(3.0)
    stop.set()
    for thread in threads:
        thread.join(timeout=10.0)
    hung = [t.name for t in threads if t.is_alive()]
    locks.close()
    assert errors == []
    assert hung == []
    assert all(after[i] for i in after), {i: len(f) for i, f in after.items()}
    assert before
    assert min(f for fs in after.values() for f in fs) > max(before)


# -- a paused server and the watchdog racing the caller's own calls ------------------------------------------------

def test_a_pause_past_the_ttl_reports_the_loss_once_while_extend_and_status_race_the_watchdog(
        server: RedisServer) -> None:
    """README: when a lease is lost "`on_lost(lease)` is called once". The server is stopped past the TTL while
    one thread extends and another asks status(): the callback runs exactly once, the lease is lost, and extend and
    release then say LockLost; the lock is free for the next holder."""
    name = "probe:pause:race"
    calls: list[float] = []
    locks = fencelock.connect(_url(server, 0.3))
    other = fencelock.connect(_url(server))
    lease = locks.acquire(name, ttl=1.0, wait=0, renew=True, on_lost=lambda _lease: calls.append(time.monotonic()))
    stop = threading.Event()
    odd: list[BaseException] = []

    def hammer(call: Any) -> None:
        while not stop.is_set():
            try:
                call()
            except fencelock.LockError:
                pass
            except BaseException as exc:
                odd.append(exc)
            time.sleep(0.005)

    threads = [threading.Thread(target=hammer, args=(lease.extend,), daemon=True),
               threading.Thread(target=hammer, args=(lambda: locks.status(name),), daemon=True)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    server.pause()
    time.sleep(1.6)
    server.resume()
    time.sleep(0.8)
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    assert odd == []
    assert lease.lost
    time.sleep(0.3)
    assert len(calls) == 1, calls
    with pytest.raises(fencelock.LockLost):
        lease.extend()
    with pytest.raises(fencelock.LockLost):
        lease.release()
    assert len(calls) == 1, calls
    nxt = other.acquire(name, ttl=2.0, wait=1.0)
    assert nxt.fence > lease.fence
    nxt.release()
    locks.close()
    other.close()


def test_a_pause_shorter_than_the_ttl_costs_a_renewed_lease_nothing(server: RedisServer) -> None:
    """A lease is lost only when "its validity runs out without a confirmed renewal": a server stopped for less
    than the TTL (but longer than a socket timeout), while the caller also extends, leaves the lease held, never
    reported lost, and claiming no more than the server keeps."""
    name = "probe:pause:short"
    calls: list[object] = []
    locks = fencelock.connect(_url(server, 0.3))
    raw: Any = server.client()
    lease = locks.acquire(name, ttl=4.0, wait=0, renew=True, on_lost=calls.append)
    server.pause()
    with pytest.raises(fencelock.BackendError):
        lease.extend()
    time.sleep(0.9)
    server.resume()
    lease.extend()
    time.sleep(1.6)  # renewals go on
    assert not lease.lost
    assert calls == []
    for _ in range(50):  # (a renewal confirmed between the two reads makes the pair say nothing: read again)
        first = lease.remaining()
        pttl = _pttl(raw, name)
        then = lease.remaining()
        if then <= first:
            assert then > 0
            assert then <= pttl / 1000.0, (then, pttl)
        time.sleep(0.01)
    lease.release()
    assert raw.get(redis_keys(name).lock) is None
    locks.close()


@pytest.mark.parametrize("renewed", [True, False])
def test_a_restart_without_persistence_while_held_is_reported_lost(server: RedisServer, renewed: bool) -> None:
    """A server that loses the key (restarted empty) "is noticed at the next renewal, up to TTL/3 later"; a
    lease not renewed says LockLost at its next extend or release. on_lost runs once; the next grant's fence is
    above the lost one."""
    name = f"probe:restart:{renewed}"
    calls: list[object] = []
    locks = fencelock.connect(_url(server))
    lease = locks.acquire(name, ttl=3.0, wait=0, renew=renewed, on_lost=calls.append)
    server.kill()
    server.restart()
    restarted = time.monotonic()
    if renewed:
        while not lease.lost and time.monotonic() - restarted < 3.0:
            time.sleep(0.02)
        assert lease.lost
        assert time.monotonic() - restarted < 1.0 + 0.6, "noticed later than TTL/3 after the restart"
        time.sleep(0.2)
        with pytest.raises(fencelock.LockLost):
            lease.release()
    else:
        with pytest.raises(fencelock.LockLost):
            lease.extend()
        assert lease.lost
    assert len(calls) == 1, calls
    nxt = locks.acquire(name, ttl=3.0, wait=0)
    assert nxt.fence > lease.fence
    nxt.release()
    locks.close()


# -- odd names (the probes on every backend are below) -------------------------------------------------------------

ODD_NAMES = ["nul\x00byte", "ünïcødé/🔒", "🔒" * 1024, "a b\nc\td", ".", "..", "*?[x]"]


def test_asyncio_a_pause_past_the_ttl_reports_the_loss_once_while_extend_and_status_race_the_watchdog(
        server: RedisServer) -> None:
    """The asyncio twin: tasks extend and ask status() while the server is stopped past the TTL; on_lost runs
    once, the `async with` body is cancelled with LockLost, and the next holder gets a higher fence."""
    name = "probe:pause:race:aio"
    calls: list[object] = []

    async def main() -> None:
        locks = fencelock.aio.connect(_url(server, 0.3))
        other = fencelock.aio.connect(_url(server))
        stop = asyncio.Event()
        odd: list[BaseException] = []
        fence = 0

        async def hammer(call: Any) -> None:
            while not stop.is_set():
                try:
                    await call()
                except fencelock.LockError:
                    pass
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:
                    odd.append(exc)
                await asyncio.sleep(0.005)

        async def hold() -> None:
            nonlocal fence
            async with locks.lock(name, ttl=1.0, wait=0, on_lost=calls.append) as lease:
                fence = lease.fence
                tasks = [asyncio.ensure_future(hammer(lease.extend)),
                         asyncio.ensure_future(hammer(lambda: locks.status(name)))]
                try:
                    await asyncio.sleep(0.2)
                    await asyncio.to_thread(server.pause)
                    await asyncio.sleep(1.6)
                finally:
                    await asyncio.to_thread(server.resume)
                    stop.set()
                    await asyncio.gather(*tasks, return_exceptions=True)

        try:
            with pytest.raises(fencelock.LockLost):
                await hold()
            assert odd == []
            await asyncio.sleep(0.5)
            assert len(calls) == 1, calls
            nxt = await other.acquire(name, ttl=2.0, wait=2.0)
            assert nxt.fence > fence
            await nxt.release()
        finally:
            await locks.aclose()
            await other.aclose()

    asyncio.run(main())


# -- etcd: the member a waiter talks to goes away while it waits ------------------------------------------------

def test_etcd_a_waiter_outlives_the_loss_of_a_member_and_gets_the_lock_when_it_is_released() -> None:
    """wait "is one deadline that covers every retry and every wake-up", and a member that is down costs a move to
    the next one: a waiter queued on three etcd members, whose first member is killed while it waits, gets the
    lock once the holder releases it, never while the holder holds it."""
    from fencelock.testing.etcd import EtcdCluster
    from tests.conftest import require_etcd_binary
    require_etcd_binary()
    name = "probe:etcd:waiter"
    with EtcdCluster(3) as cluster:
        holder_client = fencelock.connect(cluster.url)
        waiter_client = fencelock.connect(cluster.url)
        outcome: list[object] = []
        released_at: list[float] = []

        def wait_for_it() -> None:
            try:
                lease = waiter_client.acquire(name, ttl=4.0, wait=20.0)
            except BaseException as exc:
                outcome.append(exc)
                return
            outcome.append((time.monotonic(), lease))

        try:
            holder = holder_client.acquire(name, ttl=4.0, wait=0, renew=True)
            thread = threading.Thread(target=wait_for_it, daemon=True)
            thread.start()
            time.sleep(1.0)
            cluster.kill(0)
            time.sleep(3.0)
            assert outcome == []
            assert not holder.lost
            released_at.append(time.monotonic())
            holder.release()
            thread.join(timeout=18.0)
            assert not thread.is_alive()
            assert len(outcome) == 1
            got = outcome[0]
            assert isinstance(got, tuple), repr(got)
            at, lease = got
            assert at >= released_at[0]
            assert lease.fence > holder.fence
            assert at - released_at[0] < 5.0, f"granted {at - released_at[0]:.1f} s after the release"
            lease.release()
        finally:
            holder_client.close()
            waiter_client.close()


# -- odd names on every backend ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["redis", "cluster", "redlock", "etcd", "zookeeper"])
@pytest.mark.parametrize("odd", ODD_NAMES, ids=["nul", "unicode", "long-4-byte", "controls", "dot", "dotdot",
                                                "glob"])
def test_odd_names_work_on_every_backend(shared_deployments: Any, kind: str, odd: str) -> None:
    """Moving between backends "is a change of URL": the same odd names lock, show and release on each."""
    deployment = shared_deployments.get(kind)
    with deployment.connect() as locks:
        lease = locks.acquire(odd, ttl=5.0, wait=0)
        with pytest.raises(fencelock.NotAcquired):
            locks.acquire(odd, ttl=5.0, wait=0)
        status = locks.status(odd)
        assert status.held
        assert status.fence == lease.fence
        assert status.name == odd
        assert odd in [s.name for s in locks.list("*")]
        lease.release()
        assert not locks.status(odd).held


# -- ZooKeeper: the holder's session expires ---------------------------------------------------------------------

def test_zookeeper_a_holders_expired_session_is_a_loss_told_once_and_the_client_works_on(zk: Any) -> None:
    """The server ends the holder's session (an expiry): its node goes, so the lease is lost "the moment" the
    client hears of it, on_lost runs once, another client gets a higher fence, and the first client locks again
    in a new session."""
    from tests.zookeeper.test_zookeeper_retries import _expire
    name = "probe:zk:expired"
    calls: list[object] = []
    holder, other = zk.connect(), zk.connect()
    try:
        lease = holder.acquire(name, ttl=6.0, wait=0, renew=True, on_lost=calls.append)
        _expire(zk, holder)
        expired = time.monotonic()
        while not lease.lost and time.monotonic() - expired < 4.0:
            time.sleep(0.02)
        assert lease.lost, "the expiry was not noticed within 4 s (a third of its TTL is 2 s)"
        nxt = other.acquire(name, ttl=6.0, wait=2.0)
        assert nxt.fence > lease.fence
        with pytest.raises(fencelock.LockLost):
            lease.release()
        time.sleep(0.2)
        assert len(calls) == 1, calls
        nxt.release()
        again = holder.acquire(name, ttl=6.0, wait=2.0)
        assert again.fence > nxt.fence
        again.release()
    finally:
        holder.close()
        other.close()


# -- a lease outlives its client's close() -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["cluster", "redlock", "etcd"])
@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_lease_granted_before_close_can_still_be_extended_and_released(shared_deployments: Any, kind: str,
                                                                         front: str) -> None:
    """Decision 2026-12-03-client-lifetime: "Leases it granted before may still be extended and released" (the
    README: leases still held expire by TTL; a release is then the holder's own choice). After close(), extend
    and release work and the server holds no key of it: on every backend, not only on a single Redis."""
    deployment = shared_deployments.get(kind)
    name = f"probe:closed:{kind}:{front}"
    if front == "sync":
        locks = deployment.connect()
        lease = locks.acquire(name, ttl=5.0, wait=0)
        locks.close()
        lease.extend()
        assert deployment.holder(name) == lease.token
        lease.release()
    else:
        async def main() -> None:
            locks = deployment.aconnect()
            lease = await locks.acquire(name, ttl=5.0, wait=0)
            await locks.aclose()
            await lease.extend()
            assert deployment.holder(name) == lease.token
            await lease.release()

        asyncio.run(main())
    assert deployment.holder(name) is None


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_zookeeper_a_lease_whose_node_close_deleted_claims_no_validity(zk: Any, front: str) -> None:
    """ZooKeeper's close() ends the sessions and "the server deletes every node they still hold at once"
    (docs/design/zookeeper.md). The next holder can then be granted at once, so the old lease must no longer claim
    validity: never two leases that both claim it (`held`, `ensure()`, `remaining()`)."""
    name = f"probe:zk:closed:{front}"
    calls: list[object] = []
    other = zk.connect()
    try:
        if front == "sync":
            locks = zk.connect()
            lease = locks.acquire(name, ttl=10.0, wait=0, on_lost=calls.append)
            locks.close()
        else:
            async def main() -> Any:
                alocks = zk.aconnect()
                alease = await alocks.acquire(name, ttl=10.0, wait=0, on_lost=calls.append)
                await alocks.aclose()
                return alease

            lease = asyncio.run(main())
        nxt = other.acquire(name, ttl=10.0, wait=2.0)
        both = lease.held and nxt.held
        assert not both, f"two leases claim validity: {lease!r} and {nxt!r}"
        with pytest.raises(fencelock.LockLost):
            lease.ensure()
        assert lease.remaining() == 0.0
        assert calls == [lease]
        nxt.release()
    finally:
        other.close()


@pytest.mark.parametrize("kind", ["cluster", "redlock"])
@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_lease_extended_and_released_after_its_client_closed_leaves_no_connection_open(
        shared_deployments: Any, kind: str, front: str) -> None:
    """Decision 2026-12-04-close-ends-acquires: a lease may be released or extended after close(), and the
    connections that took are closed again after the request (tested on one Redis by tests/redis/
    test_close_inflight.py): on a Cluster and on Redlock too, never left open (asyncio: an unclosed transport)."""
    deployment = shared_deployments.get(kind)
    label = f"pr{kind[:4]}{front[:4]}"
    name = f"probe:closed:conns:{kind}:{front}"

    def with_label(url: str) -> str:
        return url + ("&" if "?" in url else "?") + f"client_name={label}"

    target = deployment.target
    urls: Any = [with_label(u) for u in target] if isinstance(target, list) else with_label(target)

    def ours() -> int:
        return sum(1 for raw in deployment.raws() for c in raw.client_list() if c.get("name") == label)

    if front == "sync":
        locks = fencelock.connect(urls)
        lease = locks.acquire(name, ttl=5.0, wait=0)
        locks.close()
        lease.extend()
        lease.release()
    else:
        async def main() -> None:
            alocks = fencelock.aio.connect(urls)
            alease = await alocks.acquire(name, ttl=5.0, wait=0)
            await alocks.aclose()
            await alease.extend()
            await alease.release()

        asyncio.run(main())
    assert deployment.holder(name) is None
    time.sleep(0.1)
    assert ours() == 0


def test_zookeeper_asyncio_a_lock_body_is_cancelled_with_lock_lost_when_another_task_closes_its_client(
        zk: Any) -> None:
    """asyncio: "the body of `async with locks.lock(...)` is cancelled at once and the cancellation surfaces as
    LockLost" when the lease is lost; a close() by another task (a shutdown) loses it on ZooKeeper. The body ends
    promptly with LockLost, and the exit never hangs on the closed client."""
    name = "probe:zk:closed:body"

    async def main() -> None:
        locks = zk.aconnect()
        entered = asyncio.Event()

        async def body() -> None:
            async with locks.lock(name, ttl=10.0, wait=0):
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.ensure_future(body())
        await entered.wait()
        await locks.aclose()
        started = time.monotonic()
        with pytest.raises(fencelock.LockLost):
            await asyncio.wait_for(task, 5.0)
        assert time.monotonic() - started < 2.0

    asyncio.run(main())
    assert zk.holder(name) is None


def test_fair_threads_timing_out_at_random_leave_the_queue_usable(server: RedisServer) -> None:
    """The threaded twin of the fair churn: threads of two sync clients queue fairly with random waits while the
    lock changes hands; none is granted twice or beside another, and afterwards a newcomer gets the free lock at
    once."""
    name = "probe:fair:threads"
    rng = random.Random(7)
    one, two = fencelock.connect(server.url), fencelock.connect(server.url)
    guard = threading.Lock()
    inside: list[int] = []
    granted: list[int] = []
    overlaps: list[tuple[int, ...]] = []
    odd: list[BaseException] = []
    waits = [rng.choice([0.05, 0.2, 0.6, 3.0]) for _ in range(20)]
    holds = [rng.uniform(0.0, 0.03) for _ in range(20)]

    def waiter(i: int) -> None:
        try:
            with (one if i % 2 else two).lock(name, ttl=5.0, wait=waits[i], fair=True):
                with guard:
                    granted.append(i)
                    inside.append(i)
                    if len(inside) > 1:
                        overlaps.append(tuple(inside))
                time.sleep(holds[i])
                with guard:
                    inside.remove(i)
        except fencelock.NotAcquired:
            pass
        except BaseException as exc:
            odd.append(exc)

    try:
        holder = one.acquire(name, ttl=5.0, wait=0)
        threads = [threading.Thread(target=waiter, args=(i,), daemon=True) for i in range(20)]
        for thread in threads:
            thread.start()
            time.sleep(rng.uniform(0.0, 0.02))
        time.sleep(0.1)
        holder.release()
        for thread in threads:
            thread.join(timeout=15.0)
        assert not any(t.is_alive() for t in threads)
        assert odd == []
        assert overlaps == []
        assert len(granted) == len(set(granted))
        with fencelock.connect(server.url) as third:
            started = time.monotonic()
            third.acquire(name, ttl=5.0, wait=3.0, fair=True).release()
            took = time.monotonic() - started
        assert took < 0.5, f"a fair newcomer on a free lock waited {took:.2f} s"
    finally:
        one.close()
        two.close()
