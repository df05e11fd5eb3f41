"""Faults while releases are queued in one Redis client: the other half of the queued-fault tests (those fault
acquires).

One asyncio client holds `COUNT` leases and releases them all at once, more than its server's capped connections
carry, so most releases wait in `Channel.place`. Meanwhile a network fault hits some of them as they leave the
queue: a reply lost, late, or the connection reset before or after the request, or idle connections closed. The
server is paused in one case. A test client reading the server then checks that:
- a release that returned left no key with our token;
- a release that raised raised a fencelock error naming its lock, within a bound, and kept its token, so the
  same call, made again, ends it;
- no key is left once they are all done;
- the client works again without being rebuilt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisServer
from tests._queued_faults import LATE_BY, NETWORK, SOCKET_TIMEOUT, Network, own_redis, proxied

pytestmark = pytest.mark.alone  # (it loads one client to its limits: no other test runs beside it)

COUNT = 400
TTL = 30.0
"""Long: a key still there at the end was left by a release, never dropped by its TTL."""
LIMIT = 15.0
"""A bound on every release: the socket timeout and a resend, far below the 30 s queue bound."""


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with own_redis() as started:
        yield started


def _tokens(server: RedisServer, names: list[str]) -> list[str | None]:
    client: Any = server.client()
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(redis_keys(name, "fencelock").lock)
    return [value.decode() if isinstance(value, bytes) else value for value in pipe.execute()]


async def _release(lease: Any) -> tuple[BaseException | None, float]:
    began = time.monotonic()
    try:
        await lease.release()
    except Exception as exc:
        return exc, time.monotonic() - began
    return None, time.monotonic() - began


@pytest.mark.parametrize("fault", ["pause", *NETWORK])
def test_a_fault_while_releases_are_queued_in_the_client(server: RedisServer, fault: str) -> None:
    names = [f"rq:{fault}:{i}" for i in range(COUNT)]
    with contextlib.ExitStack() as stack:
        proxy = stack.enter_context(proxied(server))
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={SOCKET_TIMEOUT}"
        network = Network(fault, [proxy], "release", late=LATE_BY, count=10, spread=15) if fault in NETWORK else None

        async def main() -> tuple[list[tuple[BaseException | None, float]], list[str | None], list[Any], int]:
            async with fencelock.aio.connect(url) as locks:
                leases = await asyncio.gather(*(locks.acquire(name, ttl=TTL, wait=5.0) for name in names))
                channel = locks.backend._channel  # type: ignore[attr-defined]

                def queued() -> int:
                    return len(channel._queues[0]) + len(channel._queues[1])

                tasks = [asyncio.ensure_future(_release(lease)) for lease in leases]
                deadline = time.monotonic() + 5.0
                while queued() == 0 and time.monotonic() < deadline:  # noqa: ASYNC110 (the client's own state)
                    await asyncio.sleep(0.001)
                depth = queued()
                if network is not None:
                    await network.inject(queued)
                else:
                    server.pause()
                    await asyncio.sleep(1.0)
                    server.resume()
                outcomes = await asyncio.wait_for(asyncio.gather(*tasks), LIMIT + 5.0)
                failed = network.end() if network is not None else ""
                assert not failed, failed
                after = _tokens(server, names)  # (read before anything is retried)
                again = [await _release(lease) for lease, (error, _) in zip(leases, outcomes, strict=True)
                         if error is not None]
                lease = await locks.acquire(f"after:{fault}", ttl=TTL, wait=1.0)  # (the same client)
                await lease.release()
            return outcomes, after, [error for error, _ in again], depth

        outcomes, after, again, depth = asyncio.run(main())
    assert depth > 0, "nothing was queued in the client when the fault came"
    errors = [(name, error) for name, (error, _) in zip(names, outcomes, strict=True) if error is not None]
    foreign = [(name, repr(error)) for name, error in errors
               if not (isinstance(error, fencelock.LockError) and error.name == name)]
    assert not foreign, f"errors that are not a fencelock error naming the lock: {foreign[:5]}"
    slow = [(name, round(took, 2)) for name, (_, took) in zip(names, outcomes, strict=True) if took > LIMIT]
    assert not slow, f"releases that took longer than {LIMIT} s: {slow[:5]}"
    unconfirmed = [name for name, (error, _), token in zip(names, outcomes, after, strict=True)
                   if error is None and token is not None]
    assert not unconfirmed, f"releases that returned while the server still had the key: {unconfirmed[:5]}"
    assert again == [None] * len(errors), f"a failed release, made again, did not end it: {again[:3]}"
    left = [name for name, token in zip(names, _tokens(server, names), strict=True) if token is not None]
    assert not left, f"keys left after every release ended: {left[:5]}"
