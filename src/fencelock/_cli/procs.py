"""The processes of `fencelock run`'s command, read from /proc (Linux): who is in its group, who descends from it,
who is stopped. Reading only; signals are sent by the caller. Pure standard library: the guardian, run by path
without the package, imports it too. Elsewhere (no /proc) every answer is "none found".
"""

from __future__ import annotations

import os
from dataclasses import dataclass

STOPPED = frozenset("Tt")  # stopped by a signal (SIGSTOP, SIGTSTP, ...) or by a tracer


@dataclass(frozen=True)
class Proc:
    """One process as /proc/PID/stat shows it: its parent, its process group, its state (R, S, D, T, t, Z, ...),
    and when it started (clock ticks since boot: with the pid, it names one process, whatever reuses the pid)."""

    pid: int
    ppid: int
    pgid: int
    state: str
    start: int = 0

    @property
    def live(self) -> bool:
        """It runs or can run again: not a zombie (a zombie only waits for its parent to reap it)."""
        return self.state not in ("Z", "X")

    @property
    def stopped(self) -> bool:
        return self.state in STOPPED


def read(pid: int) -> Proc | None:
    """`pid` from /proc, or None if there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        return Proc(pid, int(fields[1]), int(fields[2]), fields[0].decode(), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def snapshot() -> list[Proc]:
    """Every process /proc shows now (not atomic: one that starts or ends meanwhile may be missed)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.isdigit():
            proc = read(int(entry))
            if proc is not None:
                found.append(proc)
    return found


def group_has_process(group: int) -> bool:
    """Whether process group `group` has a process (a zombie counts), by signal 0: where /proc cannot tell."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def in_group(procs: list[Proc], pgid: int) -> list[Proc]:
    """The live processes of process group `pgid`."""
    return [p for p in procs if p.pgid == pgid and p.live]


def any_stopped(procs: list[Proc]) -> bool:
    """Whether one of `procs` is stopped: it cannot handle SIGTERM until it is continued."""
    return any(p.stopped for p in procs)


def descendants(procs: list[Proc], root: int, skip: frozenset[int] = frozenset()) -> list[Proc]:
    """The processes below `root` by parentage (zombies included), leaving out `skip` and everything below it."""
    children: dict[int, list[Proc]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    found: list[Proc] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.pid not in skip and child.pid != root:
                found.append(child)
                todo.append(child.pid)
    return found


MARKER = "FENCELOCK_RUN"
"""The environment variable every process of a `fencelock run` command inherits: the ids of the runs it is under,
separated by spaces (a run inside another's command adds its own)."""


def marked(pid: int, run_id: str) -> bool:
    """Whether process `pid` carries `run_id` in its `MARKER` (its environment as it started; unreadable: no)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            environ = file.read()
    except OSError:
        return False
    prefix = f"{MARKER}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return run_id.encode() in entry[len(prefix):].split()
    return False


def same(pid: int, start: int) -> Proc | None:
    """Process `pid`, if it is still the one that started at `start` and is live (not a reused pid)."""
    proc = read(pid)
    return proc if proc is not None and proc.start == start and proc.live else None


def with_marker(procs: list[Proc], run_id: str, skip: frozenset[int] = frozenset()) -> list[Proc]:
    """The live processes of `procs` that carry `run_id` (see `marked`), leaving out `skip`."""
    return [p for p in procs if p.live and p.pid not in skip and marked(p.pid, run_id)]


PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37


def subreaper(on: bool) -> bool:
    """Make this process the reaper of its orphaned descendants, or no longer (Linux,
    `prctl(PR_SET_CHILD_SUBREAPER)`): a process of the command that daemonizes (its parent exits) stays below us
    instead of moving to init. Returns whether it was one before (False where it cannot be)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
            return False
        libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
        return bool(was.value)
    except (OSError, AttributeError):
        return False
