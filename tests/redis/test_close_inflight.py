"""`close()` / `aclose()` with acquires of that client still running: each one ends at once with `LockError` naming
the lock (a waiter blocked in BLPOP too), an attempt granted meanwhile is given back (compare-and-delete) and never
returned, and the closed client opens no connection afterwards.

Before: a waiter in `lock(wait=None)` kept polling after close, opened new connections, was granted 1-3 s later a
lease nobody renewed; a sync waiter blocked in BLPOP failed 2 s later with a misleading TimeoutError; connections
made after close were never closed. Single Redis and Cluster, both front ends; an independent client reads the
servers (their keys, and how many connections they were ever sent).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._async import _concurrency
from fencelock._scripts import ACQUIRE
from fencelock.testing.faults import LATE, FaultProxy, Rule
from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisClusterServers, RedisNodes, RedisServer
from fencelock.testing.timing import slack
from tests.conftest import initialise_redlock, lock_value, until


@pytest.fixture(params=["redis", "cluster"])
def servers(request: pytest.FixtureRequest, standalone: RedisServer,
            cluster: RedisClusterServers) -> tuple[str, Any, list[Any]]:
    """(URL, a raw client for the keys, one raw client per server for its statistics)."""
    if request.param == "redis":
        return standalone.url, standalone.client(), [standalone.client()]
    return cluster.url, cluster.client(), [node.client() for node in cluster.nodes]


def _connections_received(admins: list[Any]) -> int:
    return sum(int(admin.info("stats")["total_connections_received"]) for admin in admins)


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_close_ends_every_waiter_at_once_and_nothing_is_granted_or_connected_after_it(
        servers: tuple[str, Any, list[Any]], name: str, front: str) -> None:
    url, raw, admins = servers
    outcomes: list[BaseException | None] = []
    with fencelock.connect(url) as holder:
        held = holder.acquire(name, ttl=30.0, wait=0)
        if front == "sync":
            locks = fencelock.connect(url)
            waiting = threading.Event()

            def waiter() -> None:
                waiting.set()
                try:
                    with locks.lock(name, ttl=2.0, wait=None):
                        outcomes.append(None)
                except BaseException as exc:
                    outcomes.append(exc)

            threads = [threading.Thread(target=waiter) for _ in range(3)]
            for thread in threads:
                thread.start()
            assert waiting.wait(5)
            threading.Event().wait(0.3)  # they are blocked in BLPOP, or behind the one that is, by now
            locks.close()
            ended = len(outcomes)  # close() waited for them
            for thread in threads:
                thread.join(slack(1.0))
        else:
            async def main() -> int:
                locks = fencelock.aio.connect(url)

                async def waiter() -> None:
                    try:
                        async with locks.lock(name, ttl=2.0, wait=None):
                            outcomes.append(None)
                    except BaseException as exc:
                        outcomes.append(exc)

                tasks = [asyncio.ensure_future(waiter()) for _ in range(3)]
                await asyncio.sleep(0.3)
                await locks.aclose()
                ended = len(outcomes)
                await asyncio.wait_for(asyncio.gather(*tasks), slack(1.0))
                return ended

            ended = asyncio.run(main())
        assert lock_value(raw, name) == held.token  # (and the raw client has its connection to that node now)
        before = _connections_received(admins)
        held.release()  # the lock is free now: a waiter of the closed client must not take it
        threading.Event().wait(0.5)
        assert lock_value(raw, name) is None
        assert _connections_received(admins) == before, "the closed client connected again"
    assert ended == 3, f"close() returned before its waiters ended ({ended} of 3)"
    assert len(outcomes) == 3
    for outcome in outcomes:
        assert type(outcome) is fencelock.LockError, repr(outcome)
        assert outcome.name == name
        assert "closed" in str(outcome)


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_an_attempt_granted_while_the_client_closes_is_given_back_not_returned(own_server: RedisServer, name: str,
                                                                             front: str) -> None:
    """The waiter's attempt was on the wire when close() came; the server granted it, and the reply came after.
    The key is deleted (with the waiter's own token) before close() returns, and the waiter raises LockError."""
    raw: Any = own_server.client()
    raw.script_load(ACQUIRE.source)  # (else the held-back reply is NOSCRIPT's, and the grant comes after it)
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"
        late = proxy.arm(Rule(LATE, "acquire", delay=0.3))
        outcome: list[BaseException | None] = []
        if front == "sync":
            locks = fencelock.connect(url)

            def acquire() -> None:
                try:
                    locks.acquire(name, ttl=30.0, wait=5.0)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=acquire)
            thread.start()
            assert late.hit.wait(5)
            until(lambda: lock_value(raw, name) is not None, 5, "granted on the server; the reply is held back")
            locks.close()
            thread.join(slack(1.0))
        else:
            async def main() -> None:
                locks = fencelock.aio.connect(url)

                async def acquire() -> None:
                    try:
                        await locks.acquire(name, ttl=30.0, wait=5.0)
                        outcome.append(None)
                    except BaseException as exc:
                        outcome.append(exc)

                task = asyncio.ensure_future(acquire())
                assert await asyncio.to_thread(late.hit.wait, 5)
                await asyncio.to_thread(until, lambda: lock_value(raw, name) is not None, 5, "granted")
                await locks.aclose()
                await asyncio.wait_for(task, slack(1.0))

            asyncio.run(main())
        assert lock_value(raw, name) is None  # given back before close() returned
    assert len(outcome) == 1
    assert type(outcome[0]) is fencelock.LockError, repr(outcome[0])
    assert outcome[0].name == name
    assert "given back" in str(outcome[0])


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_lease_released_after_its_client_closed_leaves_no_connection_open(standalone: RedisServer, name: str,
                                                                            front: str) -> None:
    raw: Any = standalone.client()

    def ours() -> list[Any]:
        return [c for c in raw.client_list() if c["id"] != raw.client_id() and c.get("name") == name[-8:]]

    url = f"{standalone.url}?client_name={name[-8:]}"
    if front == "sync":
        locks = fencelock.connect(url)
        lease = locks.acquire(name, ttl=30.0, wait=0)
        locks.close()
        lease.release()
    else:
        async def main() -> None:
            locks = fencelock.aio.connect(url)
            lease = await locks.acquire(name, ttl=30.0, wait=0)
            await locks.aclose()
            await lease.release()

        asyncio.run(main())
    assert lock_value(raw, name) is None
    threading.Event().wait(0.1)
    assert ours() == []


