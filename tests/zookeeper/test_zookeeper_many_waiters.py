"""Many waiters on one name in one client: every one is granted in turn, each hand-off costing a round trip or two
whatever the queue's length (docs/decisions/2026-12-05-zookeeper-many-waiters.md). With every waiter listing the
whole queue once per blocking period, 1,000 asyncio waiters got about one grant a second (`bench --only burst`)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from fencelock.testing.zookeeper import ZooKeeperDeployment

pytestmark = pytest.mark.alone  # (it loads one client to its limits: no other test runs beside it)


def test_asyncio_a_thousand_waiters_on_one_name_are_all_granted_in_turn(zk: ZooKeeperDeployment,
                                                                        name: str) -> None:
    """1,000 tasks queue behind a holder: all are granted, one at a time, in the queue's order (fences increase),
    well within a wait that the per-waiter listings used to exhaust after a few dozen grants."""
    waiters, wait = 1000, 20.0

    async def main() -> None:
        locks = zk.aconnect()
        try:
            holder = await locks.acquire(name, ttl=30.0, wait=0)
            fences: list[int] = []
            holding = 0
            most = 0

            async def one() -> None:
                nonlocal holding, most
                lease = await locks.acquire(name, ttl=30.0, wait=wait)
                holding += 1
                most = max(most, holding)
                fences.append(lease.fence)
                await asyncio.sleep(0)  # held across an await: another grant now would be two holders at once
                holding -= 1
                await lease.release()

            tasks = [asyncio.ensure_future(one()) for _ in range(waiters)]
            await asyncio.sleep(0.5)
            started = time.monotonic()
            await holder.release()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            took = time.monotonic() - started
            failed = [o for o in outcomes if o is not None]
            assert not failed, f"{len(failed)} of {waiters} not granted in {took:.1f} s: {failed[0]!r}"
            assert most == 1
            assert fences == sorted(fences), "not granted in the queue's order"
            assert len(set(fences)) == waiters
            assert holder.fence < fences[0]
        finally:
            await locks.aclose()

    asyncio.run(main())


def test_threads_two_hundred_waiters_on_one_name_are_all_granted_in_turn(zk: ZooKeeperDeployment,
                                                                         name: str) -> None:
    """The sync front end: 200 threads queue behind a holder on one client, and are granted in the queue's order."""
    waiters, wait = 200, 20.0
    locks = zk.connect()
    try:
        holder = locks.acquire(name, ttl=30.0, wait=0)
        fences: list[int] = []
        errors: list[BaseException] = []
        guard = threading.Lock()

        def one() -> None:
            try:
                lease = locks.acquire(name, ttl=30.0, wait=wait)
            except BaseException as exc:  # reported below
                with guard:
                    errors.append(exc)
                return
            with guard:
                fences.append(lease.fence)
            lease.release()

        threads: list[Any] = [threading.Thread(target=one, daemon=True) for _ in range(waiters)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        holder.release()
        for thread in threads:
            thread.join(wait + 10.0)
        assert not errors, f"{len(errors)} of {waiters} not granted: {errors[0]!r}"
        assert len(fences) == waiters
        assert fences == sorted(fences), "not granted in the queue's order"
    finally:
        locks.close()
