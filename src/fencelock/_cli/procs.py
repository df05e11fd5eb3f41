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
    """One process as /proc/PID/stat shows it: its parent, its process group, its state (R, S, D, T, t, Z, ...)."""

    pid: int
    ppid: int
    pgid: int
    state: str

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
        return Proc(pid, int(fields[1]), int(fields[2]), fields[0].decode())
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


def in_group(procs: list[Proc], pgid: int) -> list[Proc]:
    """The live processes of process group `pgid`."""
    return [p for p in procs if p.pgid == pgid and p.live]


def any_stopped(procs: list[Proc]) -> bool:
    """Whether one of `procs` is stopped: it cannot handle SIGTERM until it is continued."""
    return any(p.stopped for p in procs)
