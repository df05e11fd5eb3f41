"""A dropped connection is not a failure while the ZooKeeper session lives: the connection is reset before a request
reaches the server, reset after the server ran it, or closed by the server as it arrives, and the request goes again
on the session's next connection (reads, release, extend), an acquire's retry rewrites the node it finds, and an
acquire waits for the session to connect again. Faults come from a `FaultProxy` that reads ZooKeeper's frames; an
independent kazoo client reads the server (`zk.nodes`, `zk.ttl_left`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock.testing.faults import CLOSE, PAUSE, RESET_AFTER, RESET_BEFORE, FaultProxy, Rule
from fencelock.testing.framing import ZOOKEEPER
from fencelock.testing.zookeeper import ZooKeeperDeployment, ZooKeeperServer
from tests.conftest import until

TTL = 5.0

_MATCH = {"release": "multi", "extend": "setData", "status": "getChildren", "list": "getChildren"}
"""The request each call sends first: a release is one transaction (delete, and the fence on the lock's node)."""


@pytest.fixture
def proxy(zookeeper_server: ZooKeeperServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", zookeeper_server.port, framing=ZOOKEEPER, name="zk-faults") as started:
        yield started


def _url(proxy: FaultProxy, zk: ZooKeeperDeployment) -> str:
    return f"zookeeper://127.0.0.1:{proxy.port}{zk.chroot}?timeout=2"


def _sent_again_on_a_new_connection(proxy: FaultProxy, rule: Rule) -> None:
    """After the faulted request: a new connection (its ConnectRequest), then the same request on it."""
    assert rule.hit.is_set()
    assert rule.request is not None
    after = [r for r in proxy.requests if r.at >= rule.request.at and r.name != "ping"]
    assert after[0] is rule.request
    assert [r.name for r in after[1:3]] == ["connect", rule.request.name], [r.name for r in after]
    assert after[2].connection > rule.request.connection


@pytest.mark.parametrize("kind", [RESET_BEFORE, RESET_AFTER, CLOSE])
@pytest.mark.parametrize("call", ["release", "extend", "status", "list"])
def test_a_call_whose_connection_dropped_goes_again_on_the_sessions_next_connection(
        proxy: FaultProxy, zk: ZooKeeperDeployment, name: str, kind: str, call: str) -> None:
    """The probe: each of these failed with BackendError (ConnectionLoss) although the session lived on."""
    locks = fencelock.connect(_url(proxy, zk))
    try:
        lease = locks.acquire(name, ttl=TTL, wait=0)
        rule = proxy.arm(Rule(kind, _MATCH[call]))
        if call == "release":
            lease.release()
            assert not lease.lost
            with pytest.raises(fencelock.LockLost, match="released"):
                lease.ensure()
            assert zk.nodes(name) == []
        elif call == "extend":
            lease.extend(ttl=TTL)
            assert not lease.lost
            assert zk.holder(name) == lease.token
            left = zk.ttl_left(name)
            assert left is not None
            assert lease.remaining() <= left + 0.05  # the server's copy of the TTL was rewritten too
        elif call == "status":
            status = locks.status(name)
            assert status.held
            assert status.fence == lease.fence
        else:
            assert [s.name for s in locks.list("*")] == [name]
        _sent_again_on_a_new_connection(proxy, rule)
        if call != "release":
            lease.release()
            assert zk.nodes(name) == []
    finally:
        locks.close()


def test_asyncio_a_release_and_an_extend_whose_connection_dropped_go_again(
        proxy: FaultProxy, zk: ZooKeeperDeployment, name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(_url(proxy, zk))
        try:
            lease = await locks.acquire(name, ttl=TTL, wait=0)
            extend = proxy.arm(Rule(RESET_AFTER, "setData"))
            await lease.extend()
            _sent_again_on_a_new_connection(proxy, extend)
            release = proxy.arm(Rule(RESET_BEFORE, "multi"))
            await lease.release()
            _sent_again_on_a_new_connection(proxy, release)
            assert not lease.lost
            assert zk.nodes(name) == []
        finally:
            await locks.aclose()

    asyncio.run(main())


def test_a_release_is_sent_once_more_only(proxy: FaultProxy, zk: ZooKeeperDeployment, name: str) -> None:
    """Both sendings dropped: a BackendError, and the lease keeps its node for a later release."""
    locks = fencelock.connect(_url(proxy, zk))
    try:
        lease = locks.acquire(name, ttl=TTL, wait=0)
        first, second = proxy.arm(Rule(RESET_BEFORE, "multi")), proxy.arm(Rule(RESET_BEFORE, "multi"))
        with pytest.raises(fencelock.BackendError, match="ConnectionLoss"):
            lease.release()
        assert first.hit.is_set()
        assert second.hit.is_set()
        assert zk.holder(name) == lease.token
        lease.release()
        assert zk.nodes(name) == []
    finally:
        locks.close()


def test_an_acquire_retried_after_its_create_went_through_rewrites_the_node_and_claims_no_more_than_the_server(
        proxy: FaultProxy, zk: ZooKeeperDeployment, name: str) -> None:
    """The create runs, its reply is lost with the connection a second later; the retry finds the node by its
    token. The probe: the lease counted its validity from the retry while the node kept the first write time, so
    `remaining()` claimed a second more than `status` showed."""
    locks = fencelock.connect(_url(proxy, zk))
    try:
        locks.acquire(f"{name}:warm", ttl=TTL, wait=0).release()
        rule = proxy.arm(Rule(RESET_AFTER, "create2", delay=1.0))
        lease = locks.acquire(name, ttl=TTL, wait=5.0)
        left = zk.ttl_left(name)
        assert left is not None
        assert lease.remaining() <= left + 0.05
        assert rule.request is not None
        after = [r.name for r in proxy.requests if r.at >= rule.request.at and r.name != "ping"]
        assert after == ["create2", "connect", "getChildren", "setData", "getChildren"]  # found, rewritten, granted
        assert zk.nodes(name) == [zk.nodes(name)[0]]  # one node: the retry made none
        lease.release()
        assert zk.nodes(name) == []
    finally:
        locks.close()


def _down_for_a_moment(proxy: FaultProxy, locks: Any, outage: float) -> Rule:
    """Reset the session's connection and hold the next handshake back for `outage` seconds; returns once kazoo
    knows the connection is gone."""
    session = next(iter(locks.backend._sessions.values()))
    rule = proxy.arm(Rule(PAUSE, "connect", delay=outage))
    proxy.reset_all()
    until(lambda: not session.live.is_set(), 5.0, "kazoo saw the connection drop")
    return rule


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_an_acquire_waits_for_a_session_whose_connection_is_down_for_a_moment(
        proxy: FaultProxy, zk: ZooKeeperDeployment, name: str, front: str) -> None:
    """The probe: `acquire(wait=0)` with the session reconnecting raised "suspended: not queueing now" after one
    50 ms back-off. One attempt may take the URL's timeout (2 s), so it waits for the connection and queues."""
    if front == "sync":
        locks = fencelock.connect(_url(proxy, zk))
        try:
            locks.acquire(f"{name}:warm", ttl=TTL, wait=0).release()
            rule = _down_for_a_moment(proxy, locks, 0.5)
            lease = locks.acquire(name, ttl=TTL, wait=0)
        finally:
            locks.close()
    else:
        async def main() -> tuple[Rule, Any]:
            alocks = fencelock.aio.connect(_url(proxy, zk))
            try:
                await (await alocks.acquire(f"{name}:warm", ttl=TTL, wait=0)).release()
                rule = await asyncio.to_thread(_down_for_a_moment, proxy, alocks, 0.5)
                return rule, await alocks.acquire(name, ttl=TTL, wait=0)
            finally:
                await alocks.aclose()

        rule, lease = asyncio.run(main())
    assert rule.request is not None
    after = [r.name for r in proxy.requests if r.at >= rule.request.at and r.name != "ping"]
    assert after[0] == "connect", after  # the lock's path and node were created once the session was back
    assert after.count("create2") == 1, after
    assert lease.fence > 0
    assert zk.nodes(name) == []  # the client was closed: its session, and the node, went with it
