"""The guardian of `fencelock run`: stops the command's process group if fencelock itself dies or falls silent.

fencelock starts it by path (`python -E -s guardian.py POLICY GRACE RUN_ID` with argv[0] `fencelock run-guardian`, so
`ps` shows what it is; about 10 ms: it imports no package, only the siblings `exits` and `procs`) in a session of
its own, before the command starts, with the read end of a pipe as stdin. fencelock
keeps the write end (the command never holds it) and writes lines:

    group PGID     the command's process group, once it started
    valid T D      every 50 ms: the lock's validity end on the lease clock, CLOCK_BOOTTIME (`exits.lease_clock`),
                   and the margin D before it by which SIGKILL is due (`exits.KILL_MARGIN`); the first one is answered
                   `ready` on stdout: fencelock starts no command before its guardian answered
    stop K         fencelock sent SIGTERM to the group; SIGKILL is due at K
    kill           fencelock sent SIGKILL to the group
    also P:S ...   the command's processes outside its group that carry no mark (`env -i`): pid and start time
    done           nothing of the group runs; fencelock releases the lock next. The guardian exits.

End of file without `done` means fencelock is gone (SIGKILL, OOM, a crash): the guardian stops the group at once as
--on-lost says. Silence while the validity runs out means fencelock is stopped or hung: the guardian stops the group
by the same rule as fencelock would in doubt, and SIGKILL goes out before the last validity end it heard even if
fencelock fell silent just before it. Whatever it sends, it says on stdout, a pipe fencelock reads (`stop K`,
`kill`), so that a fencelock that comes back knows its command was stopped. Every decision is `exits.guard_step`;
this file only reads, signals and waits. It is in no process group that a terminal or a `kill -- -PGID` aims at;
SIGINT, SIGHUP and SIGTERM are ignored all the same (a `pkill` of fencelock must not take its backstop with it), and
it never lingers: it exits on `done`, once the group is gone after it acted, or `KILL_WAIT` after its SIGKILL. See
docs/decisions/2026-12-04-run-guardian.md.
"""

from __future__ import annotations

import math
import os
import select
import signal
import sys
import threading
import time

if __package__:
    from . import exits, procs
else:  # run by path: sys.path[0] is this folder, and the package is not imported (it costs 0.2 s)
    import exits  # type: ignore[import-not-found,no-redef,unused-ignore]
    import procs  # type: ignore[import-not-found,no-redef,unused-ignore]

LOOK = 0.05  # seconds between looks at the group once fencelock is gone
FLUSH = 0.5  # seconds the notes may take to be written when the guardian exits

_writers: list[threading.Thread] = []


def note(text: str) -> None:
    """One line on stderr, from a thread: a full or stalled stderr never holds back a signal (best effort)."""
    data = f"fencelock: guardian: {' '.join(text.split())}\n".encode(errors="replace")

    def write() -> None:
        try:
            os.write(2, data)
        except OSError:
            pass

    try:
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
    except RuntimeError:
        return
    _writers.append(writer)


def flush() -> None:
    """Give the notes `FLUSH` seconds in all to reach stderr."""
    deadline = time.monotonic() + FLUSH
    for writer in _writers:
        writer.join(max(0.0, deadline - time.monotonic()))


def checked_group(group: int) -> int | None:
    """`group` if it can be a command's own process group: killpg(0) is our group and killpg(1) is kill(-1),
    every process we may signal."""
    return group if group > 1 and group != os.getpgrp() else None


UNMARKED: dict[int, int] = {}
"""The command's processes that carry no mark (`env -i`), as fencelock last told (`also PID:START ...`)."""


def strays(run_id: str) -> list[procs.Proc]:
    """The command's live processes that left its group, found by the run's id in their environment (fencelock,
    their subreaper, may be gone, and they with it moved to another parent), and those fencelock told of."""
    found = procs.with_marker(procs.snapshot(), run_id, skip=frozenset([os.getpid()])) if run_id else []
    known = {p.pid for p in found}
    for pid, start in UNMARKED.items():
        proc = procs.same(pid, start) if pid not in known else None
        if proc is not None:
            found.append(proc)
    return found


def ours(found: list[procs.Proc], group: int, run_id: str) -> list[procs.Proc]:
    """The live processes of `group`, if it is still the command's: one of them carries the run's id. A group
    whose processes all ended can have its number reused by someone else's; then none (never signalled)."""
    members = procs.in_group(found, group)
    if not run_id or any(procs.marked(p.pid, run_id) for p in members):
        return members
    return []


def group_alive(group: int, run_id: str = "") -> bool:
    """Whether anything of the command runs: its group (zombies left out where /proc tells), or a stray."""
    found = procs.snapshot()
    if found:
        return bool(ours(found, group, run_id) or strays(run_id))
    return procs.group_has_process(group)


