"""What only the Redis family shows about the lock: how many scripts a waiter runs, redis-py clients passed in,
and close() closing every connection. Everything every backend shares is in the conformance suite
(`fencelock.testing.conformance`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock.testing import Deployment
from fencelock.testing.servers import RedisServer
from tests.conftest import BACKENDS, REDIS_KINDS, RedisFamily


def test_a_waiter_is_woken_by_the_release_not_by_polling(locks: fencelock.Locks, name: str,
                                                         deployment: RedisFamily) -> None:
    holder = locks.acquire(name, ttl=10.0, wait=0)
    timer = threading.Timer(0.6, holder.release)
    scripts, infos = _calls(deployment, "evalsha", "info")
    started = time.monotonic()
    timer.start()
    waiter = locks.acquire(name, ttl=5.0, wait=5.0)
    woke = time.monotonic() - started
    timer.join()
    scripts_after, infos_after = _calls(deployment, "evalsha", "info")
    # Not counted: the client's eviction check (one script, running INFO), if it came after the first count; the
    # first count's own INFO is one per server.
    checks = infos_after - infos - len(_servers(deployment))
    # minus the holder's release; Redlock sends each request to every node
    attempts = (scripts_after - scripts - checks) // deployment.nodes_per_request - 1
    assert 0.6 <= woke < 0.7, woke
    assert attempts <= 3, f"{attempts} acquire attempts while waiting 0.6 s: that is polling"
    waiter.release()


def test_a_redis_client_can_be_passed_in_and_is_not_closed(deployment: RedisFamily, name: str) -> None:
    target = deployment.redis_target()
    locks = fencelock.connect(target)
    with locks.lock(name, ttl=5.0, wait=0) as lease:
        assert lease.fence >= 1
    locks.close()
    for raw in deployment.raws():
        assert raw.ping()


def _calls(deployment: RedisFamily, *commands: str) -> list[int]:
    """How many times each of `commands` ran, summed over the deployment's nodes (one INFO commandstats each)."""
    totals = [0] * len(commands)
    for raw in deployment.raws():
        stats: Any = raw.info("commandstats")
        for node in stats.values() if deployment.kind == "cluster" else [stats]:
            for i, command in enumerate(commands):
                totals[i] += int(node.get(f"cmdstat_{command}", {}).get("calls", 0))
    return totals


def _servers(deployment: Deployment) -> list[RedisServer]:
    family: Any = deployment  # the Redis family's deployments have `servers`
    servers = family.servers
    return [servers] if isinstance(servers, RedisServer) else list(servers.nodes)


def _connections(servers: list[RedisServer]) -> list[int]:
    """Per server, the client connections other than the one asking."""
    counts = []
    for server in servers:
        with server.client() as asking:
            counts.append(len(asking.client_list()) - 1)
    return counts


def _settled(servers: list[RedisServer], expected: list[int]) -> list[int]:
    deadline = time.monotonic() + 2.0
    while (counts := _connections(servers)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return counts


@pytest.fixture
def cluster_of_its_own() -> Iterator[Deployment]:
    deployment = BACKENDS["cluster"]()
    yield deployment
    deployment.close()


@pytest.mark.parametrize("kind", REDIS_KINDS)
def test_close_leaves_no_connection_open_on_any_server(kind: str, name: str) -> None:
    """close() and aclose() close every connection the client made, on every server. (A Cluster client made from
    a URL left one per node to the garbage collector, a ResourceWarning at some later, random moment.)"""
    deployment = BACKENDS[kind]()  # servers of its own: nobody else's connections come and go meanwhile
    try:
        servers = _servers(deployment)
        before = _connections(servers)
        locks = deployment.connect()
        for i in range(3):
            locks.acquire(f"{name}:{i}", ttl=5.0, wait=0).release()
        assert _connections(servers) != before  # it did connect
        locks.close()
        assert _settled(servers, before) == before

        async def main() -> None:
            alocks = deployment.aconnect()
            for i in range(3):
                await (await alocks.acquire(f"{name}:{i}", ttl=5.0, wait=0)).release()
            await alocks.aclose()

        asyncio.run(main())
        assert _settled(servers, before) == before
    finally:
        deployment.close()


def test_a_cleanup_still_running_at_close_leaves_no_connection_open(cluster_of_its_own: Deployment,
                                                                   name: str) -> None:
    """An acquire that failed on a stalled Cluster deletes its key in the background (if its script ran). That
    cleanup may still run when the client is closed, and the Cluster client reconnects for it (it reads the
    layout again after a timeout): the client closes again after it, so no connection is left open."""
    deployment = cluster_of_its_own
    servers = _servers(deployment)
    before = _connections(servers)
    url: Any = deployment.target
    locks = fencelock.connect(f"{url}?socket_timeout=0.3")
    locks.acquire(name + ":warm", ttl=5.0, wait=0).release()
    deployment.pause()
    try:
        with pytest.raises(fencelock.BackendError):
            locks.acquire(name, ttl=5.0, wait=1.0)
    finally:
        deployment.resume()
    locks.close()
    assert _settled(servers, before) == before
