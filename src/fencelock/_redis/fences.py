"""How a single Redis (or one Cluster shard) hands out fences, and how long it keeps a name's fence state.

`next_fence` is the specification of the grant step in `_scripts/acquire.lua` and `_scripts/fair_acquire.lua`:
the stored counter orders grants while it survives, the server's clock orders them after it was lost (a restart
without persistence, a failover to a replica that missed the last writes, or the fence key's own expiry).
The assumption and what a clock step does are in `docs/design/fences.md`.
"""

from __future__ import annotations

import math

from .._logic.args import seconds_of, ttl_ms

EXACT_IN_LUA = 2**53
"""Below this a Lua number (a double) holds an integer exactly; the clock floor (µs since 1970) stays far below."""

DEFAULT_FENCE_RETENTION = 7 * 24 * 3600.0
"""Seconds a name's fence state outlives its last grant or extension (see `docs/design/fences.md`)."""

MAX_FENCE_RETENTION_MS = EXACT_IN_LUA - 1
"""Milliseconds: the largest retention the scripts compute with exactly (PEXPIRE's own limit is higher)."""


def next_fence(stored: int | None, now_us: int) -> int:
    """The fence of a new grant: above the stored counter (None: none survived), and at least the clock floor."""
    return max((stored or 0) + 1, now_us)


def clock_us(seconds: int, micros: int) -> int:
    """The clock floor from Redis `TIME`'s two fields: microseconds since 1970."""
    return seconds * 1_000_000 + micros


def check_fence_retention(value: object) -> float:
    """`fence_retention`: a finite number of seconds > 0 that fits PEXPIRE in whole milliseconds."""
    number = seconds_of(value, "fence_retention")
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"fence_retention must be a finite number of seconds > 0, got {value!r}")
    if number > MAX_FENCE_RETENTION_MS / 1000.0 or ttl_ms(number) > MAX_FENCE_RETENTION_MS:
        raise ValueError(f"fence_retention must be at most {MAX_FENCE_RETENTION_MS // 1000} seconds "
                         f"(2**53 ms), got {value!r}")
    return number


def fence_keep_ms(retention: float, lease_ttl_ms: int) -> int:
    """How long, from a grant or extension, the fence key lives: the retention, and never less than the lease.

    The fence key then outlives every lease on it, and expires once the name has been idle for the retention.
    """
    return max(ttl_ms(retention), lease_ttl_ms)
