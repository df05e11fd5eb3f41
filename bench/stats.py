"""Small statistics over the measured samples (standard library only)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from itertools import pairwise


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) by the nearest-rank method: always a value that was really measured."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def overlaps(intervals: Sequence[tuple[float, float]]) -> int:
    """How many critical sections began before an earlier-begun one had ended (0 for a correct lock).

    Each interval is (enter, exit) on CLOCK_MONOTONIC, which is one clock for every process on Linux. Both ends lie
    strictly inside the time the worker held the lock (after acquire returned, before release was sent).
    """
    count = 0
    latest_exit = -math.inf
    for enter, leave in sorted(intervals):
        if enter < latest_exit:
            count += 1
        latest_exit = max(latest_exit, leave)
    return count


def gaps(intervals: Sequence[tuple[float, float]]) -> list[float]:
    """Idle time between one critical section's end and the next one's start: the cost of a hand-off
    (release round trip + wake-up + acquire round trip), whoever gets the lock next."""
    return [max(0.0, nxt[0] - cur[1]) for cur, nxt in pairwise(sorted(intervals))]
