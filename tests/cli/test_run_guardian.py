"""`fencelock run`'s guardian: when fencelock itself dies (SIGKILL, the OOM killer, `timeout -k`, a signal it does not
handle) or is stopped past its lock's validity (SIGSTOP), the command's group is stopped all the same, so nothing of
the command runs on without the lock. Real processes, found in /proc; the lock read by an independent client.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fencelock._cli as fencelock_cli
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisServer
from fencelock.testing.timing import slack

from . import test_run_tree as _tree
from .test_cli import fl, py, start, started, status_of, wait_for
from .test_run_tree import alive, children, grandchild, wait_exit

reap = _tree.reap   # the same fixture: whatever a test found alive is SIGKILLed after it

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")


def guardian_of(fencelock_pid: int, timeout: float = 20.0) -> int:
    """The guardian: fencelock's child that runs guardian.py (it starts before the command)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in children(fencelock_pid):
            if b"guardian.py" in _cmdline(pid):
                return pid
        time.sleep(0.02)
    raise AssertionError("fencelock started no guardian")


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGUSR1])
def test_when_fencelock_dies_its_command_stops_and_the_next_holder_never_runs_beside_it(
        standalone: RedisServer, name: str, reap: list[int], sig: signal.Signals) -> None:
    proc = start("run", "--ttl", "2", name, "--", "sh", "-c", "sleep 1000; :", url=standalone.url)
    shell, sleeper = grandchild(proc.pid, reap)
    guardians = [pid for pid in children(proc.pid) if b"guardian.py" in _cmdline(pid)]
    reap += guardians
    proc.send_signal(sig)                  # the OOM killer, `timeout -k`, a signal fencelock does not handle
    wait_exit(proc)
    assert gone_within(sleeper, slack(3.0)), "the command ran on after fencelock died"
    assert not alive(shell)
    assert guardians, "fencelock started no guardian"
    assert gone_within(guardians[0], slack(3.0)), "the guardian lingered after the group was gone"
    # Another holder takes the lock once it expires; its command looks for the first one's in /proc.
    seen = fl("run", "--wait", "30", name, "--", *py(f"""
        from pathlib import Path
        try:
            state = Path("/proc/{sleeper}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "gone"
        print("alive" if state not in ("gone", "Z") else "not running")
    """), url=standalone.url)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.strip() == "not running"


def test_a_fencelock_stopped_past_its_ttl_has_its_command_killed_before_the_key_expires(
        standalone: RedisServer, name: str, reap: list[int]) -> None:
    proc = start("run", "--ttl", "2", "--on-lost", "kill", name, "--", "sh", "-c", "sleep 1000; :",
                 url=standalone.url)
    _, sleeper = grandchild(proc.pid, reap)
    raw, key = standalone.client(), redis_keys(name).lock
    assert raw.exists(key)
    os.kill(proc.pid, signal.SIGSTOP)      # a frozen process: its renewal thread stops with it
    try:
        deadline = time.monotonic() + slack(10.0)
        while time.monotonic() < deadline:
            exists = raw.exists(key)       # read the server first, then the process: an order, not a time
            running = alive(sleeper)
            if not running:
                break
            assert exists, "the command still ran after the server had dropped the lock"
            time.sleep(0.005)
        else:
            raise AssertionError("the command of a stopped fencelock was never stopped")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    err = wait_exit(proc)
    assert proc.returncode == 70, err
    assert "guardian" in err
    assert not status_of(standalone.url, name).held


def test_a_normal_run_leaves_no_guardian_behind(standalone: RedisServer, name: str, reap: list[int]) -> None:
    proc = start("run", name, "--", "sh", "-c", "sleep 0.5", url=standalone.url)
    guardian = guardian_of(proc.pid)
    reap.append(guardian)
    err = wait_exit(proc)
    assert proc.returncode == 0, err
    assert not alive(guardian)
    assert err == ""


def test_the_command_holds_no_descriptor_of_the_guardian_pipe(standalone: RedisServer, name: str) -> None:
    # Only fencelock may hold the pipe's write end: the guardian sees end of file exactly when fencelock is gone.
    done = fl("run", name, "--", *py("""
        import os
        print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
    """), url=standalone.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 1, 2, 3]"   # stdin, stdout, stderr, and the listing's own descriptor


def test_with_on_lost_ignore_no_guardian_is_started(standalone: RedisServer, name: str) -> None:
    proc = start("run", "--on-lost", "ignore", name, "--", "sleep", "1", url=standalone.url)
    deadline = time.monotonic() + 20
    kids: list[int] = []
    while not any(b"sleep" in _cmdline(pid) for pid in kids):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.02)
        kids = children(proc.pid)
    wait_exit(proc)
    assert proc.returncode == 0
    assert not any(b"guardian.py" in _cmdline(pid) for pid in kids)   # (it would be started before the command)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_the_guardian_runs_by_path_without_importing_the_package() -> None:
    guardian = Path(fencelock_cli.__file__).with_name("guardian.py")
    done = subprocess.run([sys.executable, "-E", "-s", "-X", "importtime", str(guardian), "term", "1"],
                          capture_output=True, text=True, timeout=30, check=False, input="done\n")
    assert done.returncode == 0, done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line]
    assert "exits" in imported
    assert not [module for module in imported if module.startswith("fencelock")], imported


