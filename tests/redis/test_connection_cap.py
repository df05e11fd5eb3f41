"""One client, many callers at once on many names: a bounded number of connections per server, and held leases first.

Each server's dedicated connections are capped (`MAX_OPEN`); more requests at once wait their turn for one (a
lease's renewals and releases there before any other request). Waits that block on the server (BLPOP) are capped
apart (`MAX_BLOCKING`); more wait in the client and then ask without blocking. Checked on a real Redis whose
`maxclients` is below the number of callers, so a client that opened a connection per caller would be refused.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

import fencelock
import fencelock.aio
from fencelock._async._transport import MAX_OPEN
from fencelock._redis.channel import MAX_BLOCKING
from fencelock.testing.servers import RedisServer

pytestmark = pytest.mark.alone  # (it loads one client to its limits: no other test runs beside it)

MAXCLIENTS = MAX_OPEN + 36
"""The server's own limit: the capped channel, plus the client's pool and this test's watchers, fit; a connection
per caller would not."""


@pytest.fixture
def small() -> Iterator[RedisServer]:
    server = RedisServer(extra_args=("--maxclients", str(MAXCLIENTS))).start()
    try:
        yield server
    finally:
        server.close()


def _made(server: RedisServer) -> int:
    return int(server.client().info("stats")["total_connections_received"])


def test_two_thousand_tasks_on_their_own_names_share_the_capped_connections(small: RedisServer) -> None:
    """2,000 asyncio tasks of one client, each acquiring and releasing a name of its own at once: every one is
    granted (none refused by a server that takes fewer clients than that), over at most `MAX_OPEN` connections made."""
    count = 2000
    before = _made(small)

    async def main() -> list[BaseException]:
        errors: list[BaseException] = []
        async with fencelock.aio.connect(small.url) as locks:
            async def one(i: int) -> None:
                try:
                    async with locks.lock(f"own:{i}", ttl=30.0, wait=10.0):
                        await asyncio.sleep(0.01)
                except Exception as exc:
                    errors.append(exc)
            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(count))), 120.0)
        return errors

    errors = asyncio.run(main())
    assert errors == []
    assert _made(small) - before <= MAX_OPEN + 4  # (the client's own pool: a handshake or two)


def test_a_held_lease_is_renewed_before_a_crowd_of_acquires(small: RedisServer) -> None:
    """A lease with a short TTL stays renewed while 2,000 acquires of the same client crowd its server at once:
    they queue for the capped connections (a connection and a handshake each starved the event loop, and the lease
    was lost within its TTL), and every acquire is granted."""
    count = 2000
    lost = threading.Event()

    async def main() -> tuple[list[BaseException], bool]:
        errors: list[BaseException] = []
        async with fencelock.aio.connect(small.url) as locks:
            keeper = await locks.acquire("keeper", ttl=1.0, wait=0, on_lost=lambda lease: lost.set())

            async def one(i: int) -> None:
                try:
                    lease = await locks.acquire(f"crowd:{i}", ttl=30.0, wait=10.0, renew=False)
                    await lease.release()
                except Exception as exc:
                    errors.append(exc)

            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(count))), 120.0)
            still = keeper.held
            await keeper.release()
        return errors, still

    errors, still = asyncio.run(main())
    assert errors == []
    assert not lost.is_set(), "the held lease was lost behind the crowd of acquires"
    assert still


def test_threads_share_the_capped_connections(small: RedisServer) -> None:
    """The same cap under threads: 300 threads, one name each, through one sync client, on a server that takes
    fewer clients than that."""
    count = 300
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)
    locks = fencelock.connect(small.url)

    def one(i: int) -> None:
        barrier.wait()
        try:
            for _ in range(5):
                with locks.lock(f"thread:{i}", ttl=30.0, wait=10.0):
                    pass
        except Exception as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120.0)
    finally:
        locks.close()
    assert errors == []


def test_waiters_on_a_thousand_held_names_block_on_a_capped_number_of_connections() -> None:
    """1,000 asyncio tasks of one client each wait on a name another client holds, on a server that takes fewer
    clients than that: at most `MAX_BLOCKING` of their waits block on the server, the others wait in the client,
    and once the holder releases every name, every waiter is granted."""
    count = 1000
    server = RedisServer(extra_args=("--maxclients", str(MAX_BLOCKING + 3 * MAX_OPEN + 64))).start()
    try:
        async def main() -> tuple[list[BaseException], int]:
            errors: list[BaseException] = []
            granted = 0
            async with fencelock.aio.connect(server.url) as holder, fencelock.aio.connect(server.url) as waiters:
                held = [await holder.acquire(f"held:{i}", ttl=60.0, wait=0) for i in range(count)]

                async def one(i: int) -> None:
                    nonlocal granted
                    try:
                        async with waiters.lock(f"held:{i}", ttl=30.0, wait=30.0):
                            granted += 1
                    except Exception as exc:
                        errors.append(exc)

                tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
                await asyncio.sleep(1.0)  # (every waiter has sent its first attempt and waits)
                for lease in held:
                    await lease.release()
                await asyncio.wait_for(asyncio.gather(*tasks), 90.0)
            return errors, granted

        errors, granted = asyncio.run(main())
    finally:
        server.close()
    assert errors == []
    assert granted == count

