"""`fencelock run` among the signals of shells and terminals: nohup, a script's Ctrl-C, a pipeline on a terminal.

Signals ignored when fencelock starts (nohup, the `&` jobs of a script) stay ignored, for fencelock and the command.
A command that Ctrl-C ended makes fencelock end by SIGINT too (after the release), so a calling script stops as it
would for any other command. In a pipeline or a script, fencelock leaves the terminal to its own process group.
"""

from __future__ import annotations

import os
import pty
import re
import select
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fencelock.testing.servers import RedisServer

from . import test_run_tree as _tree
from .test_cli import FENCELOCK, _env, forked, py, started, status_of, wait_for
from .test_run_tree import _wait_pty, alive, children

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")

reap = _tree.reap


def _command_line(*args: str) -> str:
    return shlex.join([*FENCELOCK, *args])


def test_signals_ignored_by_nohup_stay_ignored_by_fencelock_and_the_command(standalone: RedisServer, name: str,
                                                                              tmp_path: Path) -> None:
    ready, seen = tmp_path / "ready", tmp_path / "seen"
    child = py(f"""
        import signal, time
        ignored = [s.name for s in (signal.SIGHUP, signal.SIGINT) if signal.getsignal(s) is signal.SIG_IGN]
        open({str(seen)!r}, "w").write(" ".join(ignored))
        open({str(ready)!r}, "w").write("ready")
        time.sleep(0.5)
    """)
    # `nohup fencelock run ... &` from a script: SIGHUP and SIGINT ignored from the start
    proc = started(subprocess.Popen(["sh", "-c", "trap '' HUP INT; exec \"$@\"", "sh", *FENCELOCK, "run",
                                     f"--url={standalone.url}", name, "--", *child], env=_env(),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True))
    wait_for(ready)
    proc.send_signal(signal.SIGHUP)        # the terminal hangs up
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err       # neither fencelock nor its command was stopped
    assert seen.read_text() == "SIGHUP SIGINT"
    assert not status_of(standalone.url, name).held


def test_ctrl_c_in_a_script_stops_the_script_too(standalone: RedisServer, name: str, reap: list[int]) -> None:
    """A terminal's Ctrl-C goes to the script's whole process group (bash and fencelock); fencelock passes it on to
    its command, which dies of it; fencelock then dies of SIGINT too, so bash stops the loop instead of going on."""
    script = (f"for i in 1 2 3; do {_command_line('run', f'--url={standalone.url}', name, '--', 'sleep', '1000')}; "
              "echo \"iteration $i ended with $?\"; done; echo 'the script went on'")
    proc = started(subprocess.Popen(["bash", "-c", script], env=_env(), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True))
    try:
        sleeper = _wait_for_sleep(proc.pid, reap)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C: the foreground group, bash included
        out, err = proc.communicate(timeout=30)
    finally:
        _kill_session(proc.pid)             # a loop that went on (the bug) would start more runs
    assert not alive(sleeper)
    assert out == "", err                  # no iteration went on
    assert proc.returncode == -signal.SIGINT
    assert not status_of(standalone.url, name).held