def test_when_fencelock_dies_the_guardian_stops_what_left_the_group_too(
        standalone: RedisServer, name: str, reap: list[int], tmp_path: Path) -> None:
    """A daemon of the command (a double fork into a session of its own) is found by the run's mark in its
    environment: fencelock, its subreaper, is gone, and the daemon moved to another parent."""
    left = tmp_path / "left"
    proc = start("run", "--ttl", "2", "--on-lost", "kill", name, "--", "sh", "-c",
                 f"(setsid sh -c 'sleep 1000 & echo $! > {left}' &) ; sleep 1000; :", url=standalone.url)
    stray = int(wait_for(left).strip())
    reap.append(stray)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert gone_within(stray, slack(3.0)), "a daemon of the command ran on after fencelock died"


def test_when_fencelock_dies_the_guardian_stops_a_daemon_with_an_emptied_environment(
        standalone: RedisServer, name: str, reap: list[int], tmp_path: Path) -> None:
    """A daemon started with `env -i` carries no mark: fencelock told the guardian its pid and start time, and the
    guardian stops it when fencelock dies (it used to run on next to the next holder)."""
    left = tmp_path / "left"
    proc = start("run", "--ttl", "2", "--on-lost", "kill", name, "--", "sh", "-c",
                 f"(setsid env -i sh -c 'sleep 1000 & echo $! > {left}' &) ; sleep 1000; :", url=standalone.url)
    stray = int(wait_for(left).strip())
    reap.append(stray)
    time.sleep(1.2)  # (fencelock looks for unmarked processes every 0.5 s, and tells its guardian)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert gone_within(stray, slack(3.0)), "a daemon of the command with no mark ran on after fencelock died"


@pytest.mark.parametrize("guardian", ["missing", "silent"])
def test_no_command_runs_without_a_guardian_that_answered(standalone: RedisServer, name: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture[str], guardian: str) -> None:
    """A guardian that cannot be started (its file is gone), or that never answers its first line: fencelock
    releases the lock and exits 70 without starting the command, saying why."""
    import fencelock
    from fencelock._cli import guardian_link, supervise
    from fencelock._cli.exits import OnLost

    ran = tmp_path / "ran"
    script = tmp_path / "guardian.py"
    if guardian == "silent":
        script.write_text("import time\ntime.sleep(60)\n")
        monkeypatch.setattr(supervise, "GUARDIAN_START", 1.0)
    monkeypatch.setattr(guardian_link, "GUARDIAN", script)
    with fencelock.connect(standalone.url) as locks:
        ending = supervise.run(locks, name, ["touch", str(ran)], ttl=30.0, wait=0, busy_status=75,
                               on_lost=OnLost.TERM, grace=10.0)
    err = capfd.readouterr().err
    assert ending.status == 70, err
    assert not ran.exists(), "the command ran without its guardian"
    assert "guardian" in err
    assert "did not run" in err
    assert not status_of(standalone.url, name).held


def test_ps_shows_the_guardian_as_fencelock_run_guardian(standalone: RedisServer, name: str,
                                                         reap: list[int]) -> None:
    proc = start("run", name, "--", "sleep", "1", url=standalone.url)
    guardian = guardian_of(proc.pid)
    reap.append(guardian)
    shown = subprocess.run(["ps", "-o", "args=", "-p", str(guardian)], capture_output=True, text=True,
                           check=False).stdout
    wait_exit(proc)
    assert shown.startswith("fencelock run-guardian "), shown
    assert proc.returncode == 0


def test_the_guardian_never_signals_a_group_that_is_no_longer_its_commands() -> None:
    """Process group numbers are reused: once the command's group is gone, the same number may be someone else's.
    The guardian signals a group only if one of its processes carries the run's id in its environment."""
    import fencelock._cli.exits as exits_module

    guardian_py = Path(fencelock_cli.__file__).with_name("guardian.py")
    stranger = started(subprocess.Popen(["setsid", "sleep", "30"]))   # a group of its own, not the run's: no mark
    guardian = started(subprocess.Popen([sys.executable, "-E", "-s", str(guardian_py), "kill", "1", "a1b2c3"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    assert guardian.stdin is not None
    valid_until = exits_module.lease_clock() + 30
    guardian.stdin.write(f"valid {valid_until!r} 0.1\ngroup {stranger.pid}\n".encode())
    guardian.stdin.close()                       # end of file: fencelock is gone, the guardian acts at once
    guardian.wait(timeout=30)
    assert stranger.poll() is None, "the guardian killed a process group that was not its command's"
