"""One client, many callers at once on many names: a bounded number of connections per server, and held leases first.

Each server's dedicated connections are capped (`MAX_OPEN`); more requests at once wait their turn for one (a
lease's renewals and releases there before any other request). Waits that block on the server (BLPOP) are capped
apart (`MAX_BLOCKING`); more wait in the client and then ask without blocking. Checked on a real Redis whose
`maxclients` is below the number of callers, so a client that opened a connection per caller would be refused.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

import fencelock
import fencelock.aio
from fencelock._async._transport import MAX_OPEN
from fencelock._redis.channel import MAX_BLOCKING
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisServer
from fencelock.testing.timing import slack
from tests.conftest import until

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



# -- a crowd on a stalled server: each acquire's `wait` stays one deadline -----------------------------------------

STALL_TIMEOUT = 1.0
"""The socket timeout of the clients on the stalled server: one request's bound."""

STALL_WAIT = 0.3
STALL_TTL = 2.0


def _stall_bound() -> float:
    """An acquire's longest stay on a stalled server: its wait, or else one socket timeout waiting for a connection,
    then one request's timeout (it used to grow with the callers queued: 400 took up to 16 s)."""
    return slack(STALL_WAIT + 2 * STALL_TIMEOUT + 1.0)


def _check_stalled(server: RedisServer, took: list[float], errors: list[BaseException], count: int) -> None:
    assert len(errors) == count, "an acquire was granted by a server that was stopped"
    assert max(took) < _stall_bound(), f"an acquire took {max(took):.2f} s with wait={STALL_WAIT}"
    assert all(type(exc) is fencelock.BackendError for exc in errors), repr(errors[0])
    assert sorted(getattr(exc, "name", None) or "" for exc in errors) == sorted(f"stall:{i}" for i in range(count))
    assert any("overloaded" in str(exc) and "nothing was sent" in str(exc) for exc in errors), \
        "no acquire waited for a connection: the test did not queue any"
    watcher = server.client()
    until(lambda: not any(watcher.exists(redis_keys(f"stall:{i}").lock) for i in range(count)),
          slack(2 * STALL_TTL + 2.0), "the key of an acquire that failed outlived its TTL")



def test_tasks_queued_for_a_connection_to_a_stalled_server_fail_within_their_wait() -> None:
    """400 asyncio acquires of one client on a stopped server (SIGSTOP), with `wait`=0.3: the ones queued for one
    of the capped connections give up by their deadline (at least a socket timeout) with a clear error, instead
    of waiting behind every request before them; the client works again once the server is back."""
    count = 400
    server = RedisServer().start()
    try:
        async def main() -> tuple[list[float], list[BaseException]]:
            took: list[float] = []
            errors: list[BaseException] = []
            async with fencelock.aio.connect(f"{server.url}?socket_timeout={STALL_TIMEOUT}") as locks:
                await (await locks.acquire("warm", ttl=STALL_TTL, wait=1.0)).release()
                server.pause()

                async def one(i: int) -> None:
                    began = time.monotonic()
                    try:
                        await locks.acquire(f"stall:{i}", ttl=STALL_TTL, wait=STALL_WAIT)
                    except Exception as exc:
                        errors.append(exc)
                    took.append(time.monotonic() - began)

                try:
                    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(count))), 120.0)
                finally:
                    server.resume()
                lease = await locks.acquire("after", ttl=STALL_TTL, wait=5.0)  # (the same client, not rebuilt)
                await lease.release()
            return took, errors

        took, errors = asyncio.run(main())
        _check_stalled(server, took, errors, count)
    finally:
        server.close()


def test_threads_queued_for_a_connection_to_a_stalled_server_fail_within_their_wait() -> None:
    """The same under threads: 160 threads of one sync client on a stopped server."""
    count = 160
    server = RedisServer().start()
    took: list[float] = []
    errors: list[BaseException] = []
    locks = fencelock.connect(f"{server.url}?socket_timeout={STALL_TIMEOUT}")
    try:
        locks.acquire("warm", ttl=STALL_TTL, wait=1.0).release()
        server.pause()
        barrier = threading.Barrier(count)

        def one(i: int) -> None:
            barrier.wait()
            began = time.monotonic()
            try:
                locks.acquire(f"stall:{i}", ttl=STALL_TTL, wait=STALL_WAIT)
            except Exception as exc:
                errors.append(exc)
            took.append(time.monotonic() - began)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120.0)
        finally:
            server.resume()
        locks.acquire("after", ttl=STALL_TTL, wait=5.0).release()
        _check_stalled(server, took, errors, count)
    finally:
        locks.close()
        server.close()
