"""Everyday faults on real servers: connections the server closed while idle, an acquire retried after its reply
was lost, and Redlock nodes stalled under load. Each test states the invariant it checks, and checks it with an
independent client that reads the servers behind fencelock's back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock._logic.keys import redis_keys
from fencelock.testing import ClusterDeployment, RedisDeployment, RedlockDeployment
from fencelock.testing.servers import RedisServer

from .conftest import RedisFamily, _require_server_binary, until

KINDS = ["redis", "cluster", "redlock"]


def _start(kind: str) -> RedisFamily:
    _require_server_binary()
    if kind == "redis":
        return RedisDeployment.start()
    if kind == "cluster":
        return ClusterDeployment.start(3)
    return RedlockDeployment.start(5)


def _servers(deployment: RedisFamily) -> list[RedisServer]:
    servers: Any = deployment.servers
    return [servers] if isinstance(servers, RedisServer) else list(servers.nodes)


@pytest.fixture(scope="module", params=KINDS)
def idle_deployment(request: pytest.FixtureRequest) -> Iterator[RedisFamily]:
    """A deployment of this module's own: its tests close every client connection on the servers."""
    deployment = _start(request.param)
    try:
        yield deployment
    finally:
        deployment.close()


def _close_idle_connections(deployment: RedisFamily) -> None:
    """What a server's idle timeout, a load balancer or a restart does to a connection nobody is using: the server
    closes it. (`CLIENT KILL TYPE normal` closes them the way `timeout` does, without waiting a second for it.)"""
    for server in _servers(deployment):
        with server.client() as raw:
            raw.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


def _holder(deployment: RedisFamily, name: str) -> list[str | None]:
    """The token in `name`'s lock key on each server that could hold it (every node on Redlock)."""
    key = redis_keys(name).lock
    values = [raw.get(key) for raw in deployment.raws()]
    return [None if v is None else bytes(v).decode() for v in values]


# -- 1. a connection the server closed while idle is not a failure ------------------------------------------------

def test_requests_after_the_server_closed_idle_connections_succeed_sync(idle_deployment: RedisFamily,
                                                                        name: str) -> None:
    """Invariant: a server that closed fencelock's idle connections is healthy, so release, extend and status
    succeed on it (reconnecting), and each has the effect the server confirms; no BackendError."""
    locks = idle_deployment.connect()
    try:
        lease = locks.acquire(name, ttl=30.0, wait=0)
        _close_idle_connections(idle_deployment)
        lease.extend(20.0)
        _assert_majority(idle_deployment, lambda: [ttl > 19_000 for ttl in _pttls(idle_deployment, name)])
        _close_idle_connections(idle_deployment)
        status = locks.status(name)
        assert status.held
        assert status.fence == lease.fence
        _close_idle_connections(idle_deployment)
        lease.release()
        _assert_majority(idle_deployment, lambda: [v is None for v in _holder(idle_deployment, name)])
        _close_idle_connections(idle_deployment)
        again = locks.acquire(name, ttl=5.0, wait=0)  # and the client works on, not rebuilt
        again.release()
    finally:
        locks.close()


def test_requests_after_the_server_closed_idle_connections_succeed_asyncio(idle_deployment: RedisFamily,
                                                                           name: str) -> None:
    """As above, with asyncio."""

    async def main() -> None:
        locks = idle_deployment.aconnect()
        try:
            lease = await locks.acquire(name, ttl=30.0, wait=0)
            _close_idle_connections(idle_deployment)
            await asyncio.sleep(0.05)  # the loop sees the connections close (or not: both must work)
            await lease.extend(20.0)
            _assert_majority(idle_deployment, lambda: [ttl > 19_000 for ttl in _pttls(idle_deployment, name)])
            _close_idle_connections(idle_deployment)
            status = await locks.status(name)
            assert status.held
            assert status.fence == lease.fence
            _close_idle_connections(idle_deployment)
            await lease.release()
            _assert_majority(idle_deployment, lambda: [v is None for v in _holder(idle_deployment, name)])
            _close_idle_connections(idle_deployment)
            again = await locks.acquire(name, ttl=5.0, wait=0)
            await again.release()
        finally:
            await locks.aclose()

    asyncio.run(main())


def _assert_majority(deployment: RedisFamily, check: Any) -> None:
    """`check()` holds on a majority of the servers now (Redlock decides at a quorum; the other nodes' requests
    finish in the background), and on all of them soon after."""
    found = check()
    assert sum(found) > len(found) // 2, found
    until(lambda: all(check()), 5.0, "every node to agree")


def _pttls(deployment: RedisFamily, name: str) -> list[int]:
    key = redis_keys(name).lock
    return [int(raw.pttl(key)) for raw in deployment.raws()]


def test_a_server_idle_timeout_does_not_fail_the_next_request(own_server: RedisServer, name: str) -> None:
    """The same with the server's own `timeout 1` (the reported case): after two idle seconds, release, extend
    and status on the dedicated connections succeed, sync and asyncio."""
    own_server.client().config_set("timeout", 1)
    locks = fencelock.connect(own_server.url)

    async def asyncio_side(lease_name: str) -> None:
        alocks = fencelock.aio.connect(own_server.url)
        try:
            lease = await alocks.acquire(lease_name, ttl=30.0, wait=0)
            await asyncio.sleep(2.5)
            await lease.extend()
            await asyncio.sleep(2.5)
            assert (await alocks.status(lease_name)).held
            await asyncio.sleep(2.5)
            await lease.release()
        finally:
            await alocks.aclose()

    try:
        lease = locks.acquire(name, ttl=30.0, wait=0)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(asyncio_side(name + ":aio"))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(2.5)
        lease.extend()
        time.sleep(2.5)
        assert locks.status(name).held
        time.sleep(2.5)
        lease.release()
        thread.join(30)
        assert not errors, errors
        raw = own_server.client()
        assert raw.exists(redis_keys(name).lock, redis_keys(name + ":aio").lock) == 0
    finally:
        locks.close()
