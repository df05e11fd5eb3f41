"""`python -m bench.front_ends [--quick]` (also `python -m bench --only front_ends`): what a sync front end costs
if it runs the asyncio client on a loop thread of its own, against the generated sync client (the design that
would remove the hand-written twins: docs/decisions/2026-12-06-hand-written-twins.md).

    sync            the generated synchronous client
    loop thread     `fencelock.aio` on an event loop in a thread, each call handed over and waited for
    asyncio         `fencelock.aio` awaited in a coroutine

One client's uncontended acquire + release cycle on one local Redis; each figure is the median over interleaved
rounds of the mean cycle in a round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import fencelock
import fencelock.aio
from fencelock.testing.servers import RedisServer

T = TypeVar("T")

NAME = "bench:front-ends"


@dataclass(frozen=True)
class FrontEnd:
    label: str
    cycle_us: float  # median per acquire + release cycle
    cycles: int  # per round
    rounds: int


def _sync(url: str, cycles: int) -> float:
    locks = fencelock.connect(url)
    try:
        for _ in range(min(cycles, 50)):  # warm-up: connections made, scripts loaded
            locks.acquire(NAME, ttl=10.0, wait=0, renew=False).release()
        began = time.perf_counter()
        for _ in range(cycles):
            locks.acquire(NAME, ttl=10.0, wait=0, renew=False).release()
        return (time.perf_counter() - began) / cycles * 1e6
    finally:
        locks.close()


def _loop_thread(url: str, cycles: int) -> float:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-loop", daemon=True)
    thread.start()

    def call(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    async def connect() -> fencelock.aio.Locks:
        return fencelock.aio.connect(url)

    locks = call(connect())
    try:
        def cycle() -> None:
            lease = call(locks.acquire(NAME, ttl=10.0, wait=0, renew=False))
            call(lease.release())

        for _ in range(min(cycles, 50)):
            cycle()
        began = time.perf_counter()
        for _ in range(cycles):
            cycle()
        return (time.perf_counter() - began) / cycles * 1e6
    finally:
        call(locks.aclose())
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def _asyncio(url: str, cycles: int) -> float:
    async def main() -> float:
        async with fencelock.aio.connect(url) as locks:
            for _ in range(min(cycles, 50)):
                await (await locks.acquire(NAME, ttl=10.0, wait=0, renew=False)).release()
            began = time.perf_counter()
            for _ in range(cycles):
                await (await locks.acquire(NAME, ttl=10.0, wait=0, renew=False)).release()
            return (time.perf_counter() - began) / cycles * 1e6

    return asyncio.run(main())


RUNS: dict[str, Callable[[str, int], float]] = {"sync": _sync, "loop thread": _loop_thread, "asyncio": _asyncio}


def front_ends_section(quick: bool = False, progress: Callable[[str], None] = lambda _: None) -> list[FrontEnd]:
    cycles, rounds = (500, 3) if quick else (3000, 5)
    found: dict[str, list[float]] = {label: [] for label in RUNS}
    with RedisServer(name="front-ends") as server:
        for index in range(rounds):
            progress(f"front ends: round {index + 1} of {rounds}")
            order = list(RUNS.items())
            for label, run in order if index % 2 == 0 else reversed(order):
                found[label].append(run(server.url, cycles))
    return [FrontEnd(label, statistics.median(values), cycles, rounds) for label, values in found.items()]


def front_ends_table(result: list[FrontEnd]) -> str:
    base = result[0].cycle_us
    lines = ["Front ends: one client's uncontended acquire + release cycle on one local Redis", "",
             f"  {'front end':<14} {'us/cycle':>10} {'x sync':>8}  {'cycles x rounds':>15}"]
    for row in result:
        lines.append(f"  {row.label:<14} {row.cycle_us:>10.0f} {row.cycle_us / base:>8.2f}  "
                     f"{f'{row.cycles} x {row.rounds}':>15}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.front_ends")
    parser.add_argument("--quick", action="store_true", help="fewer cycles (a few seconds)")
    args = parser.parse_args(argv)
    print(front_ends_table(front_ends_section(args.quick, lambda m: print(f"[bench] {m}", file=sys.stderr))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
