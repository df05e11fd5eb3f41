"""`fencelock run` stops the whole command, not only its direct child: Debian's `sh -c '...'` does not exec, so
the work is a grandchild, and it must not run on while another holder has the lock.

Invariant: when `fencelock run` exits (so before its lock is released, or after it was lost), no process of the
command is left: not on a loss, not on SIGTERM to fencelock, not when a grandchild ignores SIGTERM (it is
SIGKILLed after --grace), not when the command ended and left something behind, and not on Ctrl-C on a
terminal. The processes are found in /proc, by parentage, and checked there the moment fencelock exits.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencelock._cli.exits import shell_status
from fencelock._redis.keys import redis_keys
from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisServer
from fencelock.testing.timing import slack

from .test_cli import FENCELOCK, _env, forked, py, start, status_of, wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of `pid` from /proc, or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Running (a zombie is not: it waits only for its reaper)."""
    found = _stat(pid)
    return found is not None and found[0] != "Z"


def children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None and found[1] == pid and found[0] != "Z":
                kids.append(int(entry.name))
    return kids


def grandchild(fencelock_pid: int, reap: list[int], timeout: float = 20.0) -> tuple[int, int]:
    """The command's shell (fencelock's child) and the sleep it runs (its child)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for shell in children(fencelock_pid):
            kids = children(shell)
            if kids:
                reap += [shell, kids[0]]
                return shell, kids[0]
        time.sleep(0.02)
    raise AssertionError("the command's grandchild never appeared")


@pytest.fixture(autouse=True)
def reap() -> Iterator[list[int]]:
    """PIDs a test found; any still alive after it (the bug this file tests for) are SIGKILLed, by PID."""
    found: list[int] = []
    yield found
    for pid in found:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def wait_exit(proc: subprocess.Popen[str]) -> str:
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()     # (not communicate: a process that outlived it may hold its stderr open)
        raise
    return err


def test_a_lost_lock_stops_the_grandchild_too(standalone: RedisServer, name: str,
        reap: list[int]) -> None:
    proc = start("run", "--ttl", "1", name, "--", "sh", "-c", "sleep 1000; :", url=standalone.url)
    shell, sleeper = grandchild(proc.pid, reap)
    standalone.client().delete(redis_keys(name).lock)   # another holder may take it now
    err = wait_exit(proc)
    assert not alive(sleeper), "the grandchild ran on after the lock was lost"
    assert not alive(shell)
    assert proc.returncode == 70, err
    assert "sent SIGTERM" in err


def test_sigterm_to_fencelock_stops_the_grandchild_before_the_release(standalone: RedisServer, name: str,
        reap: list[int]) -> None:
    proc = start("run", name, "--", "sh", "-c", "sleep 1000; :", url=standalone.url)
    _, sleeper = grandchild(proc.pid, reap)
    proc.send_signal(signal.SIGTERM)
    err = wait_exit(proc)
    assert not alive(sleeper), "the grandchild ran on after fencelock was told to stop"
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert not status_of(standalone.url, name).held


def test_a_grandchild_that_ignores_sigterm_is_killed_after_the_grace(standalone: RedisServer, name: str,
        reap: list[int]) -> None:
    # `trap '' TERM` is inherited: the shell and its sleep both ignore SIGTERM
    proc = start("run", "--ttl", "1", "--grace", "0.5", name, "--", "sh", "-c", "trap '' TERM; sleep 1000; :",
                 url=standalone.url)
    _, sleeper = grandchild(proc.pid, reap)
    standalone.client().delete(redis_keys(name).lock)
    err = wait_exit(proc)
    assert not alive(sleeper), "the grandchild that ignored SIGTERM was not SIGKILLed after --grace"
    assert proc.returncode == 70, err
    assert "sent SIGKILL" in err
    assert err.count("sent SIGKILL") == 1, err          # said once, for the loss and the leftovers alike


def test_what_the_command_leaves_behind_is_stopped_before_the_release(standalone: RedisServer, name: str,
                                                                     tmp_path: Path, reap: list[int]) -> None:
    left = tmp_path / "left"
    proc = start("run", "--grace", "0.5", name, "--", "sh", "-c", f"sleep 1000 & echo $! > {left}; exit 0",
                 url=standalone.url)
    sleeper = int(wait_for(left).strip())
    reap.append(sleeper)
    err = wait_exit(proc)
    assert not alive(sleeper), "a process the command left behind ran on after the release"
    assert proc.returncode == 0, err
    assert "left processes running" in err
    assert not status_of(standalone.url, name).held


def _on_a_terminal(argv: list[str]) -> tuple[int, int]:
    pid, master = pty.fork()
    forked(pid)
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        os.execve(argv[0], argv, _env())
    return pid, master


def _wait_pty(pid: int, master: int, timeout: float = 30.0) -> tuple[int, bytes]:
    """The status as a shell shows it (128+N for a process that signal N ended), and what the terminal showed."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return shell_status(os.waitstatus_to_exitcode(status)), out
        try:
            out += os.read(master, 4096)          # keep the terminal's output flowing
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"fencelock did not exit; the terminal showed {out!r}")


