"""Mutual exclusion and fence order: contending threads, processes and tasks, waiters, fair queues, the guard."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import fencelock

from ..deployment import Deployment
from ..timing import slack
from ._helpers import _contend, _ttl, _wait_until


class ExclusionTests:
    """One holder at a time, fences in grant order, waiters served as promised; part of `ConformanceSuite`."""

    # -- contention ---------------------------------------------------------------------------------------------

    def test_mutual_exclusion_and_fence_order_under_contention(self, deployment: Deployment, name: str) -> None:
        """Threads with their own clients contend; critical sections never overlap and fences follow grant order."""
        inside = 0
        overlaps = 0
        grants: list[int] = []
        guard = threading.Lock()

        def worker() -> None:
            nonlocal inside, overlaps
            client = deployment.connect()
            try:
                for _ in range(15):
                    with client.lock(name, ttl=5.0, wait=20.0) as lease:
                        with guard:
                            inside += 1
                            overlaps += inside > 1
                            grants.append(lease.fence)
                        time.sleep(0.001)
                        with guard:
                            inside -= 1
            finally:
                client.close()

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert overlaps == 0
        assert len(grants) == 60
        assert grants == sorted(grants)
        assert len(set(grants)) == 60

    def test_mutual_exclusion_and_fence_order_across_processes(self, deployment: Deployment, name: str) -> None:
        """Processes (spawned: nothing shared but the service) contend; their critical sections, timed on the one
        monotonic clock of the machine, never overlap, and each grant's fence is above the one before it."""
        ctx = multiprocessing.get_context("spawn")
        processes, rounds = 3, 10
        start = ctx.Event()
        results = ctx.Queue()
        workers = [ctx.Process(target=_contend, args=(deployment.target, name, rounds, start, results))
                   for _ in range(processes)]
        for worker in workers:
            worker.start()
        try:
            start.set()
            grants: list[tuple[int, float, float]] = []
            for _ in workers:
                grants += results.get(timeout=90)
        finally:
            for worker in workers:
                worker.join(30)
                if worker.is_alive():
                    worker.kill()
        assert [worker.exitcode for worker in workers] == [0] * processes
        assert len(grants) == processes * rounds
        grants.sort(key=lambda grant: grant[1])
        for (fence, _, left), (next_fence, entered, _) in itertools.pairwise(grants):
            assert left <= entered, f"fences {fence} and {next_fence} were held at the same time"
            assert next_fence > fence, f"fence {next_fence} was granted after {fence}"

    def test_a_waiter_is_woken_by_the_release_at_once(self, locks: fencelock.Locks, name: str) -> None:
        holder = locks.acquire(name, ttl=10.0, wait=0)
        timer = threading.Timer(0.6, holder.release)
        started = time.monotonic()
        timer.start()
        waiter = locks.acquire(name, ttl=5.0, wait=5.0)
        woke = time.monotonic() - started
        timer.join()
        assert 0.6 <= woke < 0.7, woke
        waiter.release()

    def test_a_waiter_retries_when_a_crashed_holders_lease_expires(self, locks: fencelock.Locks, name: str,
                                                                   deployment: Deployment) -> None:
        ttl = _ttl(deployment, 0.4)
        locks.acquire(name, ttl=ttl, wait=0)  # never released: the holder "crashed"
        started = time.monotonic()
        lease = locks.acquire(name, ttl=5.0, wait=5.0 + ttl)
        took = time.monotonic() - started
        assert ttl - 0.05 <= took < ttl + slack(0.15) + deployment.expiry_slack, took
        lease.release()

    def test_asyncio_tasks_sharing_a_client_are_mutually_exclusive(self, deployment: Deployment,
                                                                   name: str) -> None:
        async def main() -> list[int]:
            locks = deployment.aconnect()
            inside = 0
            fences: list[int] = []

            async def task() -> None:
                nonlocal inside
                for _ in range(10):
                    async with locks.lock(name, ttl=5.0, wait=20.0) as lease:
                        inside += 1
                        assert inside == 1
                        fences.append(lease.fence)
                        await asyncio.sleep(0.001)
                        inside -= 1

            try:
                await asyncio.gather(*(task() for _ in range(5)))
            finally:
                await locks.aclose()
            return fences

        fences = asyncio.run(main())
        assert fences == sorted(fences)
        assert len(set(fences)) == 50

    # -- fair waiting -------------------------------------------------------------------------------------------

    def test_fair_waiters_are_served_in_arrival_order_or_fair_is_refused(self, locks: fencelock.Locks, name: str,
                                                                         deployment: Deployment) -> None:
        with pytest.raises(TypeError, match="fair must be True or False"):
            locks.acquire(name, fair="yes")  # type: ignore[arg-type]
        if not deployment.supports_fair:
            with pytest.raises(ValueError, match=r"fair=True .*lock"):
                locks.acquire(name, fair=True)
            with pytest.raises(ValueError, match=r"fair=True .*lock"):
                locks.lock(name, fair=True)
            return
        holder = locks.acquire(name, ttl=10.0, wait=0)
        order: list[int] = []

        def waiter(i: int) -> None:
            client = deployment.connect()
            try:
                with client.lock(name, ttl=5.0, wait=20.0, fair=True):
                    order.append(i)
                    time.sleep(0.01)
            finally:
                client.close()

        threads = []
        for i in range(4):
            threads.append(threading.Thread(target=waiter, args=(i,)))
            threads[-1].start()
            if deployment.queued(name) is None:
                time.sleep(0.3)  # the deployment cannot count its queue: give the waiter time to join it
            else:
                _wait_until(lambda i=i: (deployment.queued(name) or 0) >= i + 1, 5.0, f"waiter {i} joining")
        holder.release()
        for thread in threads:
            thread.join()
        assert order == list(range(4))

    # -- guards -------------------------------------------------------------------------------------------------

    def test_sql_guard_rejects_the_writer_that_paused_past_its_ttl(self, locks: fencelock.Locks, name: str,
                                                                   deployment: Deployment, tmp_path: Path) -> None:
        db = sqlite3.connect(tmp_path / "bank.db")
        guard = fencelock.SQLGuard()
        with db:
            db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT NOT NULL)")
            db.execute("INSERT INTO accounts VALUES (42, 'nobody')")
            guard.create_table(db.cursor())

        def write(fence: int, owner: str) -> None:
            with db:  # one transaction: the guard's check and the write commit together, or neither does
                cur = db.cursor()
                guard.check(cur, name, fence)
                cur.execute("UPDATE accounts SET owner = ? WHERE id = 42", (owner,))

        a = locks.acquire(name, ttl=_ttl(deployment, 0.2), wait=0)
        time.sleep(a.ttl + 0.1 + deployment.expiry_slack)  # A stops (a GC pause, a stalled VM) past its TTL
        assert a.remaining() == 0.0
        b = locks.acquire(name, ttl=5.0, wait=0)
        write(b.fence, "B")
        with pytest.raises(fencelock.StaleFence) as info:
            write(a.fence, "A")
        assert info.value.fence == a.fence
        assert info.value.highest == b.fence
        assert info.value.name == name
        assert db.execute("SELECT owner FROM accounts WHERE id = 42").fetchone() == ("B",)
        assert guard.highest(db.cursor(), name) == b.fence
        write(b.fence, "B again")  # the current holder may write many times
        b.release()
        db.close()
