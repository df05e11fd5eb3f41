"""What `fencelock run` exits with, and when it stops a command whose lock was lost or is in doubt. No I/O.

Pure standard library: the guardian (`guardian.py`, run by path without the package) imports this module too.

    the command's own status   it ran with the lock held to its end (128 + N if signal N ended it, as shells say)
    75   BUSY                  the lock was busy (`--wait 0`) or stayed busy for the whole wait; the command did not
                               run (EX_TEMPFAIL; `-E/--conflict-exit-code` changes it, as `flock -E` does)
    70   LOST                  the lock was lost, or its renewal went unconfirmed with less than --grace left,
                               while the command ran; it was stopped as `--on-lost` says (or, with
                               `--on-lost ignore`, ran on without the lock)
    69   BACKEND               the lock service failed or could not be reached (EX_UNAVAILABLE)
    2    USAGE                 bad arguments, an empty or malformed URL, an empty COMMAND, a nested run of the
                               same lock (click's usage status)
    1    DECLINED / FREE       `release --force` was not confirmed; `status --quiet`: the lock is free
    126  / 127                 the command could not be executed / was not found (as shells say)
    74   OUTPUT                stdout could not be written (closed, full); 141 when its reader went away (EPIPE)
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, replace
from enum import Enum

BUSY = 75
LOST = 70
BACKEND = 69
USAGE = 2
DECLINED = 1
FREE = 1
NOT_EXECUTABLE = 126
NOT_FOUND = 127
OUTPUT = 74  # EX_IOERR
BROKEN_PIPE = 128 + 13  # as a shell reports a writer ended by SIGPIPE

def _boot_time() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


lease_clock = _boot_time if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
"""The clock of the lease's validity, `fencelock._logic.timing.lease_clock` (CLOCK_BOOTTIME, which counts a
suspend as the server's TTL does), repeated here for the guardian, which imports no package. fencelock and its
guardian measure every validity end and deadline of a run on it (tests check that it is the lease's clock)."""

DEFAULT_GRACE = 10.0
"""Seconds between SIGTERM and SIGKILL for a command whose lock was lost. Long enough for a clean shutdown,
short against the 30 s default TTL: by then someone else may hold the lock, and the fence guards the rest."""


def shell_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: its own code, or 128 + N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class Ending:
    """What fencelock exits with: `status`, or by dying of `signal` once all is done (the command died of it)."""

    status: int
    signal: int | None = None


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
    """The next step of stopping a command whose lock was lost at `lost_at` (`termed`: SIGTERM was sent then):
    `stop_step` for a certain loss."""
    state = Stopping(lost_at, lost_at + grace) if termed else Stopping()
    stop = stop_step(policy, state, Trouble.LOST, now, math.inf, grace)
    return Step(stop.signal, stop.next_at)


KILL_WAIT = 5.0
POLL = 0.05  # seconds between looks at the child, the lease and the signals (and the guardian's heartbeat)
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


# -- stopping the command: on a loss, in doubt, when fencelock is gone ------------------------------------------


class Trouble(str, Enum):
    """What is wrong with the lock the command runs under, as far as the one deciding knows."""

    NONE = "none"          # renewed and confirmed (fencelock), or fencelock is heard (the guardian)
    DOUBT = "doubt"        # its renewal is unconfirmed (fencelock), or fencelock fell silent (the guardian)
    LOST = "lost"          # known lost: the server said so, or its validity ran out
    ORPHANED = "orphaned"  # fencelock is gone: nobody renews the lock or stops the command later


@dataclass(frozen=True)
class Stopping:
    """How far stopping the command's group has gone: SIGTERM sent at `termed_at` (None: not yet), SIGKILL due at
    `kill_at`, SIGKILL sent (`killed`)."""

    termed_at: float | None = None
    kill_at: float | None = None
    killed: bool = False


@dataclass(frozen=True)
class Stop:
    """The next step of stopping: send `signal` (None: nothing), then stand at `state`; look again at `next_at`
    at the latest (None: only when something changes)."""

    signal: int | None
    state: Stopping
    next_at: float | None


def in_doubt(remaining: float, ttl: float, every: float) -> bool:
    """A renewed lease is in doubt once its renewal, due `every` seconds after the last confirmed one, is late by
    half an interval: less than `ttl - 1.5 * every` of validity remains (half the TTL when `every` is TTL/3)."""
    return remaining < ttl - 1.5 * every


def lease_trouble(lost: bool, remaining: float, ttl: float, every: float) -> Trouble:
    """fencelock's view of its own lease: LOST, DOUBT (see `in_doubt`) or NONE."""
    if lost or remaining <= 0.0:
        return Trouble.LOST
    return Trouble.DOUBT if in_doubt(remaining, ttl, every) else Trouble.NONE


KILL_MARGIN = 0.1
"""Seconds before a lease's validity ends by which SIGKILL has gone out when nobody confirmed its renewal. The
validity already allows for the server's clock (it counts from before the request, less the drift); this covers the
side of the one who kills: how late its look at the clock may come on a busy machine, and the kill's delivery."""


def kill_by(valid_until: float, margin: float) -> float:
    """When SIGKILL is due at the latest for a command whose lock's validity ends at `valid_until` unconfirmed."""
    return valid_until - margin


def stop_step(policy: OnLost, state: Stopping, trouble: Trouble, now: float, valid_until: float,
              grace: float, margin: float = KILL_MARGIN, *, frozen: bool = False) -> Stop:
    """The one rule for stopping a command's group, for fencelock and its guardian alike.

    LOST stops at once: SIGKILL (`kill`), or SIGTERM and SIGKILL `grace` later (`term`). DOUBT stops once at most
    `grace` of the lock's validity (ending at `valid_until`) remains: SIGTERM then, SIGKILL `margin` before the
    validity ends (`kill_by`; `kill`: SIGKILL then). ORPHANED stops at once, SIGKILL no later than `kill_by`. Once
    SIGTERM is out, SIGKILL comes `grace` after it, never past `kill_by` while in doubt; NONE (confirmed again)
    gives back the whole grace. `ignore` never sends anything. `frozen`: a process of the group is stopped
    (SIGSTOP): it cannot handle SIGTERM, and continuing it would let it run without the lock, so SIGKILL goes out
    at once wherever SIGTERM would."""
    if policy is OnLost.IGNORE or state.killed:
        return Stop(None, state, None)
    deadline = kill_by(valid_until, margin)
    termed_at = state.termed_at
    if trouble is Trouble.NONE:
        if termed_at is None:
            return Stop(None, state, None)
        kill_at = termed_at + grace
    elif trouble is Trouble.DOUBT:
        if policy is OnLost.KILL:
            if now >= deadline:
                return Stop(signal.SIGKILL, replace(state, kill_at=now, killed=True), None)
            return Stop(None, state, deadline)
        if termed_at is None:
            term_at = min(valid_until - grace, deadline)
            if now < term_at:
                return Stop(None, state, term_at)
            return _term(now, min(now + grace, deadline), frozen)
        kill_at = min(termed_at + grace, deadline, math.inf if state.kill_at is None else state.kill_at)
    else:  # LOST, ORPHANED: at once
        if policy is OnLost.KILL:
            return Stop(signal.SIGKILL, replace(state, kill_at=now, killed=True), None)
        cap = math.inf if trouble is Trouble.LOST else deadline  # orphaned: nobody renews it now
        if termed_at is None:
            return _term(now, min(now + grace, cap), frozen)
        kill_at = min(state.kill_at if state.kill_at is not None else termed_at + grace, cap)
    if now >= kill_at:
        return Stop(signal.SIGKILL, Stopping(termed_at, kill_at, True), None)
    return Stop(None, Stopping(termed_at, kill_at), kill_at)


def _term(now: float, kill_at: float, frozen: bool) -> Stop:
    """SIGTERM now and SIGKILL at `kill_at`; SIGKILL at once if that time has come already (no grace left) or the
    group is `frozen`."""
    if now >= kill_at or frozen:
        return Stop(signal.SIGKILL, Stopping(None, now, True), None)
    return Stop(signal.SIGTERM, Stopping(now, kill_at), kill_at)


SILENT = 0.25
"""Seconds without a line from fencelock (it writes one every 50 ms) before its guardian counts it as silent:
stopped (SIGSTOP), hung or starved. Short against any TTL `fencelock run` accepts (at least `MIN_RUN_TTL`)."""

MIN_RUN_TTL = 1.0
"""The shortest --ttl `fencelock run` takes: its renewal (every TTL/3), its 50 ms look at the command and the
guardian's `SILENT` must all fit well within one TTL."""


def guard_step(policy: OnLost, state: Stopping, now: float, grace: float, *, heard_at: float, valid_until: float,
               eof: bool, margin: float = KILL_MARGIN, frozen: bool = False) -> Stop:
    """The guardian's next step. It acts only as a backstop: when fencelock is gone (`eof` without `done`:
    ORPHANED) or has been silent for `SILENT` seconds (DOUBT on the last validity end it heard), by `stop_step`.
    And whether fencelock is silent or not, SIGKILL goes out half the `margin` before the last validity end it
    heard (after fencelock's own SIGKILL was due), unless fencelock has begun stopping the group itself: fencelock
    may have fallen silent less than `SILENT` before that end. `frozen`: as for `stop_step`."""
    if eof:
        return stop_step(policy, state, Trouble.ORPHANED, now, valid_until, grace, margin, frozen=frozen)
    if now >= heard_at + SILENT:  # (the same sum as the next look: rounding never makes it a busy loop)
        return stop_step(policy, state, Trouble.DOUBT, now, valid_until, grace, margin, frozen=frozen)
    if state.termed_at is None and not state.killed:
        backstop = kill_by(valid_until, margin / 2)
        if now >= backstop:
            return stop_step(policy, state, Trouble.DOUBT, now, valid_until, grace, margin / 2, frozen=frozen)
        return Stop(None, state, min(heard_at + SILENT, backstop))
    return Stop(None, state, heard_at + SILENT)


def heard(state: Stopping, line: str, now: float) -> Stopping:
    """The guardian's state after fencelock's line `stop K` (it sent SIGTERM; SIGKILL due at K) or `kill`."""
    words = line.split()
    if words[:1] == ["kill"]:
        return replace(state, killed=True)
    if len(words) == 2 and words[0] == "stop" and not state.killed:
        try:
            kill_at = float(words[1])
        except ValueError:
            return state
        termed_at = now if state.termed_at is None else state.termed_at
        return Stopping(termed_at, kill_at if math.isfinite(kill_at) else None)
    return state
