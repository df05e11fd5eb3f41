"""An `on_lost` callback may call back into its lease and client (release it, ask for its status, extend it):
it runs after the call that found the loss has ended its turn on the lease, never inside it. Before, in the
synchronous API, a callback run by `extend()` or `release()` that called `lease.release()` waited for that very
call's turn, in the same thread: for ever.

A real Redis; the lease's key is deleted by an independent client, so that the holder's own call finds it gone.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock.testing.servers import RedisServer
from fencelock.testing.timing import slack

BOUND = 5.0  # seconds the whole call, callback included, may take at most (each step is a round trip)


def _lock_key(name: str) -> str:
    return f"fencelock:{{{name}}}:lock"


def _reentering(locks: Any, seen: list[str]) -> Callable[[Any], None]:
    """A callback that releases its lease, asks for its status and tries to extend it, recording each outcome."""
    def on_lost(lease: Any) -> None:
        for step, call in (("release", lease.release), ("status", lambda: locks.status(lease.name)),
                           ("extend", lease.extend)):
            try:
                call()
            except fencelock.LockLost:
                seen.append(f"{step}: LockLost")
            else:
                seen.append(f"{step}: ok")

    return on_lost


def _bounded(work: Callable[[], None]) -> None:
    """Run `work` on a thread of its own; fail (rather than hang the suite) unless it ends within BOUND."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(slack(BOUND))
    assert not thread.is_alive(), "the call whose on_lost called back into the lease never returned (deadlock)"
    if failed:
        raise failed[0]


@pytest.mark.parametrize("found_by", ["extend", "release"])
def test_sync_an_on_lost_that_calls_back_into_the_lease_runs_after_the_call_and_never_hangs(
        standalone: RedisServer, name: str, found_by: str) -> None:
    raw: Any = standalone.client()
    seen: list[str] = []
    with fencelock.connect(standalone.url) as locks:
        lease = locks.acquire(name, ttl=10.0, wait=0, on_lost=_reentering(locks, seen))
        raw.delete(_lock_key(name))

        def call() -> None:
            with pytest.raises(fencelock.LockLost):
                getattr(lease, found_by)()
            seen.append(f"{found_by} returned")

        _bounded(call)
    # Once, in the caller's thread, before its call returned; each call back got its answer.
    assert seen == ["release: LockLost", "status: ok", "extend: LockLost", f"{found_by} returned"]


@pytest.mark.parametrize("found_by", ["extend", "release"])
def test_asyncio_an_on_lost_that_calls_back_into_the_lease_never_hangs(standalone: RedisServer, name: str,
                                                                       found_by: str) -> None:
    raw: Any = standalone.client()
    seen: list[str] = []

    async def main() -> None:
        finished = asyncio.Event()
        async with fencelock.aio.connect(standalone.url) as locks:
            async def on_lost(lease: Any) -> None:
                for step, call in (("release", lease.release), ("status", lambda: locks.status(lease.name)),
                                   ("extend", lease.extend)):
                    try:
                        await call()
                    except fencelock.LockLost:
                        seen.append(f"{step}: LockLost")
                    else:
                        seen.append(f"{step}: ok")
                finished.set()

            lease = await locks.acquire(name, ttl=10.0, wait=0, on_lost=on_lost)
            raw.delete(_lock_key(name))
            with pytest.raises(fencelock.LockLost):
                await getattr(lease, found_by)()
            seen.append(f"{found_by} returned")
            await asyncio.wait_for(finished.wait(), slack(BOUND))

    asyncio.run(main())
    assert seen == [f"{found_by} returned", "release: LockLost", "status: ok", "extend: LockLost"]


def test_sync_an_on_lost_found_by_the_watchdog_may_call_back_into_the_lease(standalone: RedisServer,
                                                                            name: str) -> None:
    raw: Any = standalone.client()
    seen: list[str] = []
    told = threading.Event()
    with fencelock.connect(standalone.url) as locks:
        reentering = _reentering(locks, seen)

        def on_lost(lease: Any) -> None:
            reentering(lease)
            told.set()

        locks.acquire(name, ttl=0.6, wait=0, renew=True, on_lost=on_lost)
        raw.delete(_lock_key(name))  # the next renewal finds it gone
        assert told.wait(slack(BOUND))
    assert seen == ["release: LockLost", "status: ok", "extend: LockLost"]
