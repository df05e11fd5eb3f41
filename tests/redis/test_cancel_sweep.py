"""asyncio cancellation anywhere in an acquire, not only while a reply is awaited: at 40 points, the first turns of
the event loop and then spread across the acquire's own duration, on a healthy server, after replies lost to
resets (the acquire backs off between attempts), and while it waits for a rival that hands the lock over during
the sweep (plain and fair). (A cancellation in the back-off itself: `test_faults.py`.)

Invariant, checked by an independent client on the server: whatever k, the lock is free again long before the
cancelled attempt's TTL (a second client acquires it, and then no key and no queue entry stays; a request of the
attempt still on its way may land, and is undone right after), and an acquire that finished before its
cancellation came returns a lease that releases normally."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock.testing.faults import RESET_AFTER, FaultProxy, Rule
from fencelock.testing.servers import RedisServer
from fencelock.testing.timing import slack
from tests.conftest import RedisFamily

TTL = 30.0           # the cancelled attempt's: the TTL never frees the lock within the test
POINTS = 40          # cancellation points per variant: the first few turns of the loop, then spread in time
TURNS = 8
HAND_OFF = 0.005     # the held variants: the rival releases this long after the acquire began


async def _eventually(condition: Callable[[], bool]) -> bool:
    loop = asyncio.get_running_loop()
    ends = loop.time() + slack(2.0)
    while not condition():
        if loop.time() > ends:
            return False
        await asyncio.sleep(0.01)
    return True


async def _point(k: int, span: float) -> None:
    """The k-th cancellation point: k turns of the loop, then (k - TURNS) steps across `span` seconds."""
    if k < TURNS:
        for _ in range(k):
            await asyncio.sleep(0)
    else:
        await asyncio.sleep((k - TURNS) * span / (POINTS - TURNS))


async def _attempt(locks: fencelock.aio.Locks, other: fencelock.aio.Locks, proxy: FaultProxy | None, name: str,
                   variant: str, k: int | None, span: float) -> tuple[Any, bool, float]:
    """One acquire under `variant`, cancelled at point k (None: not cancelled); (its lease or None, whether it
    was still running when cancelled, how long it ran)."""
    rival = await other.acquire(name, ttl=TTL, wait=0) if variant.startswith("held") else None
    if proxy is not None and variant == "reset":  # the attempt and its resend run, their replies are lost
        for nth in (1, 2):
            proxy.arm(Rule(RESET_AFTER, "acquire", nth=nth))
    hand_off = None
    if rival is not None:
        async def give_up_the_lock() -> None:
            await asyncio.sleep(HAND_OFF)
            await rival.release()
        hand_off = asyncio.ensure_future(give_up_the_lock())
    started = asyncio.get_running_loop().time()
    task = asyncio.ensure_future(locks.acquire(name, ttl=TTL, wait=None, fair=variant == "held_fair"))
    running = True
    if k is not None:
        await _point(k, span)
        running = not task.done()
        task.cancel()
    try:
        lease = await task
    except asyncio.CancelledError:
        lease = None
    took = asyncio.get_running_loop().time() - started
    if proxy is not None:
        proxy.clear()
    if hand_off is not None:
        await hand_off
    return lease, running, took


async def _cancel_at(locks: fencelock.aio.Locks, other: fencelock.aio.Locks, proxy: FaultProxy | None,
                     left: Callable[[str], list[str]], name: str, variant: str, k: int, span: float) -> bool:
    """One cancellation at point k, then the invariant (`left(name)`: what the servers still hold of `name`);
    True if the acquire was still running when the cancellation came."""
    lease, running, _ = await _attempt(locks, other, proxy, name, variant, k, span)
    if lease is not None:  # done before the cancellation came: a lease like any other
        await lease.release()
    free = await other.acquire(name, ttl=5.0, wait=slack(5.0))  # long before the cancelled attempt's TTL
    await free.release()
    # A request of the cancelled attempt still on its way when the cancellation returned (connecting, or on the
    # wire) may land after this; its undo follows it at once. (Redlock: a release returns at its quorum, the other
    # nodes' parts land just after.) What must not happen is a key that stays.
    assert await _eventually(lambda: not left(name)), (variant, k, left(name))
    return running


async def _sweep(locks: fencelock.aio.Locks, other: fencelock.aio.Locks, proxy: FaultProxy | None,
                 left: Callable[[str], list[str]], name: str, variant: str) -> int:
    """Every point of the sweep, spread across an uncancelled acquire's own duration; how many came while the
    acquire was still running."""
    lease, _, took = await _attempt(locks, other, proxy, f"{name}:measure", variant, None, 0.0)
    await lease.release()
    span = 1.5 * took  # the points cover the whole acquire (for the held ones, the hand-off too)
    running = 0
    for k in range(POINTS):
        running += await _cancel_at(locks, other, proxy, left, f"{name}:{k}", variant, k, span)
    return running


@pytest.mark.parametrize("variant", ["healthy", "reset", "held", "held_fair"])
def test_a_cancellation_at_any_point_of_an_acquire_leaves_the_lock_free(own_server: RedisServer, name: str,
                                                                     variant: str) -> None:
    with FaultProxy("127.0.0.1", own_server.port) as proxy:

        async def main() -> int:
            url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=2"
            locks, other = fencelock.aio.connect(url), fencelock.aio.connect(own_server.url)
            raw = own_server.client()

            def left(lock: str) -> list[str]:
                return [key for key in (redis_keys(lock).lock, redis_keys(lock).queue) if raw.exists(key)]

            try:
                return await _sweep(locks, other, proxy, left, name, variant)
            finally:
                await locks.aclose()
                await other.aclose()
                raw.close()

        running = asyncio.run(main())
    assert running >= 3, running  # the sweep really cancelled acquires under way, at several points


@pytest.mark.parametrize("variant", ["healthy", "held", "held_fair"])
def test_the_same_sweep_on_every_redis_deployment(deployment: RedisFamily, name: str, variant: str) -> None:
    """Single Redis, Cluster and Redlock (whose attempt is a fan-out with a give-back per node), no faults."""
    if variant == "held_fair" and not deployment.supports_fair:
        variant = "held"  # Redlock has no fair mode: its plain wait once more

    def left(lock: str) -> list[str]:
        holder = deployment.holder(lock)
        return ([] if holder is None else [f"held by {holder}"]) + (deployment.leftovers(lock) or [])

    async def main() -> int:
        locks, other = deployment.aconnect(), deployment.aconnect()
        try:
            return await _sweep(locks, other, None, left, name, variant)
        finally:
            await locks.aclose()
            await other.aclose()

    assert asyncio.run(main()) >= 3
