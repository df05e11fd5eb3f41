"""What `fencelock run` exits with, and when it stops a command whose lock was lost. No I/O.

    the command's own status   it ran with the lock held to its end (128 + N if signal N ended it, as shells say)
    75   BUSY                  the lock was busy (`--wait 0`) or stayed busy for the whole wait; the command did not
                               run (EX_TEMPFAIL; `-E/--conflict-exit-code` changes it, as `flock -E` does)
    70   LOST                  the lock was lost while the command ran; it was stopped as `--on-lost` says (or,
                               with `--on-lost ignore`, ran on without the lock)
    69   BACKEND               the lock service failed or could not be reached (EX_UNAVAILABLE)
    2    USAGE                 bad arguments or a malformed URL (click's usage status)
    1    DECLINED / FREE       `release --force` was not confirmed; `status --quiet`: the lock is free
    126  / 127                 the command could not be executed / was not found (as shells say)
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum

BUSY = 75
LOST = 70
BACKEND = 69
USAGE = 2
DECLINED = 1
FREE = 1
NOT_EXECUTABLE = 126
NOT_FOUND = 127

DEFAULT_GRACE = 10.0
"""Seconds between SIGTERM and SIGKILL for a command whose lock was lost. Long enough for a clean shutdown,
short against the 30 s default TTL: by then someone else may hold the lock, and the fence guards the rest."""


def shell_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: its own code, or 128 + N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode


class OnLost(str, Enum):
    TERM = "term"      # SIGTERM at once, SIGKILL after the grace period
    KILL = "kill"      # SIGKILL at once
    IGNORE = "ignore"  # let it run on (the exit status still says the lock was lost)


@dataclass(frozen=True)
class Step:
    """What to do to the command now: send `signal` (None: nothing), and look again at `next_at` (None: no need)."""

    signal: int | None
    next_at: float | None


def after_loss(policy: OnLost, lost_at: float, now: float, grace: float, termed: bool) -> Step:
    """The next step of stopping a command whose lock was lost at `lost_at` (`termed`: SIGTERM was sent)."""
    if policy is OnLost.IGNORE:
        return Step(None, None)
    if policy is OnLost.KILL:
        return Step(signal.SIGKILL, None)
    if not termed:
        return Step(signal.SIGTERM, lost_at + grace)
    if now >= lost_at + grace:
        return Step(signal.SIGKILL, None)
    return Step(None, lost_at + grace)


KILL_WAIT = 5.0
"""Seconds to wait for a process group to vanish after SIGKILL (a process in uninterruptible sleep lingers)."""


def after_exit(termed_at: float | None, killed_at: float | None, now: float, grace: float) -> Step:
    """The next step for what a command left running in its process group once its main process ended (it would
    run on without the lock): SIGTERM, SIGKILL `grace` seconds after it, then give up `KILL_WAIT` seconds later
    (`next_at` None). `termed_at` / `killed_at`: when those were sent (None: not yet)."""
    if termed_at is None:
        return Step(signal.SIGTERM, now + grace)
    if killed_at is None:
        if now >= termed_at + grace:
            return Step(signal.SIGKILL, now + KILL_WAIT)
        return Step(None, termed_at + grace)
    if now >= killed_at + KILL_WAIT:
        return Step(None, None)
    return Step(None, killed_at + KILL_WAIT)
