"""What the suite's tests share: the bad arguments every client refuses, and small helpers."""

from __future__ import annotations

import math
import time
from typing import Any

import fencelock

from ..deployment import Deployment

BAD_ARGUMENTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"ttl": 0}, ValueError, "ttl"), ({"ttl": -1.0}, ValueError, "ttl"), ({"ttl": math.nan}, ValueError, "ttl"),
    ({"ttl": math.inf}, ValueError, "ttl"), ({"ttl": True}, TypeError, "ttl"), ({"ttl": "30"}, TypeError, "ttl"),
    ({"ttl": None}, TypeError, "ttl"), ({"wait": -1}, ValueError, "wait"), ({"wait": math.nan}, ValueError, "wait"),
    ({"wait": False}, TypeError, "wait"), ({"wait": "5"}, TypeError, "wait"),
]
"""Arguments every client refuses, the error, and the argument its message names (with the lock)."""

BAD_NAMES: list[tuple[Any, type[Exception]]] = [("", ValueError), (None, TypeError), (42, TypeError),
                                                (b"orders", TypeError)]


def _ttl(deployment: Deployment, ttl: float) -> float:
    """`ttl`, or the service's shortest TTL if that is longer (for tests that let a lease run out)."""
    return max(deployment.min_ttl, ttl)


def _wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)


def _release_again(lease: Any) -> None:
    """A release that got no answer (a member failing over, a session moving): release again, as a careful
    worker does with the error's lease, a few times. Until then the lock stays held, never given to two."""
    for attempt in range(5):
        try:
            lease.release()
            return
        except fencelock.BackendError:
            if attempt == 4:
                raise
            time.sleep(0.5)


def _contend(target: Any, name: str, rounds: int, start: Any, results: Any) -> None:
    """One process of the contention test: take `name` `rounds` times; report (fence, entered, left) each time."""
    locks = fencelock.connect(target)
    out: list[tuple[int, float, float]] = []
    try:
        start.wait(60)
        for _ in range(rounds):
            try:
                with locks.lock(name, ttl=10.0, wait=30.0) as lease:
                    entered = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
                    time.sleep(0.002)
                    out.append((lease.fence, entered, time.monotonic()))
            except fencelock.BackendError as exc:
                if exc.lease is None:
                    raise
                _release_again(exc.lease)
    finally:
        locks.close()
        results.put(out)
