"""`fencelock run`: hold a lock while a command runs as a child process, and release it after the child ends.

The lock is renewed by the client's watchdog (a daemon thread) while the child runs. This module only watches
the child, the watchdog's loss signal and the signals sent to us; what to do about each is decided in
`fencelock._logic.exits`.

Signals. SIGINT, SIGTERM and SIGHUP sent to fencelock are passed on to the child, and the lock is released after
the child has exited. The child runs in fencelock's own process group, so that an interactive command keeps its
terminal. A terminal therefore already delivers its SIGINT (Ctrl-C), SIGQUIT and SIGHUP to the child itself:
when fencelock is in the terminal's foreground group, it does not send those a second time. SIGTERM, which no
terminal sends, is always passed on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from types import FrameType

from .._errors import BackendError, LockLost, NotAcquired
from .._logic import exits
from .._logic.exits import OnLost, after_loss, shell_status
from .._sync.client import Lease, Locks
from .show import describe, error, note

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP)  # what a terminal sends to its whole foreground group
POLL = 0.05  # seconds between looks at the child and the loss signal


class Interrupted(BaseException):
    """A signal arrived while we waited for the lock (a BaseException: the acquire undoes itself)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _in_terminal_foreground() -> bool:
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


def run(locks: Locks, name: str, command: Sequence[str], *, ttl: float, wait: float | None, busy_status: int,
        on_lost: OnLost, grace: float, quiet: bool = False) -> int:
    """Acquire `name`, run `command` while it is held, release it; returns the status to exit with.
    `quiet`: nothing is said when the lock is busy."""
    lost = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {signum: signal.signal(signum, interrupt) for signum in FORWARDED}
    try:
        try:
            lease = locks.acquire(name, ttl=ttl, wait=wait, renew=True, on_lost=lambda _: lost.set())
        except Interrupted as exc:
            note(f"interrupted by {signal.Signals(exc.signum).name} while waiting for lock {name!r}; "
                 "the command did not run")
            return 128 + exc.signum
        except NotAcquired:
            if quiet:
                return busy_status
            why = "is held by another holder" if wait == 0 else f"stayed busy for the whole wait of {wait:g} s"
            error(f"lock {name!r} {why}{_holder(locks, name)}; the command did not run (exit {busy_status})",
                  "--wait S waits for it")
            return busy_status
        try:
            return _supervise(lease, name, command, lost, on_lost, grace)
        except Interrupted as exc:  # in the moment between the grant and the child's start
            _release(lease, name)
            note(f"interrupted by {signal.Signals(exc.signum).name}; the command did not run")
            return 128 + exc.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _holder(locks: Locks, name: str) -> str:
    """Who holds it, for the busy message (best effort: the lock service just answered, but may not again)."""
    try:
        status = locks.status(name)
    except BackendError:
        return ""
    return f" ({describe(status)})" if status.held else ""


def _supervise(lease: Lease, name: str, command: Sequence[str], lost: threading.Event, on_lost: OnLost,
               grace: float) -> int:
    received: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    for signum in FORWARDED:
        signal.signal(signum, record)
    env = dict(os.environ, FENCELOCK_NAME=name, FENCELOCK_FENCE=str(lease.fence), FENCELOCK_TOKEN=lease.token)
    try:
        child = subprocess.Popen(list(command), env=env)
    except FileNotFoundError:
        error(f"command not found: {command[0]}", "give the full path, or check PATH")
        _release(lease, name)
        return exits.NOT_FOUND
    except PermissionError:
        error(f"command is not executable: {command[0]}", "check its mode (chmod +x) and its #! line")
        _release(lease, name)
        return exits.NOT_EXECUTABLE
    except OSError as exc:
        error(f"cannot run {command[0]}: {exc}")
        _release(lease, name)
        return exits.NOT_EXECUTABLE

    lost_at: float | None = None
    termed = False
    next_at: float | None = None
    returncode: int | None = None
    while returncode is None:
        try:
            returncode = child.wait(timeout=POLL)
            break
        except subprocess.TimeoutExpired:
            pass
        while received:
            got = received.pop(0)
            if got in TERMINAL_SIGNALS and _in_terminal_foreground():
                continue  # the terminal sent it to the child as well
            _send(child, got)
        now = time.monotonic()
        if lost.is_set() and lost_at is None:
            lost_at = now
            step = after_loss(on_lost, lost_at, now, grace, termed)
            if step.signal is None:
                note(f"lost lock {name!r} while the command ran (pid {child.pid}); it runs on (--on-lost ignore)")
            elif step.signal == signal.SIGTERM:
                note(f"lost lock {name!r} while the command ran; sent SIGTERM to pid {child.pid}, "
                     f"SIGKILL in {grace:g} s if it has not exited")
            else:
                note(f"lost lock {name!r} while the command ran; sent SIGKILL to pid {child.pid}")
            _send(child, step.signal)
            termed = step.signal is not None
            next_at = step.next_at
        elif lost_at is not None and next_at is not None and now >= next_at:
            step = after_loss(on_lost, lost_at, now, grace, termed)
            if step.signal == signal.SIGKILL:
                note(f"pid {child.pid} did not exit within {grace:g} s of SIGTERM; sent SIGKILL")
            _send(child, step.signal)
            next_at = step.next_at
    status = shell_status(returncode)
    if lost_at is not None or lease.lost:
        _release(lease, name)
        error(f"lock {name!r} was lost while the command ran (the command's own status was {status}); "
              f"exit {exits.LOST}", "was the key deleted, or the server unreachable for a whole TTL? "
              "a longer --ttl rides out longer outages")
        return exits.LOST
    if not _release(lease, name):
        error(f"lock {name!r} was lost before the command ended (the command's own status was {status}); "
              f"exit {exits.LOST}", "a longer --ttl rides out longer outages")
        return exits.LOST
    return status


def _send(child: subprocess.Popen[bytes], signum: int | None) -> None:
    if signum is None:
        return
    try:
        child.send_signal(signum)
    except ProcessLookupError:
        pass


def _release(lease: Lease, name: str) -> bool:
    """Release after the child ended. False if the lease turned out lost; a server that cannot be reached is
    only a warning (the key expires by its TTL), since the command itself did its work."""
    try:
        lease.release()
    except LockLost:
        return False
    except BackendError as exc:
        note(f"could not release lock {name!r} ({exc}); it expires by itself within {lease.ttl:g} s")
    return True
