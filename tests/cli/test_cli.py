"""The `fencelock run` command, driven as a user drives it: the real command in subprocesses, real servers (the
other commands, bad input, every backend and help are in `test_cli_commands.py`).

Every test runs `python -m fencelock` (the same tool as the `fencelock` console script) with its own `--url`, its
output captured, stdin closed (no terminal: a test must not depend on how pytest was started).
"""

from __future__ import annotations

import itertools
import os
import pty
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock.testing import Deployment
from fencelock.testing.servers import RedisServer
from fencelock.testing.timing import slack
from tests.conftest import BACKENDS, SharedDeployments


@pytest.fixture(params=list(BACKENDS))
def any_deployment(request: pytest.FixtureRequest, shared_deployments: SharedDeployments) -> Deployment:
    """Every backend in the registry (etcd and ZooKeeper too, once they are registered)."""
    return shared_deployments.get(request.param)


def urls_of(deployment: Deployment) -> str | list[str]:
    """The deployment's target as --url values: one URL, or several (Redlock)."""
    target = deployment.target
    assert isinstance(target, str) or (isinstance(target, list) and all(isinstance(t, str) for t in target))
    return target

FENCELOCK = [sys.executable, "-m", "fencelock"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FENCELOCK_URL"}
    env.update(extra)
    return env


def fl(*args: str, url: str | list[str] | None = None, timeout: float = 60.0, stdin: str | None = None,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command to its end; `url` becomes --url (several for Redlock)."""
    urls = [] if url is None else ([url] if isinstance(url, str) else url)
    head, sep, tail = _split(list(args))
    argv = [*FENCELOCK, *head, *[f"--url={u}" for u in urls], *sep, *tail]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          env=env if env is not None else _env())


STARTED: list[subprocess.Popen[Any]] = []
"""Every process a test started in the background; `conftest.py` kills and waits for each at the test's end."""

P = TypeVar("P", bound="subprocess.Popen[Any]")


FORKED: list[int] = []
"""The PIDs of children a test forked itself (`pty.fork`); `conftest.py` kills and reaps each one still unreaped."""


def started(proc: P) -> P:
    """`proc`, to be killed (if it still runs) and waited for when the test ends, whatever its outcome."""
    STARTED.append(proc)
    return proc


def forked(pid: int) -> int:
    """`pid`, our own child, to be killed and reaped when the test ends unless the test reaped it."""
    if pid:
        FORKED.append(pid)
    return pid


def start(*args: str, url: str) -> subprocess.Popen[str]:
    """Start the command in the background (for signals and races); it ends with the test at the latest."""
    head, sep, tail = _split(list(args))
    return started(subprocess.Popen([*FENCELOCK, *head, f"--url={url}", *sep, *tail], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=_env()))


def _split(args: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Options go before `--`: everything after it is the child's command."""
    if "--" in args:
        i = args.index("--")
        return args[:i], ["--"], args[i + 1:]
    return args, [], []


def one_line(text: str) -> str:
    """The error is exactly one line, and no traceback."""
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def py(code: str) -> list[str]:
    """A child command: a Python script."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def wait_for(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


@pytest.fixture
def held(standalone: RedisServer, name: str) -> Iterator[fencelock.Lease]:
    """`name` held by another process's lease (the library, behind the command's back)."""
    locks = fencelock.connect(standalone.url)
    lease = locks.acquire(name, ttl=30.0)
    yield lease
    try:
        lease.release()
    except fencelock.LockLost:
        pass
    locks.close()


def status_of(url: Any, name: str) -> fencelock.LockStatus:
    with fencelock.connect(url) as locks:
        return locks.status(name)


# -- run ------------------------------------------------------------------------------------------------------


def test_two_runs_on_one_name_run_the_child_one_at_a_time(standalone: RedisServer, name: str,
                                                         tmp_path: Path) -> None:
    # Each child records when it started and ended, and checks an OS file lock that a second child running at
    # the same time would find taken.
    child = py("""
        import fcntl, os, sys, time
        log, guard = sys.argv[1], sys.argv[2]
        with open(guard, "a") as g:
            try:
                fcntl.flock(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                sys.exit(99)                     # another child holds it: the distributed lock failed
            start = time.time()
            time.sleep(0.4)
            with open(log, "a") as f:
                f.write(f"{start} {time.time()} {os.environ['FENCELOCK_FENCE']}\\n")
    """)
    log, guard = tmp_path / "log", tmp_path / "guard"
    procs = [start("run", "--wait", "30", name, "--", *child, str(log), str(guard), url=standalone.url)
             for _ in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    spans = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(spans) == 3
    for (_, end, _), (begin, _, _) in itertools.pairwise(spans):
        assert end <= begin, spans              # no two children overlapped
    fences = [int(f) for _, _, f in spans]
    assert fences == sorted(fences)
    assert len(set(fences)) == 3
    assert not status_of(standalone.url, name).held


def test_a_busy_lock_exits_75_without_running_the_command_and_E_changes_it(standalone: RedisServer, name: str,
                                                                           held: fencelock.Lease,
                                                                           tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    done = fl("run", "--wait", "0", name, "--", "touch", str(marker), url=standalone.url)
    assert done.returncode == 75
    line = one_line(done.stderr)
    assert name in line
    assert "held by another holder" in line
    assert "did not run" in line
    assert not marker.exists()

    done = fl("run", "--wait", "0", "-E", "9", name, "--", "touch", str(marker), url=standalone.url)
    assert done.returncode == 9
    done = fl("run", "--wait", "0.3", "--conflict-exit-code", "0", name, "--", "touch", str(marker),
              url=standalone.url)
    assert done.returncode == 0
    assert "stayed busy for the whole wait of 0.3 s" in one_line(done.stderr)
    assert not marker.exists()
    assert status_of(standalone.url, name).held   # the holder's lock was never touched


def test_the_cron_line_runs_the_job_once_when_two_machines_start_it_together(standalone: RedisServer, name: str,
                                                                             tmp_path: Path) -> None:
    # `*/5 * * * * fencelock run --ttl 60 --wait 0 nightly-report -- /usr/local/bin/report` on two machines
    runs = tmp_path / "runs"
    job = ["sh", "-c", f"echo ran >> {runs}; sleep 3"]
    procs = [start("run", "--ttl", "60", "--wait", "0", name, "--", *job, url=standalone.url) for _ in range(2)]
    statuses = sorted(proc.wait(timeout=30) for proc in procs)
    for proc in procs:
        proc.communicate()
    assert statuses == [0, 75]
    assert runs.read_text() == "ran\n"


def test_the_childs_exit_status_and_environment_come_through(standalone: RedisServer, name: str) -> None:
    done = fl("run", name, "--", "sh", "-c", "exit 7", url=standalone.url)
    assert done.returncode == 7, done.stderr
    done = fl("run", name, "--", "sh", "-c", "kill -TERM $$", url=standalone.url)
    assert done.returncode == 128 + signal.SIGTERM       # as a shell reports a child ended by a signal

    done = fl("run", name, "--", *py("""
        import os
        print(os.environ["FENCELOCK_NAME"], os.environ["FENCELOCK_FENCE"], len(os.environ["FENCELOCK_TOKEN"]))
    """), url=standalone.url)
    assert done.returncode == 0, done.stderr
    shown_name, fence, token_length = done.stdout.split()
    assert shown_name == name
    assert int(fence) == status_of(standalone.url, name).fence  # the fence the child saw is the grant's
    assert int(token_length) == 32
    assert done.stderr == ""
    assert not status_of(standalone.url, name).held              # released after the child ended


def test_the_token_is_never_printed_by_the_command(standalone: RedisServer, name: str) -> None:
    done = fl("run", name, "--", *py("import os; open(os.devnull, 'w').write(os.environ['FENCELOCK_TOKEN'])"),
              url=standalone.url)
    # the child printed nothing, so any hex token in the output would be fencelock's
    assert done.returncode == 0
    assert done.stdout == ""
    assert done.stderr == ""


def test_a_missing_command_exits_127_and_releases_the_lock(standalone: RedisServer, name: str) -> None:
    done = fl("run", "--ttl", "0", name, "--", "true", url=standalone.url)
    assert done.returncode == 2
    assert "see 'fencelock run --help'" in one_line(done.stderr)
    done = fl("run", name, "--", "/nonexistent/command", url=standalone.url)
    assert done.returncode == 127
    assert "command not found" in one_line(done.stderr)
    assert not status_of(standalone.url, name).held


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_fencelock_reaches_the_child_and_the_lock_is_released_after_it(
        standalone: RedisServer, name: str, tmp_path: Path, sig: signal.Signals) -> None:
    ready, got = tmp_path / "ready", tmp_path / "got"
    child = py(f"""
        import signal, sys, time
        def handler(signum, frame):
            time.sleep(0.3)                      # a clean shutdown that takes a while, still holding the lock
            open({str(got)!r}, "w").write(str(signum))
            sys.exit(3)
        signal.signal({int(sig)}, handler)
        open({str(ready)!r}, "w").write("ready")
        time.sleep(30)
    """)
    proc = start("run", name, "--", *child, url=standalone.url)
    wait_for(ready)
    assert status_of(standalone.url, name).held
    proc.send_signal(sig)
    proc.communicate(timeout=20)
    assert got.read_text() == str(int(sig))          # the child got the very signal
    assert proc.returncode == 3                      # and its own status came through
    assert not status_of(standalone.url, name).held  # released once it had exited


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_waiting_for_the_lock_ends_it_without_running_the_command(
        standalone: RedisServer, name: str, held: fencelock.Lease, tmp_path: Path, sig: signal.Signals) -> None:
    marker = tmp_path / "ran"
    proc = start("run", "--wait", "30", name, "--", "touch", str(marker), url=standalone.url)
    raw, deadline = standalone.client(), time.monotonic() + 20
    while not raw.exists(redis_keys(name).waiters):  # its first attempt failed: it waits for the release
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + sig
    assert "while waiting for lock" in one_line(err)
    assert not marker.exists()
    assert status_of(standalone.url, name).fence == held.fence   # nothing was granted behind the holder


def test_ctrl_c_on_a_terminal_reaches_the_child_once(standalone: RedisServer, name: str, tmp_path: Path) -> None:
    # A terminal sends SIGINT to its whole foreground process group, the child included: fencelock must not send
    # it a second time. The child counts the SIGINTs it gets.
    ready, got = tmp_path / "ready", tmp_path / "got"
    child = py(f"""
        import signal, sys, time
        count = 0
        def handler(signum, frame):
            global count
            count += 1
        signal.signal(signal.SIGINT, handler)
        open({str(ready)!r}, "w").write("ready")
        while not count:
            time.sleep(0.01)
        time.sleep(0.5)                          # time for a second, forwarded SIGINT to arrive
        open({str(got)!r}, "w").write(str(count))
        sys.exit(4)
    """)
    argv = [*FENCELOCK, "run", f"--url={standalone.url}", name, "--", *child]
    pid, master = pty.fork()
    forked(pid)
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        os.execve(sys.executable, argv, _env())
    try:
        wait_for(ready)
        os.write(master, b"\x03")                # Ctrl-C, typed on the terminal
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            try:
                os.read(master, 4096)            # keep the terminal's output flowing
            except OSError:
                pass
            time.sleep(0.02)
        else:
            raise AssertionError("fencelock did not exit")
    finally:
        os.close(master)
    assert got.read_text() == "1"
    assert os.waitstatus_to_exitcode(status) == 4
    assert not status_of(standalone.url, name).held


def test_a_lock_deleted_behind_its_back_terminates_the_child_and_the_status_says_so(
        standalone: RedisServer, name: str, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = start("run", "--ttl", "1", name, "--", *py(f"""
        import time
        open({str(ready)!r}, "w").write("ready")
        time.sleep(30)
    """), url=standalone.url)
    wait_for(ready)
    standalone.client().delete(redis_keys(name).lock)   # an operator, or a buggy client
    deleted = time.monotonic()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 70
    assert time.monotonic() - deleted < slack(5.0)         # noticed at the next renewal (every ttl/3)
    assert "lost lock" in err
    assert "sent SIGTERM" in err
    assert "the command's own status was 143" in err


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(standalone: RedisServer, name: str,
                                                                       tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = start("run", "--ttl", "1", "--grace", "0.5", name, "--", *py(f"""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(ready)!r}, "w").write("ready")
        time.sleep(30)
    """), url=standalone.url)
    wait_for(ready)
    standalone.client().delete(redis_keys(name).lock)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 70
    assert "sent SIGKILL" in err
    assert "the command's own status was 137" in err


def test_on_lost_ignore_lets_the_child_finish_but_the_status_still_says_lost(standalone: RedisServer,
                                                                            name: str, tmp_path: Path) -> None:
    ready, finished = tmp_path / "ready", tmp_path / "finished"
    proc = start("run", "--ttl", "1", "--on-lost", "ignore", name, "--", *py(f"""
        import time
        open({str(ready)!r}, "w").write("ready")
        time.sleep(1.5)
        open({str(finished)!r}, "w").write("yes")
    """), url=standalone.url)
    wait_for(ready)
    standalone.client().delete(redis_keys(name).lock)
    _, err = proc.communicate(timeout=20)
    assert finished.read_text() == "yes"
    assert proc.returncode == 70
    assert "it runs on (--on-lost ignore)" in err
    assert "the command's own status was 0" in err


def test_a_server_outage_longer_than_the_ttl_terminates_the_child(own_server: RedisServer, name: str,
                                                                 tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = start("run", "--ttl", "1", name, "--", *py(f"""
        import time
        open({str(ready)!r}, "w").write("ready")
        time.sleep(30)
    """), url=own_server.url)
    wait_for(ready)
    own_server.pause()
    try:
        paused = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 70
        # validity (1 s, less the drift) ran out by the local clock, then a bounded release attempt
        assert time.monotonic() - paused < slack(10.0)
        assert "sent SIGTERM" in err
    finally:
        own_server.resume()


def test_options_after_the_command_belong_to_the_command(standalone: RedisServer, name: str) -> None:
    done = fl("run", name, "--", "sh", "-c", "echo \"$@\"", "sh", "--ttl", "-E", url=standalone.url)
    assert done.returncode == 0
    assert done.stdout.strip() == "--ttl -E"
    done = fl("run", name, "ls", "-l", url=standalone.url)   # forgot the --
    assert done.returncode == 2
    assert "put -- before COMMAND" in one_line(done.stderr)
