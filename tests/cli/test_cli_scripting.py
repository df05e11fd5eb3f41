"""The command line as scripts and cron use it: exit codes to branch on, flock's spellings, silence when asked,
and configuration errors (a missing extra) that say what to install. Real servers, the real command."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import fencelock
from fencelock.testing.servers import RedisServer, free_port

from .test_cli import _env, fl, one_line, status_of


@pytest.fixture
def holding(standalone: RedisServer, name: str) -> Iterator[fencelock.Lease]:
    """`name` held by a lease of this test process, behind the command's back."""
    with fencelock.connect(standalone.url) as locks:
        lease = locks.acquire(name, ttl=30.0)
        yield lease
        lease.release()


def test_status_quiet_exits_0_when_held_and_1_when_free_and_prints_nothing(standalone: RedisServer,
                                                                          name: str) -> None:
    free = fl("status", "-q", name, url=standalone.url)
    assert (free.returncode, free.stdout, free.stderr) == (1, "", "")
    with fencelock.connect(standalone.url) as locks:
        lease = locks.acquire(name, ttl=30.0)
        held = fl("status", "--quiet", name, url=standalone.url)
        assert (held.returncode, held.stdout, held.stderr) == (0, "", "")
        lease.release()
    assert fl("status", "-q", name, url=standalone.url).returncode == 1


def test_status_quiet_keeps_the_service_error_code_when_it_cannot_be_reached(name: str) -> None:
    done = fl("status", "-q", name, url=f"redis://127.0.0.1:{free_port()}/0")
    assert done.returncode == 69
    assert "Traceback" not in done.stderr


