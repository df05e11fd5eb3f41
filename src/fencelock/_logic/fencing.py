"""The fencing rule, as the resource applies it.

A resource keeps, per lock name, the highest fence it has accepted. It accepts a write whose fence is at least
that high (the same holder may write many times), and rejects a lower one: the writer is a stale holder, a
newer holder has already written. This function is the specification; the Redis guard (`_scripts/guard_set.lua`)
and the SQL guard (`_guards_sql.py`) implement the same rule inside the storage, and the tests hold both to it.
"""

from __future__ import annotations

import math


def accepts(fence: int, highest: int | None) -> bool:
    """True when a write with `fence` may be applied, given the highest fence accepted so far (None: none yet)."""
    return highest is None or fence >= highest


FENCE_LIMIT = 2**63 - 1
"""The largest fence: fences are signed 64-bit integers (Redis INCR, SQL BIGINT, etcd and ZooKeeper revisions)."""


def check_fence(fence: object, name: object = None) -> int:
    """An int in 1..`FENCE_LIMIT`; guards compare it exactly (never as a float)."""
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise TypeError(f"fence must be an int, got {type(fence).__name__} {fence!r} (lock {name!r})")
    if fence < 1:
        raise ValueError(f"fence must be >= 1, got {fence!r} (lock {name!r})")
    if fence > FENCE_LIMIT:
        raise ValueError(f"fence must be at most 2**63 - 1 (a 64-bit integer), got {fence!r} (lock {name!r})")
    return fence


def check_value(value: object, name: object = None) -> str | bytes | int | float:
    """A value a guard can store: str (UTF-8 encodable), bytes, int or finite float; never a bool or None."""
    if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
        raise TypeError(f"value must be str, bytes, int or float, got {type(value).__name__} {value!r} "
                        f"(lock {name!r})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"value must be a finite number, got {value!r} (lock {name!r})")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"value must be encodable as UTF-8 (it holds a lone surrogate) (lock {name!r})") \
                from None
    return value
