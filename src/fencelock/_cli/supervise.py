"""`fencelock run`: hold a lock while a command runs as a child process, and release it after the child ends.

The lock is renewed by the client's watchdog (a daemon thread) while the child runs. This module only watches
the child, the watchdog's loss signal and the signals sent to us; what to do about each is decided in
`fencelock._cli.exits`.

The command runs as the leader of a process group of its own, and every signal fencelock sends goes to that
whole group: a `sh -c '...'` that does not exec, and whatever else the command starts, is stopped with it
(a process that leaves the group on purpose, by setsid or setpgid, is not). SIGINT, SIGTERM and SIGHUP sent to
fencelock are passed on to the group. On a terminal, fencelock hands the terminal's foreground to the
command's group while it runs, as a shell does for a job, so Ctrl-C reaches the whole command once, straight
from the terminal, and an interactive command can read it. When the main process ends, anything it left in
its group is stopped (SIGTERM, then SIGKILL after --grace) before the lock is released: nothing of the command
runs on without the lock. See docs/decisions/2026-12-01-run-process-group.md.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from .._errors import BackendError, LockLost, NotAcquired
from .._sync.client import Locks
from .._sync.lease import Lease
from . import exits
from .exits import KILL_WAIT, OnLost, after_exit, after_loss, shell_status
from .show import describe, error, note

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL = 0.05  # seconds between looks at the child and the loss signal


class Interrupted(BaseException):
    """A signal arrived while we waited for the lock (a BaseException: the acquire undoes itself)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


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
        child = subprocess.Popen(list(command), env=env, **_own_group())
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
    group = child.pid  # the command's process group: it and everything it starts, unless they leave it
    terminal = _hand_terminal(group)
    try:
        returncode, lost_at, termed = _watch(child, group, name, received, lost, on_lost, grace)
        _stop_leftovers(group, name, received, lost_at if termed else None, grace)
    finally:
        if terminal is not None:
            _take_terminal_back(terminal)
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


def _watch(child: subprocess.Popen[bytes], group: int, name: str, received: list[int], lost: threading.Event,
           on_lost: OnLost, grace: float) -> tuple[int, float | None, bool]:
    """Wait for the command's main process; pass signals on to its group, stop the group if the lock is lost.
    Returns its exit status, when the loss was seen (None: not lost), and whether SIGTERM went out for it."""
    lost_at: float | None = None
    termed = False
    next_at: float | None = None
    while True:
        try:
            return child.wait(timeout=POLL), lost_at, termed
        except subprocess.TimeoutExpired:
            pass
        while received:
            _send(group, received.pop(0))
        now = time.monotonic()
        if lost.is_set() and lost_at is None:
            lost_at = now
            step = after_loss(on_lost, lost_at, now, grace, termed)
            if step.signal is None:
                note(f"lost lock {name!r} while the command ran (pid {child.pid}); it runs on (--on-lost ignore)")
            elif step.signal == signal.SIGTERM:
                note(f"lost lock {name!r} while the command ran; sent SIGTERM to pid {child.pid} and its process "
                     f"group, SIGKILL in {grace:g} s if they have not exited")
            else:
                note(f"lost lock {name!r} while the command ran; sent SIGKILL to pid {child.pid} and its "
                     "process group")
            _send(group, step.signal)
            termed = step.signal == signal.SIGTERM
            next_at = step.next_at
        elif lost_at is not None and next_at is not None and now >= next_at:
            step = after_loss(on_lost, lost_at, now, grace, termed)
            if step.signal == signal.SIGKILL:
                note(f"pid {child.pid} did not exit within {grace:g} s of SIGTERM; sent SIGKILL to its group")
            _send(group, step.signal)
            next_at = step.next_at


def _stop_leftovers(group: int, name: str, received: list[int], termed_at: float | None, grace: float) -> None:
    """The main process has ended: what it left running in its group would go on without the lock, so it is
    stopped before the release, as `after_exit` says (`termed_at`: the loss already sent SIGTERM then)."""
    if not _group_alive(group):
        return
    killed_at: float | None = None
    while _group_alive(group):
        while received:
            _send(group, received.pop(0))
        now = time.monotonic()
        step = after_exit(termed_at, killed_at, now, grace)
        if step.signal == signal.SIGTERM:
            note(f"the command left processes running in its process group {group}; sent them SIGTERM, SIGKILL "
                 f"in {grace:g} s if they have not exited")
            termed_at = now
        elif step.signal == signal.SIGKILL:
            note(f"processes of group {group} did not exit within {grace:g} s of SIGTERM; sent SIGKILL")
            killed_at = now
        elif step.next_at is None:
            error(f"processes of group {group} outlived SIGKILL for {KILL_WAIT:g} s; releasing lock {name!r} anyway")
            return
        _send(group, step.signal)
        time.sleep(POLL)


def _own_group() -> dict[str, Any]:
    """Popen's arguments that start the command as the leader of a process group of its own."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover (Python 3.10)


def _terminal() -> int | None:
    """A descriptor of our controlling terminal, if our process group is its foreground group; else None."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
        except OSError:
            continue
    return None


def _hand_terminal(group: int) -> int | None:
    """Make `group` the terminal's foreground group, as a shell does for a job, so that Ctrl-C (and the rest of
    what a terminal sends) reaches the whole command, and the command can read the terminal. Returns the
    terminal's descriptor to give it back later, or None where we do not own the terminal's foreground."""
    fd = _terminal()
    if fd is None:
        return None
    try:
        os.tcsetpgrp(fd, group)
    except OSError:
        return None
    _send(group, signal.SIGCONT)  # in case it read the terminal before it was its own: it was stopped for that
    return fd


def _take_terminal_back(fd: int) -> None:
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group asking for the terminal
    try:
        os.tcsetpgrp(fd, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, previous)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _send(group: int, signum: int | None) -> None:
    """Send `signum` to every process of the command's group (None: nothing)."""
    if signum is None:
        return
    try:
        os.killpg(group, signum)
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
