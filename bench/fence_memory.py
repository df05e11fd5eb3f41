"""`python -m bench.fence_memory [--names N]`: Redis memory per held name and per idle name, then after expiry.

On a Redis of its own (no persistence): `INFO memory` `used_memory` before, with N leases held, after releasing
them all (each name keeps its fence key, with an expiry), with those fence keys made persistent (what fencelock
kept for ever before `fence_retention`), and once a short retention has let every fence key expire.
It prints one JSON object; the figures go to `docs/design/fences.md`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisServer

RETENTION = 5.0  # seconds: short, so that the run also shows the memory coming back


def _used(raw: Any) -> int:
    return int(raw.info("memory")["used_memory"])


def measure(names: int) -> dict[str, Any]:
    with RedisServer(name="fence-memory") as server:
        raw = server.client()
        locks = fencelock.connect(server.url, fence_retention=RETENTION)
        every = [f"orders:{i}" for i in range(names)]
        locks.acquire("warm-up", ttl=60.0, wait=0).release()  # scripts loaded, connection made
        raw.delete(redis_keys("warm-up").fence)
        base = _used(raw)
        leases = [locks.acquire(name, ttl=600.0, wait=0) for name in every]
        held = _used(raw)
        for lease in leases:
            lease.release()
        idle = _used(raw)
        pipe = raw.pipeline(transaction=False)
        for name in every:
            pipe.persist(redis_keys(name).fence)
        pipe.execute()
        persistent = _used(raw)
        for name in every:  # expire again, as fencelock would have set it
            pipe.pexpire(redis_keys(name).fence, round(RETENTION * 1000))
        pipe.execute()
        deadline = time.monotonic() + 120.0
        while raw.dbsize() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = int(raw.dbsize())
        after = _used(raw)
        locks.close()
        return {
            "names": names, "server": f"{server.binary} {'.'.join(map(str, server.version))}",
            "bytes_per_held_name": round((held - base) / names, 1),
            "bytes_per_idle_name_with_expiry": round((idle - base) / names, 1),
            "bytes_per_idle_name_without_expiry": round((persistent - base) / names, 1),
            "keys_left_after_retention": left,
            "bytes_left_per_name_after_retention": round((after - base) / names, 1),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fence_memory")
    parser.add_argument("--names", type=int, default=100_000)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.names), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
