"""One scale for every elapsed-time bound in fencelock's tests and its conformance suite.

`FENCELOCK_TIME_SCALE` (default 1) multiplies the slack each bound allows, never the behaviour it checks: a test
that waits `wait` seconds still asserts at least `wait`, and at most `wait + slack(s)`. Set it above 1 on a slow or
shared machine rather than editing bounds one by one.
"""

from __future__ import annotations

import os

__all__ = ["SCALE", "slack"]


def _scale() -> float:
    raw = os.environ.get("FENCELOCK_TIME_SCALE", "1")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"FENCELOCK_TIME_SCALE must be a number >= 1, not {raw!r}") from None
    if not value >= 1.0:  # also refuses NaN
        raise ValueError(f"FENCELOCK_TIME_SCALE must be a number >= 1, not {raw!r}")
    return value


SCALE = _scale()


def slack(seconds: float) -> float:
    """`seconds` of room for scheduling and I/O in a time bound, scaled by `FENCELOCK_TIME_SCALE`."""
    return seconds * SCALE
