"""The `fencelock` command's other commands, driven as a user drives them: status, list and release, bad input and
unreachable servers, every backend, help and packaging (`fencelock run` is in `test_cli.py`).

Every test runs `python -m fencelock` with its own `--url`, its output captured, stdin closed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fencelock
from fencelock.testing import Deployment
from fencelock.testing.servers import RedisNodes, RedisServer
from fencelock.testing.timing import slack

from . import test_cli as _base
from .test_cli import (
    _env,
    fl,
    one_line,
    status_of,
    urls_of,
)

any_deployment = _base.any_deployment   # the same fixtures, for this module's tests
held = _base.held

# -- status, list, release ------------------------------------------------------------------------------------


def test_status_shows_a_held_and_a_free_lock_as_text_and_json(standalone: RedisServer, name: str,
                                                              held: fencelock.Lease) -> None:
    done = fl("status", name, url=standalone.url)
    assert done.returncode == 0
    assert done.stdout.startswith(f"{name}: held (fence {held.fence}, expires in ")
    data = json.loads(fl("status", name, "--json", url=standalone.url).stdout)
    assert data["name"] == name
    assert data["held"] is True
    assert data["fence"] == held.fence
    assert 0 < data["remaining"] <= 30.0
    assert data["queued"] == 0
    assert set(data) == {"name", "held", "fence", "remaining", "queued"}   # no token

    free = json.loads(fl("status", name + ":never", "--json", url=standalone.url).stdout)
    assert free == {"name": name + ":never", "held": False, "fence": None, "remaining": None, "queued": 0}
    assert "free (never locked)" in fl("status", name + ":never", url=standalone.url).stdout


def test_list_finds_held_locks_by_pattern_with_scan_never_keys(standalone: RedisServer, name: str) -> None:
    raw = standalone.client()
    pipe = raw.pipeline(transaction=False)
    for i in range(3000):  # enough unrelated keys that SCAN needs several calls
        pipe.set(f"{name}:noise:{i}", "x", px=60_000)
    pipe.execute()
    with fencelock.connect(standalone.url) as locks:
        leases = [locks.acquire(f"{name}:{suffix}", ttl=30.0) for suffix in ("b", "a", "c{1}")]
        locks.acquire(f"{name}:free", ttl=30.0).release()
        locks.acquire(f"other:{name}", ttl=30.0)
        raw.config_resetstat()
        done = fl("list", f"{name}:*", "--json", url=standalone.url)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        assert [item["name"] for item in found] == sorted(lease.name for lease in leases)
        assert {item["fence"] for item in found} == {lease.fence for lease in leases}
        stats = raw.info("commandstats")
        assert "cmdstat_scan" in stats
        assert "cmdstat_keys" not in stats

        text = fl("list", f"{name}:[ab]", url=standalone.url).stdout.splitlines()
        assert text[0].split() == ["NAME", "FENCE", "EXPIRES", "IN", "QUEUED"]
        assert [line.split()[0] for line in text[1:]] == [f"{name}:a", f"{name}:b"]
        assert "no held locks match" in fl("list", f"{name}:zzz*", url=standalone.url).stdout
        assert json.loads(fl("list", f"{name}:zzz*", "--json", url=standalone.url).stdout) == []


def test_release_force_asks_unless_yes_and_says_what_it_removed(standalone: RedisServer, name: str,
                                                                held: fencelock.Lease) -> None:
    done = fl("release", name, url=standalone.url)
    assert done.returncode == 2
    assert "--force" in one_line(done.stderr)

    done = fl("release", name, "--force", url=standalone.url, stdin="n\n")
    assert done.returncode == 1
    assert "Remove lock" in done.stderr
    assert "was not removed" in done.stderr
    assert status_of(standalone.url, name).held
    done = fl("release", name, "--force", url=standalone.url, stdin="")    # no answer at all: not removed
    assert done.returncode == 1
    assert status_of(standalone.url, name).held

    done = fl("release", name, "--force", url=standalone.url, stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(f"removed lock {name!r} (fence {held.fence}, expires in ")
    assert not status_of(standalone.url, name).held
    with pytest.raises(fencelock.LockLost):
        held.release()

    with fencelock.connect(standalone.url) as locks:
        again = locks.acquire(name, ttl=30.0)
        assert again.fence > held.fence         # the counter stayed: guards still reject the old holder
        done = fl("release", name, "--force", "--yes", url=standalone.url)
        assert done.returncode == 0
        assert "Remove lock" not in done.stderr
        assert f"removed lock {name!r}" in done.stdout
    done = fl("release", name, "--force", "--yes", url=standalone.url)
    assert done.returncode == 0
    assert "is not held" in done.stdout


@pytest.mark.parametrize("command", [["status", "x"], ["list"], ["release", "x", "--force", "--yes"],
                                     ["run", "x", "--", "true"]])
def test_a_bad_url_is_one_line_and_status_2(command: list[str]) -> None:
    done = fl(*command, url="redis://:secret@127.0.0.1:notaport/0")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "not a valid lock-service URL" in line
    assert "secret" not in line


def test_a_server_that_is_down_or_stalled_gives_one_line_and_status_69_in_bounded_time(own_server: RedisServer,
                                                                                        tmp_path: Path) -> None:
    url = own_server.url
    own_server.pause()  # connects succeed, nothing answers: the socket timeout (2 s) bounds it
    try:
        started = time.monotonic()
        done = fl("status", "x", url=url)
        assert time.monotonic() - started < slack(15.0)
        assert done.returncode == 69
        assert "is the server running" in one_line(done.stderr)
    finally:
        own_server.resume()
    own_server.stop()
    marker = tmp_path / "ran"
    for command in (["status", "x"], ["list"], ["run", "x", "--", "touch", str(marker)]):
        started = time.monotonic()
        done = fl(*command, url=url)
        assert time.monotonic() - started < slack(15.0)
        assert done.returncode == 69, done.stderr
        assert "Connection refused" in one_line(done.stderr)
    assert not marker.exists()


def test_the_url_comes_from_fencelock_url_when_not_given(standalone: RedisServer, name: str,
                                                         held: fencelock.Lease) -> None:
    done = fl("status", name, "--json", env=_env(FENCELOCK_URL=standalone.url))
    assert json.loads(done.stdout)["held"] is True
    done = fl("status", name, env=_env(FENCELOCK_URL="redis://:hunter2@127.0.0.1:1/0"))
    assert done.returncode == 69
    line = one_line(done.stderr)
    assert "redis://:***@127.0.0.1:1/0" in line
    assert "hunter2" not in line


def test_debug_shows_the_traceback() -> None:
    done = fl("--debug", "status", "x", url="redis://127.0.0.1:1/0")
    assert done.returncode != 0
    assert "Traceback" in done.stderr


# -- every backend --------------------------------------------------------------------------------------------


def test_status_list_and_release_on_every_deployment(any_deployment: Deployment, name: str) -> None:
    deployment = any_deployment
    urls = urls_of(deployment)
    with deployment.connect() as locks:
        lease = locks.acquire(f"{name}:a", ttl=30.0)
        status = json.loads(fl("status", f"{name}:a", "--json", url=urls).stdout)
        assert status["held"] is True
        assert status["fence"] == lease.fence
        pattern = name.replace("[", "[[]") + ":*"   # the test's name has brackets, which are glob syntax
        found = json.loads(fl("list", pattern, "--json", url=urls).stdout)
        assert [item["name"] for item in found] == [f"{name}:a"]
        done = fl("release", f"{name}:a", "--force", "--yes", url=urls)
        assert done.returncode == 0
        assert f"fence {lease.fence}" in done.stdout
        assert deployment.holder(f"{name}:a") is None
        with pytest.raises(fencelock.LockLost):
            lease.extend()


def test_run_on_every_deployment(any_deployment: Deployment, name: str) -> None:
    deployment = any_deployment
    done = fl("run", name, "--", "sh", "-c", 'test -n "$FENCELOCK_FENCE" && exit 5', url=urls_of(deployment))
    assert done.returncode == 5, done.stderr
    assert deployment.holder(name) is None


# -- help, packaging ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["run"], ["status"], ["list"], ["release"], ["lab"], ["bench"]])
def test_help_works_for_every_command(command: list[str]) -> None:
    done = fl(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout.lower()
    if command in ([], ["run"], ["status"], ["list"], ["release"]):
        assert "Examples:" in done.stdout


def test_the_top_help_shows_the_whole_tool() -> None:
    shown = fl("--help").stdout
    for command in ("run", "status", "list", "release", "lab", "bench"):
        assert f"\n  {command} " in shown


def test_without_click_the_command_says_what_to_install() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['click'] = None\n"
                           "from fencelock._cli import main; sys.exit(main(['--help']))"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2          # configuration, as a backend's missing extra
    assert "pip install 'fencelock[cli]'" in one_line(done.stderr)


def test_the_console_script_is_the_same_tool() -> None:
    script = Path(sys.executable).with_name("fencelock")
    if not script.exists():
        pytest.skip("no fencelock console script next to this Python (install the package with pip -e .)")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0
    assert done.stdout == fl("--help").stdout


@pytest.mark.parametrize("args", [["status", "NAME"], ["list"], ["release", "NAME", "--force", "--yes"], ["nodes"]],
                         ids=["status", "list", "release", "nodes"])
def test_every_command_that_reaches_redlock_nodes_takes_repair_delay_as_run_does(
        redlock_nodes: RedisNodes, standalone: RedisServer, name: str, args: list[str]) -> None:
    """Every client that looks at the nodes repairs them with its own delay: an operator's status or release must
    be able to give the deployment's value, as `run --repair-delay` does; a single Redis refuses it (exit 2)."""
    args = [name if arg == "NAME" else arg for arg in args]
    done = fl(*args, "--repair-delay", "130", url=list(redlock_nodes.urls))
    assert done.returncode == 0, done.stderr
    single = fl(*args, "--repair-delay", "130", url=standalone.url)
    assert single.returncode == 2, single.stderr
    assert "Redlock only" in one_line(single.stderr)
