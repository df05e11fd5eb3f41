"""A lease never claims more than its node's session keeps: `extend(ttl=)` past the session's timeout re-creates the
node, under the same name (its place in the queue) and with the same fence, in a session that keeps the new TTL;
a TTL the server's `maxSessionTimeout` cannot keep is refused before anything is sent. Operators' calls need no
session for a TTL at all. Checked on real servers, by independent kazoo clients."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock._zk.rules import decode_lease
from fencelock.testing.proxy import Proxy
from fencelock.testing.timing import slack
from fencelock.testing.zookeeper import ZooKeeperDeployment, ZooKeeperServer
from tests.conftest import _require_zookeeper, until

MAX_SESSION_MS = 20_000
"""The small server's maxSessionTimeout: below the default TTL (30 s), as with tickTime=1000 and no setting."""


@pytest.fixture(scope="module")
def small_server() -> Iterator[ZooKeeperServer]:
    _require_zookeeper()
    with ZooKeeperServer(name="zk-small-max", extra_config=[f"maxSessionTimeout={MAX_SESSION_MS}"]) as server:
        yield server


@pytest.fixture
def small(small_server: ZooKeeperServer) -> Iterator[ZooKeeperDeployment]:
    deployment = ZooKeeperDeployment(small_server)
    yield deployment
    deployment.close()


def _session_of(locks: fencelock.Locks | fencelock.aio.Locks, lease: fencelock.Lease | fencelock.aio.Lease) -> Any:
    backend: Any = locks.backend
    return backend._held[(lease.name, lease.token)].session


def _owner(zk: ZooKeeperDeployment, name: str) -> tuple[int, bytes]:
    """The holder's node as the server has it: its ephemeral owner (a session id) and its data."""
    with zk.client() as client:
        data, stat = client.get(f"{zk._directory(name)}/{zk.nodes(name)[0]}")
    return int(stat.ephemeralOwner), bytes(data)


# -- operators -------------------------------------------------------------------------------------------------

def test_operators_calls_work_on_a_server_whose_longest_session_is_below_the_default_ttl(
        small: ZooKeeperDeployment, name: str) -> None:
    holder = small.connect()
    lease = holder.acquire(name, ttl=5.0, wait=0)
    for make in (fencelock.connect, fencelock.aio.connect):  # a fresh client each: no session opened yet
        operator: Any = make(small.target)
        try:
            status = operator.status(name) if make is fencelock.connect else asyncio.run(operator.status(name))
            assert (status.held, status.fence) == (True, lease.fence)
        finally:
            if make is fencelock.connect:
                operator.close()
            else:
                asyncio.run(operator.aclose())
    operator = small.connect()
    try:
        assert [s.name for s in operator.list("test:*")] == [name]
        removed = operator.force_release(name)
        assert (removed.held, removed.fence) == (True, lease.fence)
        assert small.nodes(name) == []
    finally:
        operator.close()
        holder.close()


# -- extend past the session -----------------------------------------------------------------------------------

def test_extend_to_a_ttl_the_server_cannot_keep_is_refused_before_anything_is_sent(
        small: ZooKeeperDeployment, name: str) -> None:
    locks = small.connect()
    try:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        before = _owner(small, name)
        with pytest.raises(ValueError, match=r"ttl 100.*maxSessionTimeout") as info:
            lease.extend(ttl=100.0)
        assert f"lock {name!r}" in str(info.value)
        assert _owner(small, name) == before  # the node untouched: same session, same data (the TTL it had)
        assert lease.ttl == 5.0
        assert lease.remaining() < 5.0
        assert not lease.lost
        lease.extend(ttl=15.0)  # one the server keeps: granted
        assert lease.ttl == 15.0
        lease.release()
        assert small.nodes(name) == []
    finally:
        locks.close()