def send(group: int, signum: int, run_id: str = "") -> None:
    """`signum` to the command's group, if it is still the command's (`ours`), and to its processes that left
    it."""
    found = procs.snapshot()
    if not found or ours(found, group, run_id):
        try:
            os.killpg(group, signum)
        except (ProcessLookupError, PermissionError):
            pass
    for stray in strays(run_id):
        try:
            os.kill(stray.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def answer(line: str) -> None:
    """Tell fencelock (on stdout, a pipe it reads) what was sent to the group; best effort, never blocks."""
    try:
        os.write(1, f"{line}\n".encode())
    except OSError:
        pass


def main(argv: list[str]) -> int:
    policy, grace = exits.OnLost(argv[1]), float(argv[2])
    run_id = argv[3] if len(argv) > 3 else ""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    try:
        os.set_blocking(1, False)  # a fencelock that does not read its answers never holds a signal back
    except OSError:
        pass
    parent = os.getppid()
    group: int | None = None
    valid_until = math.inf
    margin = exits.KILL_MARGIN
    answered = False  # `ready` was said
    heard_at = exits.lease_clock()
    eof = False
    state = exits.Stopping()
    killed_at: float | None = None
    pending = b""
    next_at: float | None = None
    while True:
        now = exits.lease_clock()
        if not eof:
            wait = 1.0 if next_at is None else min(1.0, max(0.0, next_at - now))
            try:
                ready, _, _ = select.select([0], [], [], wait)
            except InterruptedError:  # pragma: no cover (PEP 475 retries)
                ready = []
            if ready:
                try:
                    data = os.read(0, 65536)
                except OSError:
                    data = b""
                now = exits.lease_clock()
                if not data:
                    eof = True
                else:
                    heard_at = now
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    for raw in lines:
                        line = raw.decode(errors="replace").strip()
                        if line == "done":
                            return 0
                        words = line.split()
                        try:
                            if words[:1] == ["group"]:
                                group = checked_group(int(words[1]))
                            elif words[:1] == ["also"]:
                                UNMARKED.clear()
                                UNMARKED.update((int(p), int(t)) for p, _, t in (w.partition(":") for w in words[1:]))
                            elif words[:1] == ["valid"]:
                                valid_until = float(words[1])
                                margin = float(words[2]) if len(words) > 2 else margin
                                if not answered:
                                    answer("ready")
                                    answered = True
                            else:
                                state = exits.heard(state, line, now)
                        except (IndexError, ValueError):
                            continue
        else:
            time.sleep(LOOK if next_at is None else min(LOOK, max(0.0, next_at - now)))
            now = exits.lease_clock()
        if group is None:
            if eof:
                return 0  # fencelock went before the command started (or between its start and `group`)
            next_at = None
            continue
        step = exits.guard_step(policy, state, now, grace, heard_at=heard_at, valid_until=valid_until, eof=eof,
                                margin=margin)
        if step.signal == signal.SIGTERM and procs.any_stopped(procs.in_group(procs.snapshot(), group)):
            step = exits.guard_step(policy, state, now, grace, heard_at=heard_at, valid_until=valid_until, eof=eof,
                                    margin=margin, frozen=True)  # a stopped process cannot handle SIGTERM
        next_at = step.next_at
        silent = now >= heard_at + exits.SILENT
        acting = eof or silent  # fencelock is not there to say `done`
        if acting and not group_alive(group, run_id):
            return 0
        if step.signal is not None:
            send(group, step.signal, run_id)
            answer("kill" if step.signal == signal.SIGKILL else f"stop {step.state.kill_at!r}")
            why = (f"fencelock (pid {parent}) ended without stopping its command" if eof else
                   f"fencelock (pid {parent}) has been silent for {now - heard_at:.1f} s while its lock's validity "
                   f"ends in {max(0.0, valid_until - now):.1f} s" if silent else
                   f"the validity of fencelock's (pid {parent}) lock ends in {max(0.0, valid_until - now):.2f} s "
                   "unconfirmed")
            if step.signal == signal.SIGTERM:
                note(f"{why}; sent SIGTERM to process group {group}, SIGKILL in {step.state.kill_at - now:.1f} s "
                     "if it has not exited" if step.state.kill_at is not None else
                     f"{why}; sent SIGTERM to process group {group}")
            else:
                note(f"{why}; sent SIGKILL to process group {group}")
        state = step.state
        if eof and policy is exits.OnLost.IGNORE:
            return 0
        if state.killed:
            killed_at = now if killed_at is None else killed_at
            if acting and now >= killed_at + exits.KILL_WAIT:
                note(f"processes of group {group} outlived SIGKILL for {exits.KILL_WAIT:g} s")
                return 1
            next_at = now + LOOK if acting else None


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    finally:
        flush()


if __name__ == "__main__":
    sys.exit(run(sys.argv))