def test_ctrl_c_on_a_terminal_stops_the_whole_command(standalone: RedisServer, name: str,
        reap: list[int]) -> None:
    pid, master = _on_a_terminal([*FENCELOCK, "run", f"--url={standalone.url}", name, "--",
                                  "sh", "-c", "sleep 1000; :"])
    try:
        shell, sleeper = grandchild(pid, reap)
        os.write(master, b"\x03")                # Ctrl-C, typed on the terminal
        status, out = _wait_pty(pid, master)
    finally:
        os.close(master)
    assert not alive(sleeper), f"the grandchild survived Ctrl-C; the terminal showed {out!r}"
    assert not alive(shell)
    assert status == 128 + signal.SIGINT, out
    assert not status_of(standalone.url, name).held


def test_an_interactive_command_still_reads_the_terminal(standalone: RedisServer, name: str,
                                                         tmp_path: Path) -> None:
    got = tmp_path / "got"
    pid, master = _on_a_terminal([*FENCELOCK, "run", f"--url={standalone.url}", name, "--",
                                  "sh", "-c", f"read answer; echo \"$answer\" > {got}"])
    try:
        grandchild_or_shell = 0
        deadline = time.monotonic() + 20
        while not grandchild_or_shell and time.monotonic() < deadline:
            kids = children(pid)
            grandchild_or_shell = kids[0] if kids else 0
            time.sleep(0.02)
        os.write(master, b"yes\n")
        status, out = _wait_pty(pid, master)
    finally:
        os.close(master)
    assert status == 0, out
    assert got.read_text().strip() == "yes"


# -- the rule for leftovers, on a fake clock -------------------------------------------------------------------

def test_leftovers_get_sigterm_then_sigkill_after_the_grace_then_are_given_up_on() -> None:
    from fencelock._cli.exits import KILL_WAIT, Step, after_exit

    assert after_exit(None, None, 100.0, 2.0) == Step(signal.SIGTERM, 102.0)
    assert after_exit(100.0, None, 101.9, 2.0) == Step(None, 102.0)          # within the grace: wait
    assert after_exit(100.0, None, 102.0, 2.0) == Step(signal.SIGKILL, 102.0 + KILL_WAIT)
    assert after_exit(100.0, 102.0, 103.0, 2.0) == Step(None, 102.0 + KILL_WAIT)
    assert after_exit(100.0, 102.0, 102.0 + KILL_WAIT, 2.0) == Step(None, None)  # give up, release anyway
    # a loss that already sent SIGTERM counts its grace from then, not from the main process's end
    assert after_exit(90.0, None, 100.0, 2.0) == Step(signal.SIGKILL, 100.0 + KILL_WAIT)


# -- a lock in doubt ---------------------------------------------------------------------------------------------