def test_a_command_ended_by_sigint_makes_fencelock_end_by_sigint(standalone: RedisServer, name: str) -> None:
    done = subprocess.run([*FENCELOCK, "run", f"--url={standalone.url}", name, "--", "sh", "-c", "kill -INT $$"],
                          env=_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGINT      # a shell shows 130
    assert not status_of(standalone.url, name).held
    done = subprocess.run([*FENCELOCK, "run", f"--url={standalone.url}", name, "--", "sh", "-c", "exit 130"],
                          env=_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 130                 # an exit status of 130 is only a status


def test_in_a_pipeline_on_a_terminal_the_terminal_stays_with_the_pipeline(standalone: RedisServer, name: str,
                                                                          tmp_path: Path) -> None:
    """`fencelock run ... | less`: fencelock shares its process group with less, so the terminal stays with that
    group (less would be stopped otherwise); Ctrl-C still reaches the command, passed on by fencelock."""
    seen = tmp_path / "seen"
    child = py(f"""
        import os, signal, sys, time
        tty = os.open("/dev/tty", os.O_RDONLY)
        open({str(seen)!r}, "w").write("foreground" if os.tcgetpgrp(tty) == os.getpgrp() else "background")
        signal.signal(signal.SIGINT, lambda *_: sys.exit(9))
        time.sleep(30)
    """)
    # a non-interactive bash on the terminal: fencelock and cat share bash's process group, which has the terminal
    script = f"{_command_line('run', f'--url={standalone.url}', name, '--', *child)} | cat; exit ${{PIPESTATUS[0]}}"
    pid, master = pty.fork()
    forked(pid)
    if pid == 0:
        os.execve("/bin/bash", ["bash", "-c", script], _env())
    try:
        wait_for(seen)
        os.write(master, b"\x03")             # Ctrl-C: to the pipeline's group; fencelock passes it on
        status, out = _wait_pty(pid, master)
    finally:
        os.close(master)
    assert seen.read_text() == "background", out
    assert status in (9, 128 + signal.SIGINT), out  # the command got SIGINT (bash itself may die of it first)
    time.sleep(0.2)
    assert not status_of(standalone.url, name).held


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (a test's own), by PID."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == sid:
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


def _wait_for_sleep(root: int, reap: list[int], timeout: float = 20.0) -> int:
    """The `sleep` somewhere below `root`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        todo = [root]
        while todo:
            pid = todo.pop()
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0"):
                    reap.append(pid)
                    return pid
            except OSError:
                pass
            todo += children(pid)
        time.sleep(0.02)
    raise AssertionError("the command never started")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _pump(master: int, until: Callable[[bytes], bool], timeout: float = 20.0, out: bytes = b"") -> bytes:
    """Read the terminal until `until(what it showed)`."""
    deadline = time.monotonic() + timeout
    while not until(out):
        assert time.monotonic() < deadline, f"the terminal showed {out!r}"
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                out += os.read(master, 4096)
            except OSError:
                pass
    return out


def test_ctrl_z_stops_fencelock_with_its_command_and_fg_resumes_both(standalone: RedisServer, name: str,
                                                                    reap: list[int]) -> None:
    """As for any job: Ctrl-Z gives the prompt back (fencelock stops with its command), fg resumes both."""
    pid, master = pty.fork()
    forked(pid)
    if pid == 0:  # an interactive bash with job control, on its own terminal
        os.execve("/bin/bash", ["bash", "--norc", "--noprofile", "-i"], _env(PS1="$ "))
    try:
        line = _command_line("run", f"--url={standalone.url}", name, "--", "sleep", "1000")
        os.write(master, f"{line}\n".encode())
        sleeper = _wait_for_sleep(pid, reap)
        runner = next(p for p in children(pid) if b"fencelock" in Path(f"/proc/{p}/cmdline").read_bytes())
        reap.append(runner)
        out = _pump(master, lambda _: True)
        os.write(master, b"\x1a")                                    # Ctrl-Z
        out = _pump(master, lambda shown: b"Stopped" in shown, out=out)
        assert _state(runner) == "T"
        assert _state(sleeper) == "T"
        assert status_of(standalone.url, name).held
        os.write(master, b"fg\n")
        deadline = time.monotonic() + 20
        while _state(sleeper) == "T" or _state(runner) == "T":
            assert time.monotonic() < deadline, "fg did not resume fencelock and its command"
            out = _pump(master, lambda _: True, out=out)
            time.sleep(0.02)
        os.write(master, b"\x03")                                    # Ctrl-C: the command has the terminal again
        os.write(master, b"echo status=$?\n")                       # (read once the prompt is back)
        out = _pump(master, lambda shown: re.search(rb"status=\d", shown) is not None, out=out)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(master)
    assert b"status=130" in out, out[-600:]
    assert not alive(sleeper)
    assert not status_of(standalone.url, name).held


def test_in_a_script_on_a_terminal_an_interactive_command_still_reads_it(standalone: RedisServer, name: str,
                                                                         tmp_path: Path) -> None:
    """The terminal stays with the script's group until the command stops to read it (SIGTTIN): then fencelock
    gives the terminal to the command, as a shell's `fg` would."""
    got = tmp_path / "got"
    line = _command_line("run", f"--url={standalone.url}", name, "--", "sh", "-c",
                         f'read answer; echo "$answer" > {got}')
    pid, master = pty.fork()
    forked(pid)
    if pid == 0:
        os.execve("/bin/bash", ["bash", "-c", f"{line}; echo status=$?"], _env())
    try:
        deadline = time.monotonic() + 20
        while not any(b"read answer" in _cmdline(kid) for fl_pid in children(pid) for kid in children(fl_pid)):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
        os.write(master, b"yes\n")                 # typed ahead: the terminal keeps it until it is read
        out = _pump(master, lambda shown: re.search(rb"status=\d", shown) is not None)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(master)
    assert b"status=0" in out, out
    assert got.read_text().strip() == "yes"


def test_a_signal_between_the_grant_and_the_commands_start_means_the_command_never_starts(
        standalone: RedisServer, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM while the guardian starts (the grant is in, the command is not): released, 143, nothing ran."""
    import fencelock
    from fencelock._cli import supervise
    from fencelock._cli.exits import OnLost
    from fencelock._cli.guardian_link import _Guardian

    marker = tmp_path / "ran"
    start_guardian = _Guardian.__init__

    def guardian_then_sigterm(self: _Guardian, on_lost: OnLost, grace: float, run_id: str,
                              titled: bool = True) -> None:
        start_guardian(self, on_lost, grace, run_id, titled)
        os.kill(os.getpid(), signal.SIGTERM)      # caught by fencelock's handler: this process lives on

    monkeypatch.setattr(_Guardian, "__init__", guardian_then_sigterm)
    with fencelock.connect(standalone.url) as locks:
        ending = supervise.run(locks, name, ["touch", str(marker)], ttl=30.0, wait=0, busy_status=75,
                               on_lost=OnLost.TERM, grace=10.0)
    assert ending.status == 128 + signal.SIGTERM
    assert not marker.exists()
    assert not status_of(standalone.url, name).held
