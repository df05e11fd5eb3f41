"""`fencelock run` among the signals of shells and terminals: nohup, a script's Ctrl-C, a pipeline on a terminal.

Signals ignored when fencelock starts (nohup, the `&` jobs of a script) stay ignored, for fencelock and the command.
A command that Ctrl-C ended makes fencelock end by SIGINT too (after the release), so a calling script stops as it
would for any other command. In a pipeline or a script, fencelock leaves the terminal to its own process group.
"""

from __future__ import annotations

import os
import pty
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fencelock.testing.servers import RedisServer

from . import test_run_tree as _tree
from .test_cli import FENCELOCK, _env, py, status_of, wait_for
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
    proc = subprocess.Popen(["sh", "-c", "trap '' HUP INT; exec \"$@\"", "sh", *FENCELOCK, "run",
                             f"--url={standalone.url}", name, "--", *child], env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    proc = subprocess.Popen(["bash", "-c", script], env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
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