def test_a_lock_in_doubt_gets_sigterm_while_its_key_exists_and_sigkill_before_it_expires(
        standalone: RedisServer, name: str, tmp_path: Path, reap: list[int]) -> None:
    """Cut off from the server (a stalling proxy: a partition), the lease cannot be renewed; with --grace (10 s)
    longer than what is left of it, SIGTERM goes out as soon as the renewal is late, and SIGKILL when the
    validity ends: the command never runs while the server lets someone else take the lock."""
    ready, termed = tmp_path / "ready", tmp_path / "termed"
    child = py(f"""
        import os, signal, time
        def handler(signum, frame):
            open({str(termed)!r}, "w").write("yes")        # a slow shutdown, longer than the lock lasts
        signal.signal(signal.SIGTERM, handler)
        open({str(ready)!r}, "w").write(str(os.getpid()))
        while True:
            time.sleep(0.05)
    """)
    raw, key = standalone.client(), redis_keys(name).lock
    with Proxy("127.0.0.1", standalone.port, name="partition") as proxy:
        proc = start("run", "--ttl", "3", name, "--", *child, url=f"redis://127.0.0.1:{proxy.port}/0")
        pid = int(wait_for(ready))
        reap.append(pid)
        proxy.stall()
        wait_for(termed)
        assert raw.exists(key), "SIGTERM came only after the server had dropped the lock"
        deadline = time.monotonic() + slack(10.0)
        while alive(pid):                       # read the server, then the process: an order, not a time
            exists = raw.exists(key)
            if not alive(pid):
                break
            assert exists, "the command still ran after the server had dropped the lock"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proxy.heal()
        err = wait_exit(proc)
    assert proc.returncode == 70, err
    assert "in doubt" in err


# -- a frozen command --------------------------------------------------------------------------------------------

def test_a_frozen_command_whose_lock_is_lost_is_killed_without_running_again(
        standalone: RedisServer, name: str, tmp_path: Path, reap: list[int]) -> None:
    """A command stopped by SIGSTOP cannot handle SIGTERM; a SIGCONT after it would let it run (its handler, its
    work) without the lock. It gets SIGKILL at once: it never runs again."""
    ready, ran = tmp_path / "ready", tmp_path / "ran"
    child = py(f"""
        import os, signal, time
        def handler(signum, frame):
            open({str(ran)!r}, "a").write("handler\\n")     # a slow shutdown, while the lock is gone
            time.sleep(30)
        signal.signal(signal.SIGTERM, handler)
        open({str(ready)!r}, "w").write(str(os.getpid()))
        while True:
            time.sleep(0.01)
            if os.path.exists({str(ready)!r} + ".stopped"):
                open({str(ran)!r}, "a").write("work\\n")   # ran again after it was frozen
    """)
    proc = start("run", "--ttl", "2", name, "--", *child, url=standalone.url)
    pid = int(wait_for(ready))
    reap.append(pid)
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + slack(5.0)
    while _stat(pid) is not None and _stat(pid)[0] != "T":   # type: ignore[index]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (tmp_path / "ready.stopped").write_text("yes")
    standalone.client().delete(redis_keys(name).lock)       # another holder may take it now
    err = wait_exit(proc)
    assert not alive(pid)
    assert not ran.exists(), f"the frozen command ran again without the lock: {ran.read_text()!r}; {err}"
    assert proc.returncode == 70, err
    assert "stopped (frozen)" in err


# -- processes that left the command's process group -------------------------------------------------------------

STRAY = "setsid sh -c 'sleep 1000 & echo $! > {left}; wait' & sleep 1000; :"
"""The command's shell starts a process in a session of its own (a daemon's setsid), whose child is the stray."""

DAEMON = "(setsid sh -c 'sleep 1000 & echo $! > {left}' &) ; sleep 1000; :"
"""A double fork: the stray's parent exits at once, so the stray is an orphan, no longer below the command's shell."""


@pytest.mark.parametrize("shape", [STRAY, DAEMON], ids=["setsid", "daemon"])
def test_a_lost_lock_stops_processes_that_left_the_group(standalone: RedisServer, name: str, tmp_path: Path,
                                                         reap: list[int], shape: str) -> None:
    left = tmp_path / "left"
    proc = start("run", "--ttl", "2", "--grace", "0.5", name, "--", "sh", "-c", shape.format(left=left),
                 url=standalone.url)
    stray = int(wait_for(left).strip())
    reap.append(stray)
    assert _stat(stray) is not None
    standalone.client().delete(redis_keys(name).lock)
    err = wait_exit(proc)
    assert not alive(stray), f"a process that left the command's group ran on after the loss: {err}"
    assert proc.returncode == 70, err


def test_what_left_the_group_is_stopped_before_the_release(standalone: RedisServer, name: str, tmp_path: Path,
                                                           reap: list[int]) -> None:
    left = tmp_path / "left"
    proc = start("run", "--grace", "0.5", name, "--", "sh", "-c",
                 f"(setsid sh -c 'sleep 1000 & echo $! > {left}' &); while [ ! -s {left} ]; do sleep 0.01; done",
                 url=standalone.url)
    stray = int(wait_for(left).strip())
    reap.append(stray)
    err = wait_exit(proc)
    assert not alive(stray), f"a daemon the command left ran on after the release: {err}"
    assert proc.returncode == 0, err
    assert not status_of(standalone.url, name).held


