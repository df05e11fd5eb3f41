"""What fencelock does when its own streams fail: stderr closed, full (/dev/full) or broken (its reader gone), stdout
closed or cut short (`| head`). Stopping the command never depends on saying so; exit statuses stay meaningful.
Real servers, the real command; the command's processes found in /proc.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisServer, free_port

from . import test_run_tree as _tree
from .test_cli import FENCELOCK, _env, fl, one_line, started, status_of
from .test_run_tree import alive, grandchild

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")

reap = _tree.reap


def started_with_stderr(mode: str, *args: str, url: str) -> subprocess.Popen[bytes]:
    """fencelock with its stderr closed (`2>&-`), on /dev/full, or on a pipe whose reader has gone."""
    argv = [*FENCELOCK, args[0], f"--url={url}", *args[1:]]
    if mode == "closed":
        return started(subprocess.Popen(["sh", "-c", 'exec "$@" 2>&-', "sh", *argv], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, env=_env()))
    if mode == "full":
        with open("/dev/full", "wb") as full:
            return started(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=full, env=_env()))
    proc = started(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=_env()))
    assert proc.stderr is not None
    proc.stderr.close()   # a log shipper that died: every write gets EPIPE
    return proc


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("mode", ["closed", "full", "broken"])
def test_a_lost_lock_stops_the_command_whatever_became_of_stderr(standalone: RedisServer, name: str,
                                                                 reap: list[int], mode: str,
                                                                 procs: list[subprocess.Popen[bytes]]) -> None:
    proc = started_with_stderr(mode, "run", "--ttl", "1", "--grace", "0.5", name, "--", "sh", "-c",
                               "sleep 1000; :", url=standalone.url)
    procs.append(proc)
    shell, sleeper = grandchild(proc.pid, reap)     # (with `2>&-`, sh execs fencelock: the same pid)
    standalone.client().delete(redis_keys(name).lock)
    assert proc.wait(timeout=30) == 70
    assert not alive(sleeper), "the command ran on after the lock was lost"
    assert not alive(shell)


def test_a_busy_lock_exits_75_with_stderr_closed(standalone: RedisServer, name: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with fencelock.connect(standalone.url) as locks:
        lease = locks.acquire(name, ttl=30.0)
        done = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", *FENCELOCK, "run", f"--url={standalone.url}",
                               "-n", name, "--", "touch", str(marker)], env=_env(), timeout=60, check=False,
                              stdin=subprocess.DEVNULL, capture_output=True)
        lease.release()
    assert done.returncode == 75
    assert not marker.exists()


def test_any_failure_inside_run_kills_the_command_before_it_goes_on(standalone: RedisServer, name: str,
                                                                   reap: list[int],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The last resort: an error escaping the supervisor (here, a look at the lease that raises) kills the group
    before anything else, and then the lock is released, since nothing of the command runs."""
    from fencelock._cli import supervise
    from fencelock._cli.exits import OnLost

    seen: list[int] = []

    def broken_tick(self: supervise._Supervisor) -> None:
        shell, sleeper = grandchild(os.getpid(), reap)
        seen.extend([shell, sleeper])
        raise RuntimeError("a bug in fencelock")

    monkeypatch.setattr(supervise._Supervisor, "_tick", broken_tick)
    with fencelock.connect(standalone.url) as locks, pytest.raises(RuntimeError, match="a bug in fencelock"):
        supervise.run(locks, name, ["sh", "-c", "sleep 1000; :"], ttl=30.0, wait=0, busy_status=75,
                      on_lost=OnLost.TERM, grace=10.0)
    assert seen
    assert not alive(seen[1]), "the command ran on after fencelock failed"
    assert not status_of(standalone.url, name).held


# -- stdout -------------------------------------------------------------------------------------------------------

def test_output_that_cannot_be_written_is_exit_74_and_a_reader_that_went_away_is_141(standalone: RedisServer,
                                                                                    name: str) -> None:
    url = f"--url={standalone.url}"
    closed = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *FENCELOCK, "status", name, url], env=_env(),
                            capture_output=True, text=True, timeout=60, check=False)
    assert closed.returncode == 74
    assert "stdout is closed" in one_line(closed.stderr)
    with open("/dev/full", "w") as full:
        done = subprocess.run([*FENCELOCK, "list", url], env=_env(), stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=60, check=False)
    assert done.returncode == 74
    assert "No space left on device" in one_line(done.stderr)
    proc = started(subprocess.Popen([*FENCELOCK, "status", name, url], env=_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True))
    assert proc.stdout is not None
    proc.stdout.close()                               # `fencelock status x | head -c 0`
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141
    assert err == ""


def test_list_escapes_control_characters_in_names(standalone: RedisServer, name: str) -> None:
    odd = f"{name}:line\nbreak\tand\x1b[31mred"
    with fencelock.connect(standalone.url) as locks:
        lease = locks.acquire(odd, ttl=30.0)
        shown = fl("list", f"{name}:*", url=standalone.url).stdout
        status = fl("status", odd, url=standalone.url).stdout
        lease.release()
    assert "\x1b" not in shown
    assert "\t" not in shown.split("\n", 1)[1]
    assert f"{name}:line\\nbreak\\tand\\x1b[31mred" in shown
    assert len(shown.strip().splitlines()) == 2       # the header and one line: no line forged
    assert status.startswith(f"{name}:line\\nbreak\\tand\\x1b[31mred: held")


def test_debug_shows_the_traceback_and_keeps_the_exit_status(name: str) -> None:
    done = fl("--debug", "status", name, url=f"redis://127.0.0.1:{free_port()}/0")
    assert done.returncode == 69
    assert "Traceback" in done.stderr
    assert "fencelock: error:" in done.stderr
    done = fl("--debug", "run", "--ttl", "0", name, "--", "true", url="redis://127.0.0.1:1/0")
    assert done.returncode == 2


def test_run_with_stdout_closed_runs_the_command_and_says_nothing(standalone: RedisServer, name: str) -> None:
    done = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *FENCELOCK, "run", f"--url={standalone.url}", name,
                           "--", "true"], env=_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
