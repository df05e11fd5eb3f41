"""A connection the server closed while fencelock was not using it (an idle sweep, the server's `timeout`, a close
during a new connection's handshake) is not a failure: the next release, extend, status or acquire reconnects and
has its effect, which an independent client confirms on the servers; no BackendError."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock.testing.faults import CLOSE, FaultProxy, Rule
from fencelock.testing.servers import RedisServer
from tests.conftest import RedisFamily, until

from . import _support
from ._support import _pttls

idle_deployment = _support.idle_deployment   # the module-scoped fixture: a deployment of this module's own


def _servers(deployment: RedisFamily) -> list[RedisServer]:
    servers: Any = deployment.servers
    return [servers] if isinstance(servers, RedisServer) else list(servers.nodes)


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


def test_requests_after_the_server_closed_idle_connections_succeed_sync(idle_deployment: RedisFamily,
                                                                        name: str) -> None:
    """Invariant: a server that closed fencelock's idle connections is healthy, so release, extend and status
    succeed on it (reconnecting), and each has the effect the server confirms; no BackendError."""
    locks = idle_deployment.connect()
    try:
        lease = locks.acquire(name, ttl=30.0, wait=0)
        _close_idle_connections(idle_deployment)
        lease.extend(20.0)
        _assert_majority(idle_deployment, lambda: [0 < ttl <= 20_000 for ttl in _pttls(idle_deployment, name)])
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
            await _assert_majority_async(
                idle_deployment, lambda: [0 < ttl <= 20_000 for ttl in _pttls(idle_deployment, name)])
            _close_idle_connections(idle_deployment)
            status = await locks.status(name)
            assert status.held
            assert status.fence == lease.fence
            _close_idle_connections(idle_deployment)
            await lease.release()
            await _assert_majority_async(idle_deployment, lambda: [v is None for v in _holder(idle_deployment, name)])
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


async def _assert_majority_async(deployment: RedisFamily, check: Any) -> None:
    """`_assert_majority` from a coroutine: the loop runs on meanwhile (the other nodes' requests are its tasks)."""
    found = check()
    assert sum(found) > len(found) // 2, found
    deadline = time.monotonic() + 5.0
    while not all(check()):
        assert time.monotonic() < deadline, ("every node to agree", check())
        await asyncio.sleep(0.01)


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


@pytest.mark.parametrize("api", ["sync", "asyncio"])
@pytest.mark.parametrize("request_name", ["acquire", "extend", "release", "status"])
def test_a_connection_the_server_closed_during_its_handshake_is_not_a_failure(own_server: RedisServer, name: str,
                                                                            api: str, request_name: str) -> None:
    """Invariant: a new dedicated connection that the server closes while it is being set up (its handshake, before
    the request was written) is not a failure: the request never reached the server, so it goes on another new
    connection and has its effect. (Seen when a server's idle sweep met a Redlock node's background request.)"""
    proxy = FaultProxy("127.0.0.1", own_server.port, name="handshake").start()
    url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"
    raw = own_server.client()
    key = redis_keys(name).lock

    def arm() -> Rule:  # the next connection's first CLIENT command (its handshake) meets a closed connection
        return proxy.arm(Rule(CLOSE, "client"))

    try:
        if api == "sync":
            with fencelock.connect(url) as locks:
                rule = arm() if request_name == "acquire" else None
                lease = locks.acquire(name, ttl=10.0, wait=0)
                if request_name != "acquire":
                    proxy.reset_all()  # the next request needs a new connection
                    rule = arm()
                if request_name == "extend":
                    lease.extend(20.0)
                    assert 10_000 < raw.pttl(key) <= 20_000
                elif request_name == "status":
                    assert locks.status(name).fence == lease.fence
                elif request_name == "release":
                    lease.release()
                    assert raw.exists(key) == 0
                assert rule is not None
                assert rule.hit.is_set()
                if request_name == "acquire":
                    assert raw.get(key) is not None
        else:
            async def main() -> None:
                async with fencelock.aio.connect(url) as locks:
                    rule = arm() if request_name == "acquire" else None
                    lease = await locks.acquire(name, ttl=10.0, wait=0)
                    if request_name != "acquire":
                        proxy.reset_all()
                        await asyncio.sleep(0.05)  # the loop sees its connections end
                        rule = arm()
                    if request_name == "extend":
                        await lease.extend(20.0)
                        assert 10_000 < raw.pttl(key) <= 20_000
                    elif request_name == "status":
                        assert (await locks.status(name)).fence == lease.fence
                    elif request_name == "release":
                        await lease.release()
                        assert raw.exists(key) == 0
                    assert rule is not None
                    assert rule.hit.is_set()
                    if request_name == "acquire":
                        assert raw.get(key) is not None

            asyncio.run(main())
    finally:
        proxy.close()
        raw.close()