UNMARKED = ("(setsid env -i sh -c 'sleep 1000 & echo $! > {left}' &); while [ ! -s {left} ]; do sleep 0.01; done;"
            " sleep 0.6")
"""A daemon whose environment was emptied (`env -i`, as sudo or a cleaned subprocess do): it carries no mark of
the run. fencelock still finds it below itself, its subreaper; the sleep lets it tell its guardian."""


def test_a_daemon_with_an_emptied_environment_is_stopped_before_the_release(standalone: RedisServer, name: str,
                                                                            tmp_path: Path,
                                                                            reap: list[int]) -> None:
    """It used to run on after the release, while the next holder had the lock (found by an outside probe)."""
    left = tmp_path / "left"
    proc = start("run", "--grace", "0.5", name, "--", "sh", "-c", UNMARKED.format(left=left), url=standalone.url)
    stray = int(wait_for(left).strip())
    reap.append(stray)
    err = wait_exit(proc)
    assert not alive(stray), f"a daemon with no mark ran on after the release: {err}"
    assert proc.returncode == 0, err
    assert not status_of(standalone.url, name).held


def test_sigterm_to_fencelock_stops_what_left_the_group(standalone: RedisServer, name: str, tmp_path: Path,
                                                        reap: list[int]) -> None:
    left = tmp_path / "left"
    proc = start("run", name, "--", "sh", "-c", DAEMON.format(left=left), url=standalone.url)
    stray = int(wait_for(left).strip())
    reap.append(stray)
    proc.send_signal(signal.SIGTERM)
    err = wait_exit(proc)
    assert not alive(stray), f"a daemon of the command ran on after fencelock was told to stop: {err}"
    assert proc.returncode == 128 + signal.SIGTERM, err


def test_a_normal_run_is_not_slowed_by_zombies_it_inherits(standalone: RedisServer, name: str) -> None:
    # orphans of the command (in its group, and out of it) end at once: zombies reaped, not waited out as leftovers
    started_at = time.monotonic()
    proc = start("run", "--grace", "5", name, "--", "sh", "-c",
                 "(sleep 0.1 &); (setsid sh -c 'sleep 0.1 &' &); sleep 0.5", url=standalone.url)
    err = wait_exit(proc)
    assert proc.returncode == 0, err
    assert "left processes running" not in err
    assert time.monotonic() - started_at < slack(4.0), err


# -- how the command is started ----------------------------------------------------------------------------------

def test_without_process_group_popen_the_command_is_spawned_in_a_group_of_its_own(
        standalone: RedisServer, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.10 has no Popen(process_group=); fencelock then uses posix_spawn(setpgroup=0), never preexec_fn
    (Python code in a child forked beside the renewal thread). Run here on that path: the command leads its own
    group, SIGPIPE is back to its default (as Popen does), and PATH lookups and missing programs behave the same."""
    import functools

    import fencelock
    from fencelock._cli import children, supervise
    from fencelock._cli.exits import OnLost

    seen = tmp_path / "seen"
    monkeypatch.setattr(supervise, "_spawn", functools.partial(children._spawn, posix_spawn=True))
    # (a shell, not Python: Python ignores SIGPIPE itself at start)
    script = f"echo $$ $(ps -o pgid= -p $$) $(grep SigIgn /proc/self/status | cut -f2) > {seen}"
    with fencelock.connect(standalone.url) as locks:
        ending = supervise.run(locks, name, ["sh", "-c", script], ttl=30.0, wait=0, busy_status=75,
                               on_lost=OnLost.TERM, grace=10.0)
        assert ending.status == 0
        pid, pgid, ignored = seen.read_text().split()
        assert pid == pgid                                         # the leader of a group of its own
        assert not int(ignored, 16) & (1 << (signal.SIGPIPE - 1))  # SIGPIPE not ignored
        missing = supervise.run(locks, name, ["no-such-program-here"], ttl=30.0, wait=0, busy_status=75,
                                on_lost=OnLost.TERM, grace=10.0)
        assert missing.status == 127
    assert not status_of(standalone.url, name).held