def test_extend_past_the_session_moves_the_node_and_a_cut_off_holder_never_overlaps_the_next(
        zookeeper_server: ZooKeeperServer, zk: ZooKeeperDeployment, name: str) -> None:
    """The probe: ttl 1 (a session of 1.02 s), extend(ttl=3), then the holder is cut off. The server must keep the
    node until the lease's validity has run out: the next holder is granted only after that."""
    with Proxy("127.0.0.1", zookeeper_server.port) as proxy:
        locks = fencelock.connect(f"zookeeper://127.0.0.1:{proxy.port}{zk.chroot}")
        other = zk.connect()
        try:
            lease = locks.acquire(name, ttl=1.0, wait=0)
            short = _session_of(locks, lease)
            granted: list[tuple[float, fencelock.Lease]] = []

            def wait_for_it() -> None:
                taken = other.acquire(name, ttl=5.0, wait=15.0)
                granted.append((time.monotonic(), taken))

            waiter = threading.Thread(target=wait_for_it)
            waiter.start()
            until(lambda: len(zk.nodes(name)) == 2, 5.0, "the waiter queued")
            held_node = zk.nodes(name)[0]
            lease.extend(ttl=3.0)
            long, (owner, data), head = _session_of(locks, lease), _owner(zk, name), zk.nodes(name)[0]
            status = locks.status(name)
            woken = bool(granted)
            valid_until = time.monotonic() + lease.remaining()
            proxy.stall()                                       # cut off: nothing more reaches the server
            waiter.join(15.0)
            assert granted, "the waiter was never granted"
            at, taken = granted[0]
            assert taken.fence > lease.fence
            assert at >= valid_until, f"granted {valid_until - at:.3f} s before the holder's validity ran out"
            taken.release()
            # How: the node moved to a session that keeps 3 s, under its name, with its fence.
            assert long is not short
            assert long.negotiated_ms >= 3000
            assert owner == long.session_id                     # the node was the long session's
            assert head == held_node                            # same name: same place in the queue
            assert decode_lease(data) == (3000, lease.fence)    # the TTL it keeps, and the fence it was granted
            assert status.fence == lease.fence
            assert not woken                                    # the move woke the waiter, which waited on
        finally:
            proxy.heal()
            other.close()
            locks.close()


def test_extend_shorter_then_longer_within_the_session_keeps_the_node_where_it_is(zk: ZooKeeperDeployment,
                                                                                    name: str) -> None:
    locks = zk.connect()
    try:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        session = _session_of(locks, lease)
        owner = _owner(zk, name)[0]
        lease.extend(ttl=2.0)
        lease.extend(ttl=5.5)  # still within the session's 5.66 s
        assert _session_of(locks, lease) is session
        assert _owner(zk, name)[0] == owner
        assert lease.ttl == 5.5
        lease.release()
    finally:
        locks.close()


_SHRINK_THEN_DIE = """
import os, signal, sys, fencelock
lease = fencelock.connect(sys.argv[1]).acquire(sys.argv[2], ttl=20.0, wait=0)
lease.extend(ttl=2.0)
print(lease.fence, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_holder_that_dies_after_extending_to_a_far_shorter_ttl_frees_the_lock_after_about_that_ttl(
        zk: ZooKeeperDeployment, name: str) -> None:
    """extend(ttl=2) on a lease acquired for 20 s moves the node to the 2 s TTL's session: killed, the holder
    leaves its node for about 2 s, not for its first session's 23 s."""
    done = subprocess.run([sys.executable, "-c", _SHRINK_THEN_DIE, zk.target, name], capture_output=True,
                          text=True, timeout=60)
    fence = int(done.stdout.split()[0])
    died = time.monotonic()
    locks = zk.connect()
    try:
        lease = locks.acquire(name, ttl=2.0, wait=slack(10.0))
        assert time.monotonic() - died < slack(5.0)
        assert lease.fence > fence
        lease.release()
    finally:
        locks.close()


def test_asyncio_an_extend_cancelled_during_its_move_is_settled_by_the_next_extend(
        zookeeper_server: ZooKeeperServer, zk: ZooKeeperDeployment, name: str) -> None:
    """The move's answer never reaches the holder (cancelled while the reply is held back): the node is in the long
    session now, and the next extend (or renewal) finds it there and keeps the lease, never reporting it lost."""

    async def main(proxy: Proxy) -> None:
        locks = fencelock.aio.connect(f"zookeeper://127.0.0.1:{proxy.port}{zk.chroot}?timeout=5")
        try:
            lease = await locks.acquire(name, ttl=5.0, wait=0)
            short_id = _session_of(locks, lease).client.client_id[0]
            await (await locks.acquire(f"{name}:warm", ttl=8.0, wait=0)).release()  # the long session is open
            proxy.delay = 0.5                                      # every byte from now on passes 0.5 s late
            extend = asyncio.ensure_future(lease.extend(ttl=8.0))
            await asyncio.to_thread(until, lambda: _owner(zk, name)[0] != short_id, 5.0, "the move was applied")
            extend.cancel()  # its answer is still on its way back
            with pytest.raises(asyncio.CancelledError):
                await extend
            proxy.delay = 0.0
            assert lease.ttl == 5.0
            assert not lease.lost
            await lease.extend()  # the next extend (or renewal) finds the node in the long session: still ours
            assert not lease.lost
            assert lease.remaining() > 4.0
            assert zk.nodes(name)[0].startswith(lease.token)
            await lease.release()
            assert zk.nodes(name) == []
        finally:
            await locks.aclose()

    with Proxy("127.0.0.1", zookeeper_server.port) as proxy:
        asyncio.run(main(proxy))
