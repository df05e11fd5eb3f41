"""The Celery integration's rules: its task options, what a busy lock leads to, and the lock name of a call.

Pure: no Celery, no I/O. `fencelock.celery` applies them in the worker.
"""

from __future__ import annotations

import enum
import hashlib
import json
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .args import MAX_NAME_LENGTH, check_name, check_ttl, check_wait


class OnBusy(enum.Enum):
    """What a task does when another run holds its lock."""

    SKIP = "skip"    # do not run: the task fails with `Skipped`, an expected error the worker logs at INFO
    RETRY = "retry"  # `self.retry(countdown=lock_retry_delay)`: run again later, within Celery's `max_retries`
    WAIT = "wait"    # wait up to `lock_wait` seconds for the lock, in the worker slot; `AcquireTimeout` after


@dataclass(frozen=True)
class LockOptions:
    """A task's checked lock options."""

    key: str | Callable[..., object] | None
    ttl: float
    on_busy: OnBusy
    wait: float | None
    retry_delay: float | None

    @property
    def acquire_wait(self) -> float | None:
        """The `wait` of the acquisition: one attempt unless the task waits."""
        return self.wait if self.on_busy is OnBusy.WAIT else 0.0


def check_options(task: str, *, key: object, ttl: object, on_busy: object, wait: object,
                  retry_delay: object) -> LockOptions:
    """The task's lock options, or `TypeError`/`ValueError` naming the option and the task."""
    where = f" (task {task!r})"
    if key is not None and not isinstance(key, str) and not callable(key):
        raise TypeError(f"lock_key must be None, a str or a callable, got {type(key).__name__} {key!r}{where}")
    if isinstance(key, str):
        _check_format(key, where)
    try:
        busy = OnBusy(on_busy)
    except (TypeError, ValueError):
        choices = ", ".join(repr(b.value) for b in OnBusy)
        raise ValueError(f"on_busy must be one of {choices}, got {on_busy!r}{where}") from None
    try:
        ttl_s = check_ttl(ttl, None, "lock_ttl")
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc}{where}") from None
    wait_s = _seconds_or_none(wait, "lock_wait", where)
    delay = _seconds_or_none(retry_delay, "lock_retry_delay", where)
    if retry_delay is not None and delay is None:
        raise ValueError(f"lock_retry_delay must be None or a finite number of seconds >= 0, "
                         f"got {retry_delay!r}{where}")
    return LockOptions(key, ttl_s, busy, wait_s, delay)


def _seconds_or_none(value: object, arg: str, where: str) -> float | None:
    try:
        return check_wait(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{arg}{str(exc)[len('wait'):]}{where}") from None


def _check_format(key: str, where: str) -> None:
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(key) if field is not None]
    except ValueError as exc:
        raise ValueError(f"lock_key {key!r} is not a valid format string: {exc}{where}") from None
    if not key or any(not field or not field.isidentifier() for field in fields):
        raise ValueError(f"lock_key must be a non-empty str whose {{fields}} name the task's arguments, "
                         f"got {key!r}{where}")


READABLE_LENGTH = 256
"""A default name longer than this is replaced by a hash of it (lock names are at most `MAX_NAME_LENGTH`)."""


def default_name(task: str, arguments: Mapping[str, Any]) -> str:
    """`celery:<task>:<arguments as sorted JSON>`: one lock per task and argument values; hashed when long."""
    canonical = json.dumps(dict(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                           default=repr)
    name = f"celery:{task}:{canonical}"
    if len(name) <= READABLE_LENGTH:
        return name
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return f"celery:{task}:sha256:{digest}"


def format_name(key: str, arguments: Mapping[str, Any], task: str) -> str:
    """`key` with its `{fields}` filled from the call's arguments by parameter name."""
    try:
        name = key.format_map(dict(arguments))
    except (KeyError, IndexError, AttributeError) as exc:
        raise ValueError(f"lock_key {key!r} names {exc} which is not an argument of the task "
                         f"(task {task!r})") from None
    return checked_name(name, task)


def checked_name(name: object, task: str) -> str:
    """A lock name built for `task`, checked as every lock name is."""
    try:
        return check_name(name)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"the lock key of task {task!r}: {exc}") from None


__all__ = ["MAX_NAME_LENGTH", "LockOptions", "OnBusy", "check_options", "default_name", "format_name"]
