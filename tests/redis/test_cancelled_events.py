"""An acquire, extend or release that its caller cancels (asyncio) is told as a `cancelled` event of that call: its
outcome on the server is unknown, and a listener can tell it from a failure or a loss.

A real Redis behind a `FaultProxy` that holds the extend's and the release's reply back while they are cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import fencelock
import fencelock.aio
from fencelock._scripts import EXTEND, RELEASE
from fencelock.testing.faults import LATE, FaultProxy, Rule
from fencelock.testing.servers import RedisServer


@pytest.fixture
def events(name: str) -> Iterator[list[fencelock.LockEvent]]:
    seen: list[fencelock.LockEvent] = []
    unsubscribe = fencelock.subscribe(lambda event: seen.append(event) if event.name == name else None)
    yield seen
    unsubscribe()


def test_cancelled_calls_are_told_as_cancelled_events(own_server: RedisServer, name: str,
                                                      events: list[fencelock.LockEvent]) -> None:
    raw = own_server.client()
    raw.script_load(EXTEND.source)
    raw.script_load(RELEASE.source)

    async def cancelled(call: asyncio.Future[object], rule: Rule | None = None) -> None:
        if rule is None:
            await asyncio.sleep(0.3)
        else:
            assert await asyncio.to_thread(rule.hit.wait, 5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    async def main(proxy: FaultProxy) -> None:
        async with fencelock.aio.connect(f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5") as locks:
            lease = await locks.acquire(name, ttl=10.0, wait=0)
            await cancelled(asyncio.ensure_future(locks.acquire(name, ttl=10.0, wait=30.0)))  # waits: held
            await cancelled(asyncio.ensure_future(lease.extend(20.0)), proxy.arm(Rule(LATE, "extend", delay=2.0)))
            await cancelled(asyncio.ensure_future(lease.release()), proxy.arm(Rule(LATE, "release", delay=2.0)))
            proxy.clear()
            await lease.release()

    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        asyncio.run(main(proxy))
    told = [(e.op, e.error) for e in events if e.kind == "cancelled"]
    assert told == [("acquire", "CancelledError"), ("extend", "CancelledError"), ("release", "CancelledError")]
    assert all(e.duration is not None for e in events if e.kind == "cancelled")
