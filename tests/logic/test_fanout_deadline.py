"""The fan-out's deadline judges the servers, not how busy the client was: a reply that arrived before the deadline
counts even when the client, busy with its own work, could only read it after (the CI run where three healthy Redlock
nodes were reported slow in a burst of 600 acquires). No server: calls that finish on the event loop's own events."""

from __future__ import annotations

import asyncio
import time

from fencelock._async._fanout import fan_out

TIMEOUT = 0.35


def test_a_reply_that_arrived_before_the_deadline_counts_though_the_client_read_it_after() -> None:
    """The reply arrives at 0.30 s, while the client is busy from 0.25 s to just past the 0.35 s deadline (less
    than it counts as oversleeping): the deadline's own wake-up and the reply's come in the same turn of the loop,
    and the reply still takes two more turns to reach the fan-out."""
    order: list[str] = []

    async def main() -> dict[int, str]:
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()

        async def call() -> str:
            await arrived.wait()
            await asyncio.sleep(0)  # (a reply's way from its socket to its caller: a few turns of the loop)
            await asyncio.sleep(0)
            order.append("reply read")
            return "yes"

        def busy() -> None:
            order.append("client busy")
            time.sleep(TIMEOUT - 0.25 + 0.01)  # until 10 ms past the deadline

        def arrive() -> None:
            order.append("reply arrived")
            arrived.set()

        loop.call_later(0.25, busy)
        loop.call_later(0.30, arrive)
        done, _ = await fan_out([call], TIMEOUT, lambda so_far: len(so_far) == 1)
        order.append("fan-out returned")
        return done

    done = asyncio.run(main())
    assert order == ["client busy", "reply arrived", "reply read", "fan-out returned"]
    assert done == {0: "yes"}


def test_a_reply_that_never_comes_still_ends_the_wait_at_its_deadline() -> None:
    """Nothing busy and no reply: the fan-out returns without it, at the deadline (reading what was received takes
    no time of its own)."""

    async def main() -> tuple[dict[int, str], float]:
        never = asyncio.Event()

        async def call() -> str:
            await never.wait()
            return "late"

        began = time.monotonic()
        done, handles = await fan_out([call], TIMEOUT, lambda so_far: len(so_far) == 1)
        took = time.monotonic() - began
        for handle in handles:
            handle.cancel()
        return done, took

    done, took = asyncio.run(main())
    assert done == {}
    assert TIMEOUT <= took < TIMEOUT + 0.2
