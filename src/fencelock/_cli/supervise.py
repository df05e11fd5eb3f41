"""`fencelock run`: hold a lock while a command runs as a child process, and release it after the child ends.

The lock is renewed by the client's watchdog (a daemon thread) while the child runs. This module only watches
the child, the lease, the watchdog's loss signal and the signals sent to us; what to do about each is decided in
`fencelock._cli.exits`.

The command runs as the leader of a process group of its own, and every signal fencelock sends goes to that
whole group: a `sh -c '...'` that does not exec, and whatever else the command starts, is stopped with it. A process
that leaves the group (setsid, setpgid, a daemon) is stopped with it too: fencelock is a child subreaper, so it stays
below fencelock, found in /proc (`procs.py`; zombies are reaped, not counted). SIGINT, SIGTERM and SIGHUP sent to
fencelock are passed on to the group, unless they were ignored when fencelock started (nohup, a `&` job of a
script): those stay ignored, by fencelock and the command. The group is stopped on a loss, and also when the
lease's renewal goes unconfirmed with no more than --grace of its validity left (`exits.stop_step`); a group with
a stopped (frozen) process gets SIGKILL instead of SIGTERM, since SIGCONT would let it run without the lock. A guardian
process (`guardian.py`) stops the group if fencelock itself dies or hangs. When the main process ends, anything
it left in its group is stopped (SIGTERM, then SIGKILL after --grace) before the lock is released: nothing of the
command runs on without the lock. Signals always go out before anything is printed, and if anything here fails,
the group is killed before the error goes on. See docs/decisions/2026-12-01-run-process-group.md and
2026-12-04-run-guardian.md.

On a terminal, when fencelock is alone in its process group (a shell's job of its own), it hands the terminal's
foreground to the command's group while it runs, as a shell does for a job, so Ctrl-C reaches the whole command
once, straight from the terminal, and an interactive command can read it. In a pipeline or a script it keeps
the terminal where it is (Ctrl-C reaches fencelock's group, and fencelock passes it on), until the command
stops to read the terminal. When the command is stopped from the terminal (Ctrl-Z), fencelock takes the
terminal back and stops itself, as sudo does; on SIGCONT it resumes the command.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from .._errors import BackendError, LockLost, NotAcquired
from .._logic.args import check_renew
from .._logic.timing import lease_clock
from .._sync.client import Locks
from .._sync.lease import Lease
from . import exits, procs
from .children import _alone_in_group, _cannot_run, _Child, _CommandGroup, _send, _spawn, _terminal
from .exits import (
    KILL_MARGIN,
    KILL_WAIT,
    POLL,
    Ending,
    OnLost,
    Stopping,
    Trouble,
    after_exit,
    lease_trouble,
    shell_status,
    stop_step,
)
from .guardian_link import _Guardian
from .show import describe, error, note

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TERMINAL_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
SETTLE = 0.1  # seconds the rest of the group may take to end with its main process before it counts as left over
GUARDIAN_START = 10.0  # seconds the guardian may take to answer its first line before the run is given up


class Interrupted(BaseException):
    """A signal arrived while we waited for the lock (a BaseException: the acquire undoes itself)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _not_ignored(signums: Sequence[int]) -> tuple[int, ...]:
    """The signals that were not ignored when fencelock started: an inherited SIG_IGN (nohup) is left alone."""
    return tuple(s for s in signums if signal.getsignal(s) is not signal.SIG_IGN)


def run(locks: Locks, name: str, command: Sequence[str], *, ttl: float, wait: float | None, busy_status: int,
        on_lost: OnLost, grace: float, quiet: bool = False, service: str = "") -> Ending:
    """Acquire `name`, run `command` while it is held, release it; returns how to exit.
    `quiet`: nothing is said when the lock is busy. `service`: the lock service as shown (FENCELOCK_SERVICE)."""
    lost = threading.Event()
    forwarded = _not_ignored(FORWARDED)

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {signum: signal.signal(signum, interrupt) for signum in forwarded}
    try:
        try:
            lease = locks.acquire(name, ttl=ttl, wait=wait, renew=True, on_lost=lambda _: lost.set())
        except Interrupted as exc:
            note(f"interrupted by {signal.Signals(exc.signum).name} while waiting for lock {name!r}; "
                 "the command did not run")
            return Ending(128 + exc.signum)
        except NotAcquired:
            if quiet:
                return Ending(busy_status)
            why = "is held by another holder" if wait == 0 else f"stayed busy for the whole wait of {wait:g} s"
            error(f"lock {name!r} {why}{_holder(locks, name)}; the command did not run (exit {busy_status})",
                  "--wait S waits for it")
            return Ending(busy_status)
        supervisor = _Supervisor(lease, name, command, lost, on_lost, grace, forwarded, service)
        try:
            return supervisor.run()
        except Interrupted as exc:  # in the moment between the grant and the child's start
            supervisor.close_guardian()
            _release(lease, name)
            note(f"interrupted by {signal.Signals(exc.signum).name}; the command did not run")
            return Ending(128 + exc.signum)
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


