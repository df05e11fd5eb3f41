"""What only the Redis family shows about the lock: how many scripts a waiter runs, and redis-py clients passed in.
Everything every backend shares is in the conformance suite (`fencelock.testing.conformance`)."""

from __future__ import annotations

import threading
import time
from typing import Any

import fencelock

from .conftest import RedisFamily


def test_a_waiter_is_woken_by_the_release_not_by_polling(locks: fencelock.Locks, name: str,
                                                         deployment: RedisFamily) -> None:
    holder = locks.acquire(name, ttl=10.0, wait=0)
    timer = threading.Timer(0.6, holder.release)
    before = _calls(deployment, "evalsha")
    started = time.monotonic()
    timer.start()
    waiter = locks.acquire(name, ttl=5.0, wait=5.0)
    woke = time.monotonic() - started
    timer.join()
    # minus the holder's release; Redlock sends each request to every node
    attempts = (_calls(deployment, "evalsha") - before) // deployment.nodes_per_request - 1
    assert 0.6 <= woke < 0.7, woke
    assert attempts <= 3, f"{attempts} acquire attempts while waiting 0.6 s: that is polling"
    waiter.release()


def test_a_redis_client_can_be_passed_in_and_is_not_closed(deployment: RedisFamily, name: str) -> None:
    target = deployment.redis_target()
    locks = fencelock.connect(target)
    with locks.lock(name, ttl=5.0, wait=0) as lease:
        assert lease.fence >= 1
    locks.close()
    for raw in deployment.raws():
        assert raw.ping()


def _calls(deployment: RedisFamily, command: str) -> int:
    """How many times `command` ran, summed over the deployment's nodes (INFO commandstats)."""
    total = 0
    for raw in deployment.raws():
        stats: Any = raw.info("commandstats")
        per_node = stats.values() if deployment.kind == "cluster" else [stats]
        total += sum(int(node.get(f"cmdstat_{command}", {}).get("calls", 0)) for node in per_node)
    return total
