"""A burst of acquires on distinct names through one etcd client (issue 14; decision 2026-12-05-etcd-burst).

    PYTHONPATH=src python -m bench.etcd_burst [--n 2000] [--ttl 30] [--threads] [--cap 8]

Starts its own etcd member (data in memory), holds one lease renewed every 1/3 s (ttl 1 s), and acquires `--n`
names at once through the same client (asyncio tasks, or threads with `--threads`). Prints the outcomes, the time
the burst took, the slowest renewal and whether the held lease was lost. `--cap` replaces the client's
`MAX_IN_FLIGHT` (requests out at once), to compare caps.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fencelock
from fencelock._async import etcd_gateway as async_gateway
from fencelock._sync import etcd_gateway as sync_gateway
from fencelock.testing.etcd import EtcdServer


def _kind(outcome: object) -> str:
    if isinstance(outcome, BaseException):
        return f"{type(outcome).__name__}: " + re.sub(r"[0-9.:]+|\(lock .*", "#", str(outcome))[:80]
    return "granted"


def _report(n: int, took: float, outcomes: list[object], renewals: list[float], lost: list[object]) -> None:
    counts = collections.Counter(_kind(outcome) for outcome in outcomes)
    print(f"{n} acquires in {took:.2f} s: {dict(counts.most_common(4))}")
    print(f"held lease: {'LOST' if lost else 'kept'}; slowest renewal {max(renewals, default=0.0) * 1000:.0f} ms "
          f"of {len(renewals)}")


def _timed_renewals(backend: Any, renewals: list[float], threads: bool) -> None:
    extend_many = backend.extend_many
    if threads:
        def timed(leases: Any) -> Any:
            started = time.monotonic()
            try:
                return extend_many(leases)
            finally:
                renewals.append(time.monotonic() - started)
        backend.extend_many = timed
        return

    async def timed_async(leases: Any) -> Any:
        started = time.monotonic()
        try:
            return await extend_many(leases)
        finally:
            renewals.append(time.monotonic() - started)
    backend.extend_many = timed_async


async def _tasks(url: str, n: int, ttl: float) -> None:
    locks = fencelock.aio.connect(url)
    lost: list[object] = []
    renewals: list[float] = []
    _timed_renewals(locks.backend, renewals, threads=False)
    try:
        held = await locks.acquire("bench:held", ttl=1.0, renew=True, on_lost=lost.append)
        started = time.monotonic()
        outcomes: list[object] = list(await asyncio.gather(
            *(locks.acquire(f"bench:{i}", ttl=ttl) for i in range(n)), return_exceptions=True))
        _report(n, time.monotonic() - started, outcomes, renewals, lost)
        await asyncio.gather(*(outcome.release() for outcome in outcomes
                               if isinstance(outcome, fencelock.aio.Lease)), return_exceptions=True)
        if not lost:
            await held.release()
    finally:
        await locks.aclose()


def _threads(url: str, n: int, ttl: float) -> None:
    locks = fencelock.connect(url)
    lost: list[object] = []
    renewals: list[float] = []
    _timed_renewals(locks.backend, renewals, threads=True)
    try:
        held = locks.acquire("bench:held", ttl=1.0, renew=True, on_lost=lost.append)
        start = threading.Barrier(n + 1)

        def acquire(i: int) -> object:
            start.wait()
            try:
                return locks.acquire(f"bench:{i}", ttl=ttl)
            except fencelock.LockError as exc:
                return exc

        with ThreadPoolExecutor(n) as pool:
            pending = [pool.submit(acquire, i) for i in range(n)]
            start.wait()
            started = time.monotonic()
            outcomes = [each.result() for each in pending]
        _report(n, time.monotonic() - started, outcomes, renewals, lost)
        for outcome in outcomes:
            if isinstance(outcome, fencelock.Lease):
                outcome.release()
        if not lost:
            held.release()
    finally:
        locks.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--threads", action="store_true")
    parser.add_argument("--cap", type=int, default=None)
    args = parser.parse_args()
    if args.cap is not None:
        async_gateway.MAX_IN_FLIGHT = sync_gateway.MAX_IN_FLIGHT = args.cap
    logging.getLogger("fencelock").setLevel(logging.ERROR)  # (leases that ran out before their release are lost)
    with EtcdServer(memory=True) as server:
        if args.threads:
            _threads(server.url, args.n, args.ttl)
        else:
            asyncio.run(_tasks(server.url, args.n, args.ttl))


if __name__ == "__main__":
    main()
