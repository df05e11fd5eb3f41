"""Validation of user arguments, before anything is sent.

Every check names the argument and the lock in its message, raises the builtin `TypeError` (wrong type) or
`ValueError` (wrong value), and returns the normalised value the rest of the code relies on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_TTL = 30.0
"""Seconds. No lock exists without a TTL: a crashed holder frees the lock when it runs out."""

DEFAULT_WAIT = 30.0
"""Seconds. `wait=None` waits forever, but only when asked: by default nobody blocks for ever."""

MIN_TTL = 0.01
"""Seconds. Below this the clock-drift allowance (1 % + 2 ms) leaves no validity at all."""

MAX_SECONDS = 10 * 365 * 24 * 3600.0
"""Seconds: the longest ttl, wait (other than forever) or renewal interval taken. Its milliseconds stay exact in
a Lua number and far below what PX, PEXPIRE and an etcd lease accept, added to any server's clock."""

MAX_NAME_LENGTH = 1024


def _where(name: object) -> str:
    return "" if name is None else f" (lock {name!r})"


def check_text(value: object, arg: str, name: object = None) -> str:
    """A non-empty str that UTF-8 can encode (no lone surrogate such as '\\ud800'): what every key is made of."""
    if not isinstance(value, str):
        raise TypeError(f"{arg} must be a str, got {type(value).__name__} {value!r}{_where(name)}")
    if not value:
        raise ValueError(f"{arg} must be a non-empty str, got ''{_where(name)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{arg} must be encodable as UTF-8, but {value!r} holds {value[exc.start]!r} at "
                         f"index {exc.start} (a lone surrogate){_where(name)}") from None
    return value


def check_name(name: object) -> str:
    name = check_text(name, "name")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}")
    return name


def check_flag(value: object, arg: str, name: object = None) -> bool:
    """True or False, nothing else (`fair="yes"` is a bug in the caller, not a truthy value)."""
    if not isinstance(value, bool):
        raise TypeError(f"{arg} must be True or False, got {type(value).__name__} {value!r}{_where(name)}")
    return value


def shown_number(value: object) -> str:
    """`value` for a message: an integer too long to print whole (10**5000 cannot be) is described instead."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"{'-' if value < 0 else ''}an integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits"
    return repr(value)


def seconds_of(value: object, arg: str, name: object = None) -> float:
    """`value` as a float number of seconds (not yet range-checked): TypeError for a non-number (or a bool),
    ValueError for NaN or an integer too large for a float (never OverflowError)."""
    # bool is an int subclass: `ttl=True` is a bug in the caller, never one second.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{arg} must be a number of seconds, got {type(value).__name__} {value!r}{_where(name)}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{arg} must be a number of seconds, got {shown_number(value)}, too large for any "
                         f"timeout{_where(name)}") from None
    if math.isnan(number):
        raise ValueError(f"{arg} must be a number of seconds, got NaN{_where(name)}")
    return number




def check_ttl(ttl: object, name: object = None, arg: str = "ttl") -> float:
    """A finite number of seconds, from `MIN_TTL` to `MAX_SECONDS`."""
    seconds = seconds_of(ttl, arg, name)
    if not math.isfinite(seconds) or not MIN_TTL <= seconds <= MAX_SECONDS:
        raise ValueError(
            f"{arg} must be a number of seconds from {MIN_TTL} to {MAX_SECONDS:.0f} (ten years), got {ttl!r}"
            f"{_where(name)}"
        )
    return seconds


def ttl_ms(ttl: float) -> int:
    """Milliseconds for the server, rounded up: the server never expires a lease before our validity says."""
    return math.ceil(ttl * 1000.0)


def check_wait(wait: object, name: object = None) -> float | None:
    """None (or inf) waits forever; 0 makes one attempt; s > 0 is one deadline for every retry and wake-up."""
    if wait is None:
        return None
    seconds = seconds_of(wait, "wait", name)
    if seconds == math.inf:
        return None
    if not 0 <= seconds <= MAX_SECONDS:
        raise ValueError(f"wait must be None (forever) or a number of seconds from 0 to {MAX_SECONDS:.0f} (ten "
                         f"years), got {wait!r}{_where(name)}")
    return seconds


MIN_RENEW = 0.001
"""Seconds: the shortest renewal interval taken (shorter would only flood the server)."""

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
    seconds = seconds_of(renew, "renew", name)
    if not math.isfinite(seconds) or not MIN_RENEW <= seconds < ttl / 2:
        raise ValueError(f"renew must be True, False or a number of seconds from {MIN_RENEW} to below ttl/2 "
                         f"({ttl / 2}), "
                         f"got {renew!r}{_where(name)}")
    return seconds


def check_pattern(pattern: object) -> str:
    """A glob over lock names (fnmatch: `*`, `?`, `[seq]`)."""
    if isinstance(pattern, str) and not pattern:
        raise ValueError("pattern must be a non-empty glob (use '*' for every lock), got ''")
    return check_text(pattern, "pattern")


@dataclass(frozen=True)
class AcquireArgs:
    """The arguments of one acquisition, checked and normalised."""

    name: str
    ttl: float
    wait: float | None                          # None: for ever
    renew_every: float | None                   # None: no renewal
    on_lost: Callable[..., object] | None
    fair: bool
    cancel_on_lost: bool = True                 # lock() only: cancel the body when the lease is lost


def check_acquire(name: object, ttl: object, wait: object, renew: object, on_lost: object, fair: object, *,
                  cancel_on_lost: object = True, supports_fair: bool, where: str) -> AcquireArgs:
    """The one rule for `acquire()` and `lock()`: every argument checked, once, before anything is sent. `where`
    names the lock service for the message when it cannot queue fairly."""
    name = check_name(name)
    seconds = check_ttl(ttl, name)
    wait_s = check_wait(wait, name)
    renew_every = check_renew(renew, seconds, name)
    if on_lost is not None and not callable(on_lost):
        raise TypeError(f"on_lost must be callable, got {type(on_lost).__name__} {on_lost!r}{_where(name)}")
    queue_fairly = check_flag(fair, "fair", name)
    if queue_fairly and not supports_fair:
        raise ValueError(f"fair=True needs a single Redis or a Redis Cluster, not {where}{_where(name)}")
    cancel = check_flag(cancel_on_lost, "cancel_on_lost", name)
    return AcquireArgs(name, seconds, wait_s, renew_every, on_lost, queue_fairly, cancel)
