"""Validation of user arguments, before anything is sent.

Every check names the argument and the lock in its message, raises the builtin `TypeError` (wrong type) or
`ValueError` (wrong value), and returns the normalised value the rest of the code relies on.
"""

from __future__ import annotations

import math

DEFAULT_TTL = 30.0
"""Seconds. No lock exists without a TTL: a crashed holder frees the lock when it runs out."""

DEFAULT_WAIT = 30.0
"""Seconds. `wait=None` waits forever, but only when asked: by default nobody blocks for ever."""

MIN_TTL = 0.01
"""Seconds. Below this the clock-drift allowance (1 % + 2 ms) leaves no validity at all."""

MAX_NAME_LENGTH = 1024


def _where(name: object) -> str:
    return "" if name is None else f" (lock {name!r})"


def check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise ValueError("name must be a non-empty str, got ''")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}")
    return name


def _number(value: object, arg: str, name: object) -> float:
    # bool is an int subclass: `ttl=True` is a bug in the caller, never one second.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{arg} must be a number of seconds, got {type(value).__name__} {value!r}{_where(name)}")
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"{arg} must be a number of seconds, got NaN{_where(name)}")
    return number


def check_ttl(ttl: object, name: object = None, arg: str = "ttl") -> float:
    """A finite number of seconds, at least `MIN_TTL`."""
    seconds = _number(ttl, arg, name)
    if not math.isfinite(seconds) or seconds < MIN_TTL:
        raise ValueError(
            f"{arg} must be a finite number of seconds >= {MIN_TTL}, got {ttl!r}{_where(name)}"
        )
    return seconds


def ttl_ms(ttl: float) -> int:
    """Milliseconds for the server, rounded up: the server never expires a lease before our validity says."""
    return math.ceil(ttl * 1000.0)


def check_wait(wait: object, name: object = None) -> float | None:
    """None (or inf) waits forever; 0 makes one attempt; s > 0 is one deadline for every retry and wake-up."""
    if wait is None:
        return None
    seconds = _number(wait, "wait", name)
    if seconds < 0:
        raise ValueError(f"wait must be None or a number of seconds >= 0, got {wait!r}{_where(name)}")
    return None if math.isinf(seconds) else seconds


RENEW_FRACTION = 1 / 3
"""`renew=True` extends a lease every third of its TTL."""


def check_renew(renew: object, ttl: float, name: object = None) -> float | None:
    """None (no renewal), or the seconds between renewals: True means `ttl / 3`, a number is taken as given.

    A number must leave time to renew before the lease's validity runs out, so it must be below `ttl / 2`.
    """
    if renew is False or renew is None:
        return None
    if renew is True:
        return ttl * RENEW_FRACTION
    seconds = _number(renew, "renew", name)
    if not math.isfinite(seconds) or not 0.0 < seconds < ttl / 2:
        raise ValueError(f"renew must be True, False or a number of seconds between 0 and ttl/2 ({ttl / 2}), "
                         f"got {renew!r}{_where(name)}")
    return seconds


def check_pattern(pattern: object) -> str:
    """A glob over lock names (fnmatch: `*`, `?`, `[seq]`)."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str glob, got {type(pattern).__name__} {pattern!r}")
    if not pattern:
        raise ValueError("pattern must be a non-empty glob (use '*' for every lock), got ''")
    return pattern