@pytest.mark.parametrize("nodes", [1, 3], ids=["redis", "redlock"])
def test_asyncio_close_right_after_acquires_cancelled_in_flight_gives_their_keys_back_and_leaves_nothing_running(
        nodes: int, name: str) -> None:
    """Acquires whose requests are on the wire (each way delayed) are cancelled, and `aclose()` follows at
    once. It waits for those requests and for the give-back after each: when it returns, no task of fencelock's
    runs, and no key of theirs is on any server. (The same rule as etcd's, in the client every backend shares.)"""
    names = [f"{name}:{i}" for i in range(5)]
    group = RedisNodes(nodes).start()
    proxies = [Proxy("127.0.0.1", server.port).start() for server in group.nodes]
    try:
        urls = [f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5" for proxy in proxies]
        if nodes > 1:
            initialise_redlock(urls)

        async def main() -> list[asyncio.Future[Any]]:
            locks = fencelock.aio.connect(urls if nodes > 1 else urls[0])
            warm = [f"{name}:warm:{i}" for i in range(len(names))]  # (a connection open for each acquire)
            for lease in await asyncio.gather(*(locks.acquire(each, ttl=5.0, wait=0) for each in warm)):
                await lease.release()
            for proxy in proxies:  # (Redlock: a round trip well inside its node timeout, 0.15 s at this TTL)
                proxy.delay = 0.2 if nodes == 1 else 0.03
            tasks = [asyncio.ensure_future(locks.acquire(each, ttl=10.0, wait=0)) for each in names]
            await asyncio.to_thread(until, lambda: all(p.held_back > 0 for p in proxies), 5.0,
                                    "the acquires' requests are on the wire")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await locks.aclose()
            await asyncio.sleep(0)
            loop = asyncio.get_running_loop()  # (not a task an earlier test's loop left behind in this process)
            return [task for task in _concurrency._background if not task.done() and task.get_loop() is loop]

        running = asyncio.run(main())
        assert running == [], f"{len(running)} tasks still running after aclose(): {running[:3]}"
        left = [(i, each) for i, server in enumerate(group.nodes) for each in names
                if lock_value(server.client(), each) is not None]
        assert left == [], f"keys left after aclose() returned: {left}"
    finally:
        for proxy in proxies:
            proxy.close()
        group.close()
