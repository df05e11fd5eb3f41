"""A slow `on_lost` callback never holds up the renewal of the client's other leases: the watchdog hands it to the
client's callbacks (a thread of their own; asyncio: the loop, and an `async def` callback runs as a task) and goes
on with its batch. Before, the synchronous watchdog ran it on its own thread, inside the batch, before the other
leases were rescheduled: a 1.5 s callback lost every other lease with a shorter TTL.

A real Redis; the lease found lost is stolen (its key deleted) or expires unrenewed; an independent client checks
that the other lease's key is still there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock.testing.servers import RedisServer
from tests.conftest import lock_value

SLOW = 1.5  # seconds the callback takes
TTL = 0.5  # the other lease's: it must be renewed (every third of it) while the callback runs


@pytest.mark.parametrize("how", ["stolen", "expired"])
@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_slow_on_lost_callback_never_holds_up_the_renewal_of_other_leases(standalone: RedisServer, name: str,
                                                                            front: str, how: str) -> None:
    raw: Any = standalone.client()
    doomed, other = f"{name}:doomed", f"{name}:other"
    told: list[tuple[str, str]] = []
    finished = threading.Event()

    def doomed_options() -> dict[str, Any]:
        # stolen: renewed, and the renewal finds the key gone; expired: not renewed, watched for its end only
        return {"ttl": TTL, "renew": True} if how == "stolen" else {"ttl": 0.2, "renew": False}

    if front == "sync":
        def slow(lease: Any) -> None:
            told.append((lease.name, threading.current_thread().name))
            time.sleep(SLOW)
            finished.set()

        with fencelock.connect(standalone.url) as locks:
            lost = locks.acquire(doomed, wait=0, on_lost=slow, **doomed_options())
            kept = locks.acquire(other, ttl=TTL, wait=0, renew=True)
            if how == "stolen":
                raw.delete(f"fencelock:{{{doomed}}}:lock")
            assert finished.wait(SLOW + 3.0)
            assert lost.lost
            assert kept.held, "the other lease was lost while the callback ran"
            assert lock_value(raw, other) == kept.token
            kept.release()
        assert told == [(doomed, "fencelock-callbacks")]  # once, off the watchdog's thread
    else:
        async def main() -> None:
            async def slow(lease: Any) -> None:  # a coroutine callback: run as a task
                told.append((lease.name, "task"))
                await asyncio.sleep(SLOW)
                finished.set()

            async with fencelock.aio.connect(standalone.url) as locks:
                lost = await locks.acquire(doomed, wait=0, on_lost=slow, **doomed_options())
                kept = await locks.acquire(other, ttl=TTL, wait=0, renew=True)
                if how == "stolen":
                    raw.delete(f"fencelock:{{{doomed}}}:lock")
                assert await asyncio.to_thread(finished.wait, SLOW + 3.0), "the coroutine callback never ran"
                assert lost.lost
                assert kept.held
                assert lock_value(raw, other) == kept.token
                await kept.release()

        asyncio.run(main())
        assert told == [(doomed, "task")]
