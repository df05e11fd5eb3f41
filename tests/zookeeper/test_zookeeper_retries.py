"""Transient faults on a real ZooKeeper, and requests whose answer never came: a first connection reaches a member
that answers, within the URL's timeout, when others hang; an acquire with a wait outlasts a restart, or its own
session expiring, and leaves no node behind; a release sent again after one that went through is a release.
Members that hang are `Proxy`s that accept and never answer; an independent kazoo client reads the server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock.testing.proxy import Proxy
from fencelock.testing.timing import slack
from fencelock.testing.zookeeper import ZooKeeperDeployment, ZooKeeperServer
from tests.conftest import until


@contextlib.contextmanager
def _hung(n: int, server: ZooKeeperServer) -> Iterator[list[Proxy]]:
    """`n` members that accept connections and never answer (a frozen or hung host)."""
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(Proxy("127.0.0.1", server.port)) for _ in range(n)]
        for proxy in proxies:
            proxy.stall()
        yield proxies


def _expire(zk: ZooKeeperDeployment, locks: fencelock.Locks) -> None:
    """End every session of `locks` on the server, as an expiry does: a client that takes over a session's id
    and closes it (kazoo's own test harness does the same)."""
    from kazoo.client import KazooClient
    backend: Any = locks.backend
    for session in {id(s): s for s in backend._sessions.values()}.values():
        client_id = session.client.client_id
        assert client_id is not None
        taker = KazooClient(hosts=zk.hosts, client_id=client_id, timeout=10.0)
        taker.start(timeout=10)
        taker.stop()
        taker.close()


# -- the first connection --------------------------------------------------------------------------------------

def test_a_first_connection_reaches_the_one_member_that_answers_within_the_timeout(
        zookeeper_server: ZooKeeperServer, zk: ZooKeeperDeployment, name: str) -> None:
    """Three of four members hang; kazoo tries them in a random order. Each gets its share of the timeout, so the
    one that answers is reached, and the acquire granted, within the timeout, whatever the order (before: a hung
    member tried first held the session for the whole timeout, and the acquire failed as it gave up)."""
    timeout = 1.0
    with _hung(3, zookeeper_server) as hung:
        hosts = ",".join(f"127.0.0.1:{proxy.port}" for proxy in hung) + f",127.0.0.1:{zookeeper_server.port}"
        used = 0
        while used < 4 or (sum(proxy.connections for proxy in hung) == 0 and used < 16):
            # A fresh client each: kazoo draws a new order (at least 4 of them, until one met a hung member: 4 may
            # all draw the live member first, one run in 256).
            i, used = used, used + 1
            locks = fencelock.connect(f"zookeeper://{hosts}{zk.chroot}?timeout={timeout}")
            try:
                started = time.monotonic()
                locks.acquire(f"{name}:{i}", ttl=5.0, wait=0).release()
                assert time.monotonic() - started < timeout + slack(0.3)
            finally:
                locks.close()
        assert sum(proxy.connections for proxy in hung) > 0  # the hung members were tried too
    assert all(zk.nodes(f"{name}:{i}") == [] for i in range(used))


# -- an acquire that waits outlasts transient faults -------------------------------------------------------------

def test_an_acquire_with_a_wait_outlasts_a_server_restart(own_zk: ZooKeeperDeployment, name: str) -> None:
    """The probe: the session was suspended when acquire(wait=10) began, and it failed at once."""
    locks = own_zk.connect()
    try:
        locks.acquire(f"{name}:warm", ttl=5.0, wait=0).release()  # the session for ttl 5 is open
        backend: Any = locks.backend
        session = next(iter(backend._sessions.values()))
        own_zk.server.kill()
        until(lambda: not session.connected, 5.0, "kazoo saw the connection drop")
        def restart_soon() -> None:
            time.sleep(0.5)
            own_zk.server.restart()

        restart = threading.Thread(target=restart_soon)
        restart.start()
        lease = locks.acquire(name, ttl=5.0, wait=15.0)
        restart.join()
        assert own_zk.holder(name) == lease.token
        assert len(own_zk.nodes(name)) == 1  # one node: the tries before the restart left none
        lease.release()
        assert own_zk.nodes(name) == []
    finally:
        locks.close()


def test_a_waiter_whose_session_expired_queues_again_in_a_new_one_and_gets_the_lock(zk: ZooKeeperDeployment,
                                                                                  name: str) -> None:
    """The probe: a waiter paused past its session failed with SessionExpiredError, and its client's next
    acquire with "the session is lost: not queueing now"."""
    holder, waiting = zk.connect(), zk.connect()
    outcome: list[Any] = []
    try:
        lease = holder.acquire(name, ttl=10.0, wait=0)

        def wait_for_it() -> None:
            try:
                outcome.append(waiting.acquire(name, ttl=2.0, wait=20.0))
            except fencelock.LockError as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        until(lambda: len(zk.nodes(name)) == 2, 5.0, "the waiter queued")
        first = zk.nodes(name)[1]
        _expire(zk, waiting)  # the server ends the waiter's session: its node goes with it
        until(lambda: len(zk.nodes(name)) == 2 and zk.nodes(name)[1] != first, 10.0,
              "the waiter queued again, in a new session")
        assert not outcome
        lease.release()
        waiter.join(10.0)
        assert outcome, "the waiter never returned"
        assert isinstance(outcome[0], fencelock.Lease), outcome[0]
        assert outcome[0].fence > lease.fence
        assert zk.nodes(name) == [zk.nodes(name)[0]]  # the waiter's node alone: nothing left of its first one
        outcome[0].release()
        waiting.acquire(f"{name}:after", ttl=2.0, wait=5.0).release()  # the client works on
        assert zk.nodes(name) == []
    finally:
        waiting.close()
        holder.close()


# -- a release sent again ---------------------------------------------------------------------------------------

def test_asyncio_a_release_sent_again_after_a_cancelled_one_went_through_is_released_not_lost(
        zookeeper_server: ZooKeeperServer, zk: ZooKeeperDeployment, name: str) -> None:
    async def main(proxy: Proxy) -> None:
        locks = fencelock.aio.connect(f"zookeeper://127.0.0.1:{proxy.port}{zk.chroot}?timeout=5")
        other = zk.aconnect()
        try:
            lease = await locks.acquire(name, ttl=10.0, wait=0)
            waiter = asyncio.ensure_future(other.acquire(name, ttl=10.0, wait=20.0))
            await asyncio.to_thread(until, lambda: len(zk.nodes(name)) == 2, 5.0, "the waiter queued")
            proxy.delay = 0.5
            release = asyncio.ensure_future(lease.release())
            await asyncio.to_thread(until, lambda: not zk.nodes(name)[0].startswith(lease.token), 5.0,
                                    "the release was applied")
            release.cancel()  # its answer is still on its way back
            with pytest.raises(asyncio.CancelledError):
                await release
            proxy.delay = 0.0
            taken = await asyncio.wait_for(waiter, 5.0)  # the waiter queued behind us holds the lock now
            await lease.release()  # sent again: it finds our node gone, by our own release
            assert not lease.lost
            with pytest.raises(fencelock.LockLost, match="released"):
                lease.ensure()
            await taken.release()
        finally:
            proxy.delay = 0.0
            await other.aclose()
            await locks.aclose()

    with Proxy("127.0.0.1", zookeeper_server.port) as proxy:
        asyncio.run(main(proxy))


def test_close_under_waiting_acquires_ends_them_without_retries_and_leaves_no_node(zk: ZooKeeperDeployment,
                                                                                   name: str) -> None:
    """A closed client's faults are not transient: its waiters fail at their next look, not one session later."""
    holder, locks = zk.connect(), zk.connect()
    errors: list[tuple[float, BaseException]] = []

    def wait_for_it() -> None:
        try:
            locks.acquire(name, ttl=5.0, wait=30.0)
        except BaseException as exc:
            errors.append((time.monotonic(), exc))

    waiters = [threading.Thread(target=wait_for_it) for _ in range(3)]
    try:
        lease = holder.acquire(name, ttl=10.0, wait=0)
        for waiter in waiters:
            waiter.start()
        until(lambda: len(zk.nodes(name)) == 4, 5.0, "the waiters queued")
        locks.close()
        closed_at = time.monotonic()
        assert zk.nodes(name) == [zk.nodes(name)[0]]  # the sessions ended: their nodes went with them
        for waiter in waiters:
            waiter.join(10.0)
        assert len(errors) == 3
        assert all(isinstance(exc, fencelock.LockError) for _, exc in errors), errors
        # At their next look at the queue (every TTL/4 at most), and its request's timeout: no retries.
        assert max(at for at, _ in errors) - closed_at < 5.0 / 4 + 2.0 + slack(0.5)
        lease.release()
    finally:
        holder.close()


# -- a waiter granted on a later attempt --------------------------------------------------------------------------

def test_a_waiter_whose_listing_met_a_reset_claims_no_more_than_the_servers_view_of_its_node(
        zookeeper_server: ZooKeeperServer, zk: ZooKeeperDeployment, name: str) -> None:
    """The waiter's node is created, its listing meets a reset, and the holder leaves meanwhile; after the
    reconnect the listing finds the node at the head. The node's TTL on the server (its write time, what `status`
    and every other client see) must end no earlier than the lease's `remaining()` says."""
    from fencelock.testing.faults import RESET_BEFORE, FaultProxy, Rule
    from fencelock.testing.framing import ZOOKEEPER
    from fencelock.testing.invariants import ZooKeeperReader

    holder = fencelock.connect(zookeeper_server.url(zk.chroot))
    held = holder.acquire(name, ttl=30.0, wait=0)
    reader = ZooKeeperReader(zk.hosts, zk.chroot, timeout=2.0)
    try:
        with FaultProxy("127.0.0.1", zookeeper_server.port, framing=ZOOKEEPER, name="zk-later") as proxy:
            waiter = fencelock.connect(f"zookeeper://127.0.0.1:{proxy.port}{zk.chroot}?timeout=2")
            try:
                waiter.acquire(f"{name}:warm", ttl=5.0, wait=0).release()  # (the session and the root exist)
                rule = proxy.arm(Rule(RESET_BEFORE, "getChildren*", on_hit=lambda request: held.release()))
                lease = waiter.acquire(name, ttl=30.0, wait=10.0)
                assert rule.hit.is_set(), "the listing was never reset"
                began = time.monotonic()
                claimed = lease.remaining()
                token, pttl = reader.read_lock(name)
                read = time.monotonic()
                assert token == lease.token
                over = (began + claimed) - (read + pttl / 1000.0)
                assert over <= 0.005, f"the server's TTL of the node ends {over:.3f} s before the lease's validity"
                lease.release()
            finally:
                waiter.close()
    finally:
        reader.close()
        holder.close()
