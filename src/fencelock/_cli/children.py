"""fencelock run's command as a process group: starting it, signalling its group and what left it, finding
whether any of it runs, the terminal's foreground."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

from . import exits, procs
from .exits import POLL
from .guardian_link import _Guardian
from .show import error


def _cannot_run(program: str, exc: OSError) -> int:
    """Say why `program` could not be started; the status a shell would give."""
    if isinstance(exc, FileNotFoundError):
        interpreter = _interpreter(program)
        if interpreter is not None:
            error(f"cannot run {program}: its interpreter {interpreter} (on its #! line) was not found",
                  "fix the #! line, or install the interpreter")
            return exits.NOT_EXECUTABLE
        error(f"command not found: {program}", "give the full path, or check PATH")
        return exits.NOT_FOUND
    if isinstance(exc, PermissionError):
        error(f"command is not executable: {program}", "check its mode (chmod +x) and its #! line")
        return exits.NOT_EXECUTABLE
    error(f"cannot run {program}: {exc}")
    return exits.NOT_EXECUTABLE


def _interpreter(program: str) -> str | None:
    """The #! interpreter of `program` if the file exists and starts with one (then it is the one missing)."""
    path = program if os.sep in program else shutil.which(program)
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            first = file.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return words[0] if words else None


class _Child:
    """The command's main process, as much of `subprocess.Popen` as the supervisor uses."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self._returncode: int | None = None
        self._popen = popen

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @returncode.setter
    def returncode(self, value: int | None) -> None:
        """Reaped here: the Popen object learns it too (else it warns that its process still runs)."""
        self._returncode = value
        if self._popen is not None:
            self._popen.returncode = value

    def wait(self, timeout: float) -> int:
        """Reap it within `timeout` seconds; `subprocess.TimeoutExpired` if it has not ended."""
        deadline = time.monotonic() + timeout
        while self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # pragma: no cover (reaped elsewhere)
                self.returncode = 0
                break
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(POLL / 5)
        return self.returncode


def _spawn(argv: list[str], env: dict[str, str], *, posix_spawn: bool = sys.version_info < (3, 11)) -> _Child:
    """Start the command as the leader of a process group of its own. Python 3.11+: Popen's `process_group`.
    Before (`posix_spawn`): `os.posix_spawnp(setpgroup=0)`, never Popen's `preexec_fn`, which runs Python in the
    forked child and may deadlock on a lock the renewal thread held at the fork; SIGPIPE and SIGXFSZ are reset to
    their defaults, as Popen does, and PATH is read from `env`. OSError if it cannot be started."""
    if not posix_spawn:
        popen = subprocess.Popen(argv, env=env, process_group=0)  # type: ignore[call-overload,unused-ignore]
        return _Child(popen.pid, popen)
    program = argv[0]
    if os.sep not in program:
        found = shutil.which(program, path=env.get("PATH", os.defpath))
        if found is None:
            raise FileNotFoundError(2, "No such file or directory", program)
        program = found
    resets = [s for s in (getattr(signal, "SIGPIPE", None), getattr(signal, "SIGXFSZ", None)) if s is not None]
    return _Child(os.posix_spawn(program, argv, env, setpgroup=0, setsigdef=resets))


def _terminal() -> int | None:
    """A descriptor of our controlling terminal, if our process group is its foreground group; else None."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
        except OSError:
            continue
    return None


def _alone_in_group() -> bool:
    """Whether no other process shares our process group (a shell's job of its own, not a pipeline's member nor a
    script's). Read from /proc; elsewhere, whether we lead our group."""
    group, me = os.getpgrp(), os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:  # pragma: no cover (no /proc)
        return group == me
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(group).encode() and fields[0] != b"Z":
            return False
    return True


def _send(group: int, signum: int | None) -> None:
    """Send `signum` to every process of the command's group (None: nothing)."""
    if signum is None or group <= 1:  # (killpg(1) would be kill(-1): every process we may signal)
        return
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass


class _CommandGroup:
    """The command's processes as `supervise._Supervisor` (which sets these attributes) sees them: its process
    group and what left it, and the terminal's foreground handed to the group and taken back."""

    group: int  # the command's process group (its main process's pid), 0 before it started
    run_id: str  # in the command's environment (`procs.MARKER`): how its processes that left the group are known
    child: _Child | None
    children: set[int]  # fencelock's children before the command started: never reaped here
    started: int  # when the command's main process started (clock ticks since boot, as `procs.Proc.start`)
    guardian: _Guardian | None
    terminal: int | None  # our terminal's descriptor, while the command's group has it

    def _frozen(self) -> bool:
        """Whether a process of the command's group is stopped (SIGSTOP, or a Ctrl-Z it was left in)."""
        found = procs.snapshot()
        return procs.any_stopped(procs.in_group(found, self.group) + self._strays(found))

    def _strays(self, found: list[procs.Proc]) -> list[procs.Proc]:
        """The live processes of the command that left its group (setsid, setpgid, a daemon's double fork): below
        fencelock (a subreaper stays above them), not below the guardian or a child fencelock had before the
        command, and marked with this run's id, or started no earlier than the command (one started with an
        emptied environment, `env -i`, `sudo`, carries no mark)."""
        guardian = [self.guardian.proc.pid] if self.guardian is not None and self.guardian.proc else []
        skip = frozenset([*guardian, *self.children])
        return [p for p in procs.descendants(found, os.getpid(), skip)
                if p.live and p.pgid != self.group and (p.start >= self.started or procs.marked(p.pid, self.run_id))]

    def _unmarked(self, found: list[procs.Proc]) -> list[procs.Proc]:
        """The command's processes outside its group that the guardian cannot find by the mark (see `_strays`)."""
        return [p for p in self._strays(found) if not procs.marked(p.pid, self.run_id)]

    def _send_all(self, signum: int) -> None:
        """Send `signum` to the command's group and to every process of the command that left it."""
        _send(self.group, signum)
        for stray in self._strays(procs.snapshot()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(stray.pid, signum)

    def _alive(self) -> bool:
        """Whether anything of the command runs: a live process in its group or below fencelock (zombies are
        not: those fencelock inherited are reaped here). Without /proc, whether the group has a process."""
        found = procs.snapshot()
        if not found:
            return procs.group_has_process(self.group)
        keep = {self.child.pid if self.child is not None else 0,
                self.guardian.proc.pid if self.guardian is not None and self.guardian.proc else 0, *self.children}
        for orphan in found:  # zombies fencelock inherited as a subreaper: reaped, or they would count as live
            if orphan.ppid == os.getpid() and not orphan.live and orphan.pid not in keep:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(orphan.pid, os.WNOHANG)
        return bool(procs.in_group(found, self.group) or self._strays(found))

    def _wait_gone(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for nothing of the command to run; whether nothing does."""
        deadline = time.monotonic() + timeout
        while self._alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL / 5)
        return True

    def _hand_terminal(self) -> None:
        """Make the command's group the terminal's foreground group, as a shell does for a job, so that Ctrl-C
        (and the rest of what a terminal sends) reaches the whole command, and the command can read the terminal.
        Only where our own process group has the terminal's foreground."""
        fd = _terminal()
        if fd is None:
            return
        try:
            os.tcsetpgrp(fd, self.group)
        except OSError:
            return
        self.terminal = fd
        _send(self.group, signal.SIGCONT)  # in case it read the terminal before it was its own: it was stopped

    def _take_terminal_back(self) -> None:
        fd, self.terminal = self.terminal, None
        if fd is None:
            return
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group asking for the terminal
        try:
            os.tcsetpgrp(fd, os.getpgrp())
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, previous)
