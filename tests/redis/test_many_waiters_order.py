"""Many waiters through one client, on real servers: the order they are granted in, and what happens when some give
up or the server stalls (the sharing of connections is in `test_many_waiters.py`).

The invariants, each checked from outside by a client of the test's own that watches the server:
- fair waiters are granted in the order they queued, within one client and across two;
- a waiter that gives up (cancelled, or its wait over) loses nobody's wake-up: the others are granted after the
  release, not after a TTL;
- waiters behind the head fail together when the server stalls, and work again after.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock.testing import RedisDeployment
from fencelock.testing.timing import slack
from tests.conftest import RedisFamily

from . import test_many_waiters as _base
from .test_many_waiters import (
    CONNECTIONS,
    Clients,
    Grants,
)

pytestmark = pytest.mark.alone  # (it loads one client to its limits: no other test runs beside it)

server = _base.server   # the same fixture, for this module's tests

# -- fair order ------------------------------------------------------------------------------------------------

def _queued(deployment: RedisFamily, name: str) -> int:
    raw: Any = deployment.raw()
    return int(raw.llen(redis_keys(name).queue))


async def _until_queued(deployment: RedisFamily, name: str, length: int) -> None:
    deadline = time.monotonic() + 10.0
    while _queued(deployment, name) < length:
        assert time.monotonic() < deadline, f"the queue never reached {length}"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("clients", [1, 2])
def test_fair_waiters_are_granted_in_the_order_they_queued_within_one_client_and_across_two(
        server: RedisDeployment, name: str, clients: int) -> None:
    """Waiters queue one after another (alternating between the clients when there are two): they are granted
    in exactly that order, each once, never two at once; each client's waiters wait through its one room."""
    count = 24

    async def main() -> list[int]:
        grants = Grants(server, name)
        watched = Clients(server)
        holder_client = fencelock.aio.connect(server.target)
        clients_ = [fencelock.aio.connect(server.target) for _ in range(clients)]
        errors: list[BaseException] = []
        try:
            holder = await holder_client.acquire(name, ttl=60.0, wait=0)

            async def waiter(i: int) -> None:
                try:
                    async with clients_[i % clients].lock(name, ttl=60.0, wait=120.0, fair=True) as lease:
                        grants.granted(lease, i)
                        await asyncio.sleep(0.002)
                        grants.releasing(lease, i)
                except Exception as exc:
                    errors.append(exc)

            tasks = []
            for i in range(count):
                tasks.append(asyncio.ensure_future(waiter(i)))
                await _until_queued(server, name, i + 1)  # its entry is in the server's queue: a known order
            await asyncio.sleep(2.0)  # longer than one blocking period: the waiters behind refresh their entries
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 60.0)
        finally:
            for client in [holder_client, *clients_]:
                await client.aclose()
            extra = watched.stop()
        assert errors == []
        assert max(extra) <= CONNECTIONS * clients + 2, extra
        return grants.check(count)

    assert asyncio.run(main()) == list(range(count))
    assert _queued(server, name) == 0