UNMARKED_EVERY = 0.5
"""Seconds between looks for the command's processes that carry no mark, for the guardian (a /proc scan each)."""


class _Supervisor(_CommandGroup):
    """One run of the command: start it, watch it, stop it as `exits` says, and release the lock after it. Its
    processes (its group, what left it) and the terminal's hand-over are `children._CommandGroup`'s."""

    def __init__(self, lease: Lease, name: str, command: Sequence[str], lost: threading.Event, on_lost: OnLost,
                 grace: float, forwarded: tuple[int, ...], service: str) -> None:
        self.lease, self.name, self.command, self.lost = lease, name, command, lost
        self.on_lost, self.grace, self.forwarded, self.service = on_lost, grace, forwarded, service
        self.every = check_renew(True, lease.ttl) or lease.ttl / 3
        self.received: list[int] = []
        self.stopping = Stopping()
        self.valid_until = lease_clock() + lease.remaining()
        self.doubted = False       # SIGTERM went out while the lease was in doubt, not lost
        self.guarded = False       # the guardian signalled the group (fencelock was stopped or silent)
        self.told_ignore = False
        self.guardian: _Guardian | None = None
        self.group = 0
        self.terminal: int | None = None  # our terminal's descriptor, while the command's group has it
        self.child: _Child | None = None
        self.passed_stop = False   # we passed a SIGTSTP on: the command's stop it causes is already followed
        self.next_at: float | None = None  # when `stop_step` wants the next look at the latest
        self.run_id = secrets.token_hex(8)  # in the command's environment (`procs.MARKER`): how its guardian knows it
        self.children: set[int] = set()  # this process's children before the command started: never reaped here
        self.started = sys.maxsize  # when the command started (`procs.Proc.start`): none of it runs before
        self.unmarked: tuple[str, ...] = ()  # what the guardian was last told of the command's unmarked processes
        self.looked_at = 0.0  # when they were last looked for

    def close_guardian(self, done: bool = True) -> None:
        if self.guardian is not None:
            self._heard_guardian(self.guardian.close(done), lease_clock())
            self.guardian = None

    def _heard_guardian(self, lines: list[str], now: float) -> None:
        """Follow what the guardian did to the group (it acted while fencelock was stopped or silent)."""
        for line in lines:
            before, self.stopping = self.stopping, exits.heard(self.stopping, line, now)
            self.guarded = self.guarded or self.stopping != before

    # -- the run ---------------------------------------------------------------------------------------------

    def run(self) -> Ending:
        def record(signum: int, frame: FrameType | None) -> None:
            self.received.append(signum)

        previous = {signum: signal.signal(signum, record)
                    for signum in (*self.forwarded, *_not_ignored((signal.SIGTSTP,)))}
        reaper = procs.subreaper(True)  # what the command daemonizes stays below us, to be found and stopped
        try:
            return self._run()
        finally:
            if not reaper:
                procs.subreaper(False)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run(self) -> Ending:
        lease, name, command = self.lease, self.name, self.command
        self.children = {p.pid for p in procs.snapshot() if p.ppid == os.getpid()}
        runs = " ".join([*os.environ.get(procs.MARKER, "").split(), self.run_id])
        env = dict(os.environ, FENCELOCK_NAME=name, FENCELOCK_FENCE=str(lease.fence), FENCELOCK_TOKEN=lease.token,
                   FENCELOCK_SERVICE=self.service, **{procs.MARKER: runs})
        for titled in (True, False):  # an interpreter that cannot find its library without its own path as
            guardian = _Guardian(self.on_lost, self.grace, self.run_id, titled)  # argv[0] gets it back
            guardian.tell(f"valid {self.valid_until!r} {KILL_MARGIN!r}")
            said = guardian.wait_ready(GUARDIAN_START)
            if not guardian.exited or not titled:
                break
            guardian.close(done=True)
        self.guardian = guardian
        self._heard_guardian(said, lease_clock())
        if self.guardian.failure:  # no command runs without its backstop
            why = self.guardian.failure
            self.close_guardian(done=True)
            _release(lease, name)
            error(f"the guardian of `fencelock run` (which stops the command if fencelock dies) is not running: "
                  f"{why}; lock {name!r} was released and the command did not run (exit {exits.LOST})",
                  "is the Python interpreter runnable, with processes and pipes to spare?")
            return Ending(exits.LOST)
        if self.received and self.received[0] != signal.SIGTSTP:  # told to stop before the command started
            self.close_guardian()
            _release(lease, name)
            note(f"interrupted by {signal.Signals(self.received[0]).name}; the command did not run")
            return Ending(128 + self.received[0])
        try:
            self.child = child = _spawn(list(command), env)
        except OSError as exc:
            self.close_guardian()
            status = _cannot_run(command[0], exc)
            _release(lease, name)
            return Ending(status)
        self.group = child.pid  # the command's process group: it and everything it starts, unless they leave it
        started = procs.read(child.pid)
        self.started = started.start if started is not None else 0
        self.guardian.tell(f"group {self.group}")
        try:
            if _terminal() is not None and _alone_in_group():
                self._hand_terminal()
            returncode = self._watch()
            self._stop_leftovers()
        except BaseException:
            self._going_down()
            raise
        finally:
            self._take_terminal_back()
        self.close_guardian(done=True)
        return self._finish(returncode)

    def _finish(self, returncode: int) -> Ending:
        lease, name = self.lease, self.name
        status = shell_status(returncode)
        die_by = signal.SIGINT if returncode == -signal.SIGINT and signal.SIGINT in self.forwarded else None
        if self.lost.is_set() or lease.lost:
            _release(lease, name)
            error(f"lock {name!r} was lost while the command ran (the command's own status was {status}); "
                  f"exit {exits.LOST}", "was the key deleted, or the server unreachable for a whole TTL? "
                  "a longer --ttl rides out longer outages")
            return Ending(exits.LOST)
        if not _release(lease, name):
            error(f"lock {name!r} was lost before the command ended (the command's own status was {status}); "
                  f"exit {exits.LOST}", "a longer --ttl rides out longer outages")
            return Ending(exits.LOST)
        if self.doubted:
            error(f"lock {name!r} could not be confirmed renewed while the command ran, with --grace or less of it "
                  f"left, so the command was stopped (its own status was {status}); exit {exits.LOST}",
                  "is the server reachable? a longer --ttl rides out longer outages")
            return Ending(exits.LOST)
        if self.guarded:
            error(f"fencelock was stopped or unresponsive while lock {name!r}'s validity ran out, so its guardian "
                  f"stopped the command (its own status was {status}); exit {exits.LOST}",
                  "do not stop fencelock (SIGSTOP, a debugger) for longer than a fraction of --ttl")
            return Ending(exits.LOST)
        return Ending(status, die_by)

    def _going_down(self) -> None:
        """Something failed here: before anything else, kill what still runs of the command (unless --on-lost
        ignore), since no one will stop it later. Then release the lock if nothing of it runs."""
        if self.group and self.on_lost is not OnLost.IGNORE and not self.stopping.killed:
            self._send_all(signal.SIGKILL)
            self.stopping = Stopping(self.stopping.termed_at, lease_clock(), True)
        if self.child is not None and self.child.returncode is None and self.stopping.killed:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(KILL_WAIT)  # reaped: a zombie leader would keep its group alive
        gone = not self.group or self._wait_gone(KILL_WAIT)
        self.close_guardian(done=gone)
        if gone:
            with contextlib.suppress(Exception):
                _release(self.lease, self.name)

    # -- while the command's main process runs ---------------------------------------------------------------

    def _watch(self) -> int:
        """Wait for the command's main process; pass signals on, follow its stops, stop its group as the lease
        says. Returns its exit code (negative: the signal that ended it)."""
        child = self.child
        assert child is not None
        while True:
            try:
                pid, status = os.waitpid(child.pid, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:  # pragma: no cover (someone else reaped it)
                child.returncode = 0
                return 0
            if pid:
                if os.WIFSTOPPED(status):
                    self._child_stopped(os.WSTOPSIG(status))
                    continue
                child.returncode = os.waitstatus_to_exitcode(status)
                return child.returncode
            self._forward()
            self._tick()
            time.sleep(self._pause())

    def _pause(self) -> float:
        """How long to sleep before the next look: `POLL`, or less when `stop_step` has a deadline sooner (SIGKILL
        is due before the validity ends, not up to `POLL` after it)."""
        if self.next_at is None:
            return POLL
        return min(POLL, max(0.0, self.next_at - lease_clock()))

    def _forward(self) -> None:
        while self.received:
            signum = self.received.pop(0)
            if signum == signal.SIGTSTP:
                _send(self.group, signal.SIGTSTP)  # the command first, then ourselves (from the terminal: Ctrl-Z)
                self.passed_stop = True
                self._suspend(signum)
            else:
                self._send_all(signum)
                self._send_all(signal.SIGCONT)  # a stopped command must see it now, not when it is resumed

    def _tick(self) -> None:
        """Look at the lease; signal the group if `stop_step` says so, then tell the guardian, then say it."""
        lease, now = self.lease, lease_clock()
        if self.guardian is not None:
            self._heard_guardian(self.guardian.answers(), now)
        remaining = lease.remaining()
        if remaining > 0.0:
            self.valid_until = now + remaining
        trouble = lease_trouble(self.lost.is_set() or lease.lost, remaining, lease.ttl, self.every)
        if trouble is Trouble.LOST and self.on_lost is OnLost.IGNORE and not self.told_ignore:
            self.told_ignore = True
            note(f"lost lock {self.name!r} while the command ran (pid {self.group}); it runs on (--on-lost ignore)")
        step = stop_step(self.on_lost, self.stopping, trouble, now, self.valid_until, self.grace)
        frozen = step.signal == signal.SIGTERM and self._frozen()
        if frozen:  # SIGTERM cannot be handled by a stopped process, and SIGCONT would let it run without the lock
            step = stop_step(self.on_lost, self.stopping, trouble, now, self.valid_until, self.grace, frozen=True)
        self._step(step, trouble, now, frozen)
        if self.guardian is not None:
            self.guardian.tell(f"valid {self.valid_until!r} {KILL_MARGIN!r}")
            if now >= self.looked_at + UNMARKED_EVERY:
                self._tell_unmarked(now)

    def _tell_unmarked(self, now: float) -> None:
        """Tell the guardian the command's processes that carry no mark (it finds the others itself), when they
        change: if fencelock dies, they may no longer be below anything that knows them."""
        self.looked_at = now
        found = tuple(sorted(f"{p.pid}:{p.start}" for p in self._unmarked(procs.snapshot())))
        if found != self.unmarked and self.guardian is not None:
            self.unmarked = found
            self.guardian.tell(" ".join(("also", *found)))

    def _step(self, step: exits.Stop, trouble: Trouble, now: float, frozen: bool = False) -> None:
        before, self.stopping, self.next_at = self.stopping, step.state, step.next_at
        if step.signal is None:
            if step.state.kill_at != before.kill_at and step.state.kill_at is not None and self.guardian:
                self.guardian.tell(f"stop {step.state.kill_at!r}")
            return
        self._send_all(step.signal)
        if step.signal == signal.SIGTERM:
            self._send_all(signal.SIGCONT)
            if self.guardian is not None:
                self.guardian.tell(f"stop {step.state.kill_at!r}")
        elif self.guardian is not None:
            self.guardian.tell("kill")
        name, pid, grace = self.name, self.group, self.grace
        left = max(0.0, self.valid_until - now)
        if frozen:
            self.doubted = self.doubted or trouble is Trouble.DOUBT
            why = ("is in doubt (its renewal is unconfirmed)" if trouble is Trouble.DOUBT else
                   "was lost while the command ran")
            note(f"lock {name!r} {why}, and pid {pid} or its group is stopped (frozen): it cannot handle SIGTERM, "
                 "and continuing it would let it run without the lock; sent SIGKILL to its group")
        elif step.signal == signal.SIGKILL and before.termed_at is not None:
            note(f"pid {pid} and its group did not exit within {now - before.termed_at:.1f} s of SIGTERM; "
                 "sent SIGKILL to its group")
        elif trouble is Trouble.DOUBT:
            self.doubted = True
            if step.signal == signal.SIGTERM:
                note(f"lock {name!r} is in doubt (its renewal is unconfirmed) with {left:.1f} s of its validity left, "
                     f"no more than --grace: sent SIGTERM to pid {pid} and its process group, SIGKILL when the "
                     "validity ends if they have not exited")
            else:
                note(f"lock {name!r}'s validity ends in {left:.2f} s with its renewal unconfirmed; sent SIGKILL to "
                     f"pid {pid} and its process group")
        elif step.signal == signal.SIGTERM:
            note(f"lost lock {name!r} while the command ran; sent SIGTERM to pid {pid} and its process group, "
                 f"SIGKILL in {grace:g} s if they have not exited")
        else:
            note(f"lost lock {name!r} while the command ran; sent SIGKILL to pid {pid} and its process group")

    # -- after the main process ended ------------------------------------------------------------------------

    def _stop_leftovers(self) -> None:
        """The main process has ended: what it left running in its group would go on without the lock, so it is
        stopped before the release, as `after_exit` says (and sooner, as `stop_step` says, if the lease is in
        trouble meanwhile)."""
        group = self.group
        killed_at: float | None = None
        settle = SETTLE if self.next_at is None else min(SETTLE, max(0.0, self.next_at - lease_clock()))
        self._wait_gone(settle)  # what a signal to the whole group just ended is no leftover
        while self._alive():
            self._forward()
            now = lease_clock()
            self._tick()
            if not self.stopping.killed:
                step = after_exit(self.stopping.termed_at, None, now, self.grace)
                if step.signal == signal.SIGTERM:
                    self._send_all(signal.SIGTERM)
                    self._send_all(signal.SIGCONT)
                    self.stopping = Stopping(now, now + self.grace)
                    if self.guardian is not None:
                        self.guardian.tell(f"stop {now + self.grace!r}")
                    note(f"the command left processes running in its process group {group}; sent them SIGTERM, "
                         f"SIGKILL in {self.grace:g} s if they have not exited")
                    self._tick()  # a lease in doubt brings SIGKILL sooner, before its validity ends
                elif self.stopping.kill_at is not None and now >= self.stopping.kill_at:
                    self._send_all(signal.SIGKILL)
                    self.stopping = Stopping(self.stopping.termed_at, now, True)
                    if self.guardian is not None:
                        self.guardian.tell("kill")
                    note(f"processes of group {group} did not exit within {now - (self.stopping.termed_at or now):.1f}"
                         " s of SIGTERM; sent SIGKILL")
            if self.stopping.killed:
                killed_at = now if killed_at is None else killed_at
                if now >= killed_at + KILL_WAIT:
                    error(f"processes of group {group} outlived SIGKILL for {KILL_WAIT:g} s; releasing lock "
                          f"{self.name!r} anyway")
                    return
            time.sleep(self._pause())

    # -- stops: Ctrl-Z, and reading the terminal --------------------------------------------------------------

    def _child_stopped(self, signum: int) -> None:
        """The command's main process stopped. Wanting the terminal while we have it: it gets it. Stopped from the
        terminal (Ctrl-Z), or wanting a terminal we do not have: we stop too, so that the shell sees the job
        stopped. A SIGSTOP from someone else: it stays stopped, and the lock stays held."""
        if signum not in TERMINAL_STOPS:
            return
        if signum == signal.SIGTSTP and self.passed_stop:
            self.passed_stop = False  # the stop we passed on: we followed it already
            return
        if signum != signal.SIGTSTP and self.terminal is None and _terminal() is not None:
            self._hand_terminal()  # it stopped to read (or set) the terminal, which is ours to give: give it
            return
        self._suspend(signum)

    def _suspend(self, signum: int) -> None:
        """Stop ourselves (as the command was), the terminal taken back first; when continued, resume it."""
        had_terminal = self.terminal is not None
        self._take_terminal_back()
        note(f"the command was stopped ({signal.Signals(signum).name}); fencelock stops too. Lock {self.name!r} is "
             "not renewed while fencelock is stopped: resume it (fg) within "
             f"{max(0.0, self.valid_until - lease_clock()):.0f} s, or the command is killed when the lock runs "
             "out")
        previous = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.kill(os.getpid(), signal.SIGTSTP)  # (an orphaned process group is not stopped: then we go on)
        finally:
            signal.signal(signal.SIGTSTP, previous)
        # continued (fg, bg, or SIGCONT): the command too, unless its lock went meanwhile (the next tick stops it)
        self._tick()
        if self.stopping.termed_at is not None or self.stopping.killed:
            return
        if had_terminal or signum != signal.SIGTSTP:
            self._hand_terminal()
        _send(self.group, signal.SIGCONT)


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
