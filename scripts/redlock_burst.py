r"""A burst of concurrent acquires through one asyncio Redlock client on three local nodes (issue 14): for each count,
how many were granted, in how long, whether a node was reported out, whether a 1 s lease of the same client
(renewed) was lost, and the least validity a lease had left at its grant (TTL 30 s; at most 29.698 s after drift).

    PYTHONPATH=src .venv/bin/python scripts/redlock_burst.py 300 600 1200 2000 5000

Numbers: docs/decisions/2026-12-05-redlock-burst.md.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import fencelock
import fencelock.aio
from fencelock.testing.redis_deployments import initialise_redlock
from fencelock.testing.servers import RedisNodes


async def burst(urls: list[str], count: int) -> str:
    errors: list[BaseException] = []
    outs: list[Any] = []
    lost: list[Any] = []
    left: list[float] = []
    unsubscribe = fencelock.subscribe(lambda event: outs.append(event) if event.kind == "node_out" else None)
    try:
        async with fencelock.aio.connect(urls) as locks:
            await locks.acquire(f"keeper:{count}", ttl=1.0, wait=0, renew=True, on_lost=lost.append)

            async def one(i: int) -> None:
                try:
                    left.append((await locks.acquire(f"burst:{count}:{i}", ttl=30.0, wait=10.0)).remaining())
                except Exception as exc:
                    errors.append(exc)

            began = time.monotonic()
            await asyncio.gather(*(one(i) for i in range(count)))
            took = time.monotonic() - began
    finally:
        unsubscribe()
    kinds = sorted({type(exc).__name__ for exc in errors})
    return (f"N={count}: {count - len(errors)} granted, {len(errors)} failed {kinds} in {took:.2f} s; "
            f"node_out events {len(outs)}; 1 s lease lost: {bool(lost)}; "
            f"least validity left at a grant {min(left) if left else float('nan'):.3f} s")


def main(counts: list[int]) -> None:
    nodes = RedisNodes(3).start()
    try:
        initialise_redlock(nodes.urls)
        for count in counts:
            print(asyncio.run(burst(nodes.urls, count)), flush=True)
    finally:
        nodes.close()


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [300, 600, 1200, 2000])