# -- a waiter that gives up ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fair", [False, True])
def test_a_waiter_that_gives_up_in_the_middle_loses_no_wake_up(server: RedisDeployment, name: str,
                                                                fair: bool) -> None:
    """The head of the room (blocked on the server), a waiter in the middle and the last one are cancelled, and
    another gives up when its short wait ends, all before the release: every other waiter is granted, in turn,
    soon after the release. The holder's TTL (60 s) and the waiters' (60 s) are far longer than the test's
    patience (20 s), so no grant can come from a key expiring."""
    count = 30

    async def main() -> list[int]:
        grants = Grants(server, name)
        holder_client = fencelock.aio.connect(server.target)
        locks = fencelock.aio.connect(server.target)
        errors: list[BaseException] = []
        try:
            holder = await holder_client.acquire(name, ttl=60.0, wait=0)

            async def waiter(i: int, wait: float) -> None:
                try:
                    async with locks.lock(name, ttl=60.0, wait=wait, fair=fair) as lease:
                        grants.granted(lease, i)
                        grants.releasing(lease, i)
                except fencelock.AcquireTimeout:
                    if i != 1:
                        raise
                except Exception as exc:
                    errors.append(exc)

            tasks = []
            for i in range(count):
                tasks.append(asyncio.ensure_future(waiter(i, 0.5 if i == 1 else 120.0)))
                if fair:
                    await _until_queued(server, name, i + 1)
            await asyncio.sleep(1.0)  # waiter 1's wait is over; the head blocks on the server
            cancelled = {0, count // 2, count - 1}
            for i in cancelled:
                tasks[i].cancel()
            if fair:  # the cancelled waiters left the server's queue at once, not when their entries expire (4 s)
                deadline = time.monotonic() + 1.0
                while _queued(server, name) != count - len(cancelled) - 1:
                    assert time.monotonic() < deadline, _queued(server, name)
                    await asyncio.sleep(0.01)
            released = time.monotonic()
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20.0)
            assert time.monotonic() - released < slack(20.0)
        finally:
            await holder_client.aclose()
            await locks.aclose()
        assert errors == []
        for i in cancelled:
            assert tasks[i].cancelled()
        return grants.check(count - len(cancelled) - 1)

    order = asyncio.run(main())
    expected = [i for i in range(count) if i not in {0, 1, count // 2, count - 1}]
    if fair:
        assert order == expected
    else:
        assert sorted(order) == expected
    for _ in range(100):  # the cancelled head's request ran on, and its undo gave back what it got
        if server.holder(name) is None:
            break
        time.sleep(0.02)
    assert server.holder(name) is None
    assert _queued(server, name) == 0


# -- a server that stops answering -----------------------------------------------------------------------------

@pytest.mark.parametrize("api", ["asyncio", "threads"])
def test_waiters_behind_the_head_fail_together_when_the_server_stalls_and_work_again_after(name: str,
                                                                                         api: str) -> None:
    """The server is paused (SIGSTOP) while 40 waiters of one client wait with no deadline. The head's request
    times out (2 s socket timeout): every waiter gets a BackendError naming the lock within a few seconds, not
    one after another, a socket timeout each (40 x 2 s). After the server resumes the same client acquires."""
    count = 40
    deployment = RedisDeployment.start()
    holder_client = fencelock.connect(deployment.target)
    try:
        holder_client.acquire(name, ttl=5.0, wait=0)
        errors: list[fencelock.BackendError] = []
        ended: list[float] = []

        if api == "asyncio":
            async def main() -> None:
                locks = fencelock.aio.connect(deployment.target)

                async def waiter() -> None:
                    try:
                        await locks.acquire(name, ttl=5.0, wait=None)
                    except fencelock.BackendError as exc:
                        errors.append(exc)
                    ended.append(time.monotonic())

                tasks = [asyncio.ensure_future(waiter()) for _ in range(count)]
                await asyncio.sleep(0.5)
                await asyncio.to_thread(deployment.pause)
                paused.append(time.monotonic())
                try:
                    await asyncio.wait_for(asyncio.gather(*tasks), 60.0)
                finally:
                    await asyncio.to_thread(deployment.resume)
                lease = await locks.acquire(name, ttl=5.0, wait=20.0)  # the holder's key expires meanwhile
                await lease.release()
                await locks.aclose()

            paused: list[float] = []
            asyncio.run(main())
        else:
            locks = fencelock.connect(deployment.target)

            def waiter() -> None:
                try:
                    locks.acquire(name, ttl=5.0, wait=None)
                except fencelock.BackendError as exc:
                    errors.append(exc)
                ended.append(time.monotonic())

            threads = [threading.Thread(target=waiter) for _ in range(count)]
            for thread in threads:
                thread.start()
            time.sleep(0.5)
            deployment.pause()
            paused = [time.monotonic()]
            try:
                for thread in threads:
                    thread.join(60.0)
            finally:
                deployment.resume()
            locks.acquire(name, ttl=5.0, wait=20.0).release()
            locks.close()
        assert len(errors) == count
        assert all(exc.name == name for exc in errors)
        assert max(ended) - paused[0] < 15.0, max(ended) - paused[0]  # (in turn it would take 40 x 2 s)
    finally:
        holder_client.close()
        deployment.close()
