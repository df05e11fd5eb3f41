"""Faults on a new connection's own set-up (the reply to its handshake's first CLIENT command lost, late past the
socket timeout, or the server paused across it), and an asyncio cancellation while the handshake waits.

Invariant, checked by an independent client on the server: the request either has its effect or fails with a
fencelock error naming the lock, within the socket timeout and some slack; a failed acquire leaves the lock free
for others well before its TTL; a failed release keeps the token, and releasing again frees the key; an extend
that failed never makes the lease claim more than the server keeps; after the fault, the same client works."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock.testing.faults import LATE, LOSE, PAUSE, FaultProxy, Rule
from fencelock.testing.servers import RedisServer
from fencelock.testing.timing import slack

SOCKET_TIMEOUT = 0.5
HELD = 0.8           # a late reply or a pause: past the socket timeout
TTL = 30.0           # longer than the test: only a release frees a key
REQUESTS = ["acquire", "extend", "release", "status"]


@pytest.fixture
def proxy(own_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", own_server.port, name="handshake") as running:
        yield running


def _rule(kind: str, server: RedisServer, **extra: Any) -> Rule:
    return Rule(kind, "client", delay=HELD, on_pause=server.pause, on_resume=server.resume, **extra)


def _check_after(raw: Any, name: str, request: str, lease: Any, error: BaseException | None) -> None:
    """What must hold once the call returned or raised (lease: the one the call was made on, or None)."""
    key = redis_keys(name).lock
    if error is not None:
        assert isinstance(error, fencelock.LockError), repr(error)
        assert name in str(error), str(error)
    if request == "release" and error is not None:
        assert lease.token, "a release that failed dropped the token"
    if request == "extend" and lease is not None and lease.held:
        assert lease.remaining() * 1000 <= raw.pttl(key) + 50, "the lease claims more than the server keeps"


@pytest.mark.parametrize("fault", [LOSE, LATE, PAUSE])
@pytest.mark.parametrize("request_name", REQUESTS)
def test_sync_a_fault_on_the_handshake_reply(own_server: RedisServer, proxy: FaultProxy, name: str, fault: str,
                                             request_name: str) -> None:
    raw = own_server.client()
    key = redis_keys(name).lock
    with fencelock.connect(f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={SOCKET_TIMEOUT}") as locks:
        lease = None if request_name == "acquire" else locks.acquire(name, ttl=TTL, wait=0)
        proxy.reset_all()  # the next request needs a new connection, whose set-up meets the fault
        rule = proxy.arm(_rule(fault, own_server))
        error: BaseException | None = None
        started = time.monotonic()
        try:
            if request_name == "acquire":
                lease = locks.acquire(name, ttl=TTL, wait=0)
            elif request_name == "extend":
                lease.extend(TTL)  # type: ignore[union-attr]
            elif request_name == "release":
                lease.release()  # type: ignore[union-attr]
            else:
                locks.status(name)
        except Exception as exc:
            error = exc
        assert time.monotonic() - started < SOCKET_TIMEOUT + HELD + slack(2.0)
        assert rule.hit.wait(5)
        rule.done.wait(5)
        proxy.clear()
        _check_after(raw, name, request_name, lease, error)
        if lease is not None:
            lease.release()  # again, after a release that failed; a second one after a success does nothing
        again = locks.acquire(name, ttl=5.0, wait=slack(5.0))  # the same client works; the lock is free
        again.release()
        assert raw.exists(key) == 0
    raw.close()


@pytest.mark.parametrize("fault", [LOSE, LATE, PAUSE, "cancel"])
@pytest.mark.parametrize("request_name", REQUESTS)
def test_asyncio_a_fault_on_the_handshake_reply(own_server: RedisServer, proxy: FaultProxy, name: str, fault: str,
                                                request_name: str) -> None:
    """`cancel`: the call is cancelled while its new connection waits for the handshake's (late) reply."""
    raw = own_server.client()
    key = redis_keys(name).lock

    async def main() -> None:
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={SOCKET_TIMEOUT}"
        async with fencelock.aio.connect(url) as locks:
            lease = None if request_name == "acquire" else await locks.acquire(name, ttl=TTL, wait=0)
            proxy.reset_all()
            await asyncio.sleep(0.05)  # the loop sees its connections end
            loop = asyncio.get_running_loop()
            task: asyncio.Future[Any] | None = None

            def cancel(_: object) -> None:
                loop.call_soon_threadsafe(lambda: task.cancel() if task is not None else None)

            rule = proxy.arm(_rule(LATE if fault == "cancel" else fault, own_server,
                                   on_hit=cancel if fault == "cancel" else None))

            async def call() -> Any:
                if request_name == "acquire":
                    return await locks.acquire(name, ttl=TTL, wait=0)
                if request_name == "extend":
                    return await lease.extend(TTL)  # type: ignore[union-attr]
                if request_name == "release":
                    return await lease.release()  # type: ignore[union-attr]
                return await locks.status(name)

            error: BaseException | None = None
            cancelled = False
            started = time.monotonic()
            task = asyncio.ensure_future(call())
            try:
                result = await task
                if request_name == "acquire":
                    lease = result
            except asyncio.CancelledError:
                cancelled = True
            except Exception as exc:
                error = exc
            if fault == "cancel":
                # The cancellation came while the handshake waited. redis.asyncio's handshake read sometimes absorbs
                # it (the task counts it, and the read runs on to its socket timeout): then the call fails with a
                # fencelock error in the same bound, as under `late`. Either way, the invariants below hold.
                assert cancelled or isinstance(error, fencelock.BackendError), repr(error)
            else:
                assert not cancelled
            assert time.monotonic() - started < SOCKET_TIMEOUT + HELD + slack(2.0)
            assert await asyncio.to_thread(rule.hit.wait, 5)  # (set just after on_hit ran)
            await asyncio.to_thread(rule.done.wait, 5)
            proxy.clear()
            _check_after(raw, name, request_name, lease, error)
            if lease is not None:
                await lease.release()
            again = await locks.acquire(name, ttl=5.0, wait=slack(5.0))
            await again.release()
            assert raw.exists(key) == 0

    asyncio.run(main())
    raw.close()
