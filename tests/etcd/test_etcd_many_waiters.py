"""Many waiters of one client on one name (issue 14: "Waiters of one client on one name must share a bounded number
of connections, for threads and tasks alike. Every waiter is granted in turn"): they share one watch, each hand-off
wakes only the next waiter, and every one is granted, in queue order (decision 2026-12-05-etcd-many-waiters)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import fencelock
from fencelock._async import etcd_gateway
from fencelock.testing.etcd import EtcdServer
from tests.etcd.helpers import queued

pytestmark = pytest.mark.alone  # (it loads one client to its limits: no other test runs beside it)

WAITERS = 300
"""Waiters on one name through one asyncio client. Before the shared watch each held a connection of its own, and
each refreshed its lease and looked again every `BLOCK_CAP`: the requests crowded out the hand-offs (1,000 waiters:
109 granted in 120 s, the others failed or timed out)."""

WAIT = 60.0


def _connections(locks: fencelock.aio.Locks) -> int:
    """Connections the client's pool holds now (open or connecting)."""
    backend: Any = locks.backend
    return len(backend._gateway._transport._pool.connections)


def test_many_waiters_on_one_name_share_connections_and_are_granted_in_turn(etcd_server: EtcdServer,
                                                                             name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(etcd_server.url)
        fences: list[int] = []

        async def wait_turn() -> None:
            lease = await locks.acquire(name, ttl=30, wait=WAIT)
            fences.append(lease.fence)
            await lease.release()

        try:
            holder = await locks.acquire(name, ttl=30)
            tasks = [asyncio.ensure_future(wait_turn()) for _ in range(WAITERS)]
            await queued(locks, name, WAITERS, timeout=30)
            most = 0
            for _ in range(10):  # every waiter is blocked now: their watches are what holds connections
                most = max(most, _connections(locks))
                await asyncio.sleep(0.1)
            started = time.monotonic()
            await holder.release()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            took = time.monotonic() - started
            errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
            assert not errors, f"{len(errors)} of {WAITERS} failed in {took:.1f} s, e.g. {errors[0]!r}"
            assert fences == sorted(fences), "not granted in queue order"
            assert most <= etcd_gateway.MAX_IN_FLIGHT + 2, f"{most} connections for {WAITERS} waiters on one name"
        finally:
            await locks.aclose()

    asyncio.run(main())


THREADS = 100


def test_many_waiting_threads_on_one_name_share_connections_and_are_granted_in_turn(etcd_server: EtcdServer,
                                                                                    name: str) -> None:
    locks = fencelock.connect(etcd_server.url)
    fences: list[int] = []
    errors: list[BaseException] = []

    def wait_turn() -> None:
        try:
            lease = locks.acquire(name, ttl=30, wait=WAIT)
            fences.append(lease.fence)
            lease.release()
        except BaseException as exc:  # (reported by the test's thread)
            errors.append(exc)

    try:
        holder = locks.acquire(name, ttl=30)
        threads = [threading.Thread(target=wait_turn) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while (locks.status(name).queued or 0) < THREADS and time.monotonic() < deadline:
            time.sleep(0.05)
        backend: Any = locks.backend
        most = 0
        for _ in range(10):
            most = max(most, len(backend._gateway._transport._pool.connections))
            time.sleep(0.1)
        holder.release()
        for thread in threads:
            thread.join(WAIT + 10)
        assert not errors, f"{len(errors)} of {THREADS} failed, e.g. {errors[0]!r}"
        assert len(fences) == THREADS
        assert fences == sorted(fences), "not granted in queue order"
        assert most <= etcd_gateway.MAX_IN_FLIGHT + 2, f"{most} connections for {THREADS} waiting threads"
    finally:
        locks.close()