def test_a_skipped_cron_tick_with_n_q_E0_is_silent_and_exits_0(standalone: RedisServer, name: str,
                                                                holding: fencelock.Lease, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    done = fl("run", "-n", "-q", "-E", "0", name, "--", "touch", str(marker), url=standalone.url)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not marker.exists()
    assert status_of(standalone.url, name).held


def test_nonblock_tries_once_and_w_is_wait(standalone: RedisServer, name: str, holding: fencelock.Lease,
                                           tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    done = fl("run", "--nonblock", name, "--", "touch", str(marker), url=standalone.url)
    assert done.returncode == 75
    assert "held by another holder" in one_line(done.stderr)
    done = fl("run", "-w", "0.3", name, "--", "touch", str(marker), url=standalone.url)
    assert done.returncode == 75
    assert "stayed busy for the whole wait of 0.3 s" in one_line(done.stderr)
    assert not marker.exists()


def test_a_free_lock_with_n_runs_the_command(standalone: RedisServer, name: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    done = fl("run", "-n", "-q", name, "--", "touch", str(marker), url=standalone.url)
    assert done.returncode == 0, done.stderr
    assert marker.exists()
    assert not status_of(standalone.url, name).held


@pytest.mark.parametrize(("url", "extra", "module"), [("etcd://127.0.0.1:1", "etcd", "httpx"),
                                                      ("zookeeper://127.0.0.1:1", "zookeeper", "kazoo")])
def test_a_missing_extra_is_a_configuration_error_with_the_pip_line(url: str, extra: str, module: str) -> None:
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from fencelock._cli import main\n"
            f"sys.exit(main(['status', 'x', '--url', {url!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert f"pip install 'fencelock[{extra}]'" in one_line(done.stderr)


def test_without_the_cli_extra_the_command_says_what_to_install_and_exits_2() -> None:
    """A missing extra is configuration (exit 2, as for a backend's extra), not a failure of the command (1)."""
    code = ("import sys; sys.modules['click'] = None\n"
            "from fencelock._cli import console\n"
            "sys.argv = ['fencelock', 'status', 'x']\n"
            "console()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "pip install 'fencelock[cli]'" in one_line(done.stderr)


def test_an_installed_copy_does_not_offer_bench(tmp_path: Path) -> None:
    """Outside a checkout (the package alone on the path, as pip installs it) --help has no `bench`."""
    package = Path(fencelock.__file__).resolve().parent
    shutil.copytree(package, tmp_path / "site" / "fencelock", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-c", "import sys; from fencelock._cli import main; "
                           "sys.exit(main(['--help']))"], capture_output=True, text=True, timeout=60, check=False,
                          cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "\n  run " in done.stdout
    assert "\n  bench " not in done.stdout
    in_checkout = fl("--help").stdout
    assert "\n  bench " in in_checkout


def test_an_unknown_scheme_lists_every_scheme_that_works() -> None:
    done = fl("status", "x", url="http://127.0.0.1:1")
    assert done.returncode == 2
    line = one_line(done.stderr)
    for scheme in ("redis", "rediss", "redis+cluster", "unix", "etcd", "etcds", "zookeeper"):
        assert f"{scheme}," in line or f"{scheme} " in line, scheme


# -- mistakes refused before anything is sent ------------------------------------------------------------------

@pytest.mark.parametrize(("args", "env"), [(["--url", ""], {}), (["--url", "  "], {}), ([], {"FENCELOCK_URL": ""}),
                                           ([], {"FENCELOCK_URL": "   "})])
def test_an_empty_url_is_refused_never_taken_for_the_default_server(args: list[str], env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for command in (["status", "x"], ["run", "x", "--", "touch", str(marker)]):
        done = fl(*command[:1], *args, *command[1:], env=_env(**env))
        assert done.returncode == 2, done.stderr
        assert "empty" in one_line(done.stderr) or "blank" in one_line(done.stderr)
    assert not marker.exists()


def test_run_refuses_what_cannot_be_meant_before_taking_the_lock(standalone: RedisServer, name: str) -> None:
    raw = standalone.client()
    raw.config_resetstat()
    cases = {("run", "--", "echo", "hi"): "NAME goes before --",          # would lock a name 'echo'
             ("run", name, "--", ""): "COMMAND is empty",
             ("run", "--ttl", "0.5", name, "--", "true"): "at least 1 s"}
    for args, reason in cases.items():
        done = fl(*args, url=standalone.url)
        assert done.returncode == 2, done.stderr
        assert reason in one_line(done.stderr)
    assert "cmdstat_evalsha" not in raw.info("commandstats")   # nothing was asked of the server
    assert not status_of(standalone.url, name).held


def test_a_nested_run_of_the_same_lock_is_refused_instead_of_waiting_for_itself(standalone: RedisServer,
                                                                                name: str) -> None:
    inner = [sys.executable, "-m", "fencelock", "run", f"--url={standalone.url}", "--wait", "forever", name, "--",
             "echo", "inner ran"]
    done = fl("run", "--wait", "0", name, "--", *inner, url=standalone.url, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "would wait for itself" in one_line(done.stderr)
    assert "inner ran" not in done.stdout
    other = fl("run", name, "--", sys.executable, "-m", "fencelock", "run", f"--url={standalone.url}",
               f"{name}:other", "--", "echo", "inner ran", url=standalone.url)
    assert other.returncode == 0, other.stderr     # another name is fine
    assert other.stdout == "inner ran\n"


def test_a_nested_run_is_refused_however_the_same_server_is_spelled(standalone: RedisServer, name: str) -> None:
    # the outer run names the server as 127.0.0.1 with database 0, the inner as localhost without either default
    inner = [sys.executable, "-m", "fencelock", "run", f"--url=redis://localhost:{standalone.port}", "--wait", "3",
             name, "--", "echo", "inner ran"]
    done = fl("run", "--wait", "0", name, "--", *inner, url=f"redis://127.0.0.1:{standalone.port}/0", timeout=30)
    assert done.returncode == 2, done.stderr
    assert "would wait for itself" in one_line(done.stderr)
    assert "inner ran" not in done.stdout
    other = fl("run", name, "--", sys.executable, "-m", "fencelock", "run",
               f"--url=redis://localhost:{standalone.port}/1", name, "--", "echo", "inner ran",
               url=f"redis://127.0.0.1:{standalone.port}/0")
    assert other.returncode == 0, other.stderr     # another database of the same server is another lock
    assert other.stdout == "inner ran\n"


def test_a_script_whose_interpreter_is_missing_says_so(standalone: RedisServer, name: str, tmp_path: Path) -> None:
    script = tmp_path / "job"
    script.write_text("#!/nonexistent/interpreter\necho hi\n")
    script.chmod(0o755)
    done = fl("run", name, "--", str(script), url=standalone.url)
    assert done.returncode == 126                  # as bash says for a bad interpreter
    assert "/nonexistent/interpreter" in one_line(done.stderr)
    assert not status_of(standalone.url, name).held


# -- what reaches stderr -----------------------------------------------------------------------------------------

def test_library_log_records_reach_stderr_only_when_asked(name: str) -> None:
    down = [f"redis://127.0.0.1:{free_port()}/0" for _ in range(3)]   # Redlock, every node down
    done = fl("run", "-w", "1", name, "--", "true", url=down)
    assert done.returncode == 69
    one_line(done.stderr)                           # only fencelock's own error line
    verbose = fl("-v", "run", "-w", "0", name, "--", "true", url=down)
    assert verbose.returncode == 69
    assert "fencelock: warning: lock" in verbose.stderr
    debug = fl("--debug", "run", "-w", "0", name, "--", "true", url=down)
    assert debug.returncode == 69
    assert "fencelock: debug: lock" in debug.stderr


def test_quiet_run_says_nothing_of_what_it_does_but_still_reports_errors(standalone: RedisServer, name: str) -> None:
    done = fl("run", "-q", "--grace", "0.2", name, "--", "sh", "-c", "sleep 1000 & exit 0", url=standalone.url)
    assert done.returncode == 0
    assert done.stderr == ""                        # (without -q: "the command left processes running ...")
    done = fl("run", "-q", name, "--", "/nonexistent/command", url=standalone.url)
    assert done.returncode == 127
    assert "command not found" in one_line(done.stderr)
