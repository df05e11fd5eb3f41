"""A `lock()` context whose lease is not renewed (`renew=False`) is watched all the same: when its validity runs
out, the loss is reported at once (a "lost" event; asyncio: the body is cancelled, and the exit raises
`LockLost`), as for a renewed lease the server says is gone. Before, nothing watched it: the body ran on past its
validity, unaware, until it ended by itself.

A real Redis; the TTL is short and nobody renews the key, so it expires on the server.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import fencelock
import fencelock.aio
from fencelock.testing.servers import RedisServer
from fencelock.testing.timing import slack

TTL = 0.4
BODY = 5.0  # seconds the body would take: far past the validity


def test_asyncio_an_unrenewed_lock_body_is_cancelled_when_its_validity_ends(standalone: RedisServer,
                                                                            name: str) -> None:
    steps: list[str] = []

    async def hold(locks: fencelock.aio.Locks) -> None:
        async with locks.lock(name, ttl=TTL, renew=False) as lease:
            steps.append("body")
            try:
                await asyncio.sleep(BODY)
            except asyncio.CancelledError:
                steps.append(f"cancelled, held={lease.held}")
                raise
            steps.append("body ran to its end")

    async def main() -> float:
        async with fencelock.aio.connect(standalone.url) as locks:
            started = time.monotonic()
            with pytest.raises(fencelock.LockLost, match="validity"):
                await hold(locks)
            return time.monotonic() - started

    took = asyncio.run(main())
    assert steps == ["body", "cancelled, held=False"]
    assert took < slack(TTL + 1.0)


def test_sync_an_unrenewed_lock_reports_its_loss_when_its_validity_ends(standalone: RedisServer, name: str) -> None:
    lost = threading.Event()
    seen: list[str] = []

    def listen(event: fencelock.LockEvent) -> None:
        if event.name == name and event.kind == "lost":
            seen.append(event.error or "")
            lost.set()

    in_body: list[bool] = []

    def hold(locks: fencelock.Locks) -> None:
        with locks.lock(name, ttl=TTL, renew=False) as lease:
            # (asserted after: the exit's LockLost wins over an assertion here)
            in_body.extend([lost.wait(slack(TTL + 1.0)), lease.lost])

    unsubscribe = fencelock.subscribe(listen)
    try:
        with fencelock.connect(standalone.url) as locks, pytest.raises(fencelock.LockLost):
            hold(locks)
    finally:
        unsubscribe()
    assert in_body == [True, True], "the loss was not reported while the body ran"
    assert len(seen) == 1
    assert "validity" in seen[0]
