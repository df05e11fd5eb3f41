"""What a first-time user of `fencelock lab` sees: a table that fits the terminal, a rerun command that repeats
the run as printed, an exit status that says whether the results and report were written, and skip reasons that
tell a missing server from a missing extra."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fencelock._lab.run import parse
from tests.conftest import _require_server_binary

QUICK = Path(__file__).with_name("lab_results_quick.json")


def _printed_table(columns: int) -> str:
    """The table as `fencelock lab` prints it in a terminal `columns` wide (COLUMNS is what a shell exports)."""
    code = ("import json, sys\nfrom fencelock._lab.run import table\n"
            f"print(table(json.loads(open({str(QUICK)!r}).read())))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, "COLUMNS": str(columns)})
    return done.stdout.rstrip("\n")


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_the_table_fits_the_terminal_and_cuts_long_titles_at_a_word_with_an_ellipsis(columns: int) -> None:
    results = json.loads(QUICK.read_text())
    text = _printed_table(columns)
    lines = text.splitlines()
    assert max(map(len, lines)) <= columns, "\n".join(x for x in lines if len(x) > columns)
    for s in results["scenarios"]:
        label = f"{s['id']}  {s['title']}"
        (row,) = [x for x in lines if x.startswith(f"{s['id']}  ")]
        shown = row[:len(label)].rstrip() if label in row else row.split("…")[0] + "…"
        if shown.endswith("…"):                                    # a whole-word prefix, then the ellipsis
            head = shown[:-1]
            assert label.startswith(head), (head, label)
            assert label[len(head)] in " ,;:-", f"cut mid-word: {shown!r}"
        else:
            assert shown == label
    for c in results["cells"]:                                     # every verdict is still there
        if c["verdict"] == "UNSAFE":
            assert f"UNSAFE {c['counts']['stale_accepted']}" in text
    if columns == 200:
        assert "…" not in text
        assert lines[0].split() == ["scenario", *(c["id"] for c in results["configs"])]


def test_cut_keeps_whole_words() -> None:
    from fencelock._lab.table import cut

    assert cut("holder paused past its TTL, then writes", 24) == "holder paused past its…"
    assert cut("holder paused past its TTL, then writes", 28) == "holder paused past its TTL…"
    assert cut("short", 24) == "short"
    assert cut("unbreakablewordthatislong", 10) == "unbreakab…"


def test_the_reports_rerun_command_repeats_the_run_as_printed(tmp_path: Path) -> None:
    _require_server_binary()
    argv = ["--quick", "--seed", "11", "--scenarios", "1,5a", "--configs", "redis", "--out", str(tmp_path / "a")]
    first = subprocess.run([sys.executable, "-m", "fencelock._lab", *argv], capture_output=True, text=True,
                           timeout=180, check=False, cwd=tmp_path, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert first.returncode == 0, first.stderr
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    command = results["command"]
    assert command.startswith((sys.executable, os.path.abspath(sys.executable)))
    assert "fencelock lab" not in command
    assert "--out" not in command
    assert command in (tmp_path / "a" / "index.html").read_text()      # the report's "Run it again"
    # As a user would: pasted into a shell elsewhere, without the venv on PATH.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=180, check=False,
                           cwd=elsewhere, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert again.returncode == 0, again.stderr
    (out,) = (elsewhere / "out" / "lab").iterdir()
    repeated = json.loads((out / "results.json").read_text())
    assert (repeated["seed"], repeated["quick"], repeated["repeat"]) == (11, True, 1)
    assert [(c["scenario"], c["config"]) for c in repeated["cells"]] == [("1", "redis"), ("5a", "redis")]
    assert repeated["command"] == command
    assert (out / "index.html").is_file()


def test_the_rerun_command_keeps_the_runs_arguments() -> None:
    from fencelock._lab.run import rerun_command

    full = rerun_command(parse(["--repeat", "2", "--configs", "redis, redlock"]), 5, "/x/.venv/bin/python")
    assert full == "/x/.venv/bin/python -m fencelock._lab --seed 5 --repeat 2 --configs redis,redlock"
    assert rerun_command(parse(["--quick"]), 9, "/a b/python") == "'/a b/python' -m fencelock._lab --quick --seed 9"


@pytest.mark.parametrize("where", ["file", "file/below"])
def test_an_out_that_cannot_hold_the_report_fails_before_the_run(tmp_path: Path, where: str) -> None:
    (tmp_path / "file").write_text("not a folder")
    done = subprocess.run([sys.executable, "-m", "fencelock", "lab", "--quick", "--out", str(tmp_path / where)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cannot write the results and report to {tmp_path / where}" in done.stderr
    assert "scenarios x" not in done.stdout                       # nothing ran
    assert (tmp_path / "file").read_text() == "not a folder"


def test_a_report_that_cannot_be_written_after_the_run_exits_non_zero(tmp_path: Path) -> None:
    (tmp_path / "index.html").mkdir()                              # the report's own name is taken by a folder
    done = subprocess.run([sys.executable, "-m", "fencelock", "lab", "--quick", "--scenarios", "5a", "--configs",
                           "redis", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"could not write the report in {tmp_path}" in done.stderr
    assert "report: " not in done.stdout
    assert (tmp_path / "results.json").is_file()                   # what could be written was


def _reason(config: str, env: dict[str, str], hide: str | None = None) -> str | None:
    """The configuration's skip reason as a fresh process sees it, with `env` set and module `hide` missing."""
    code = ("import sys, json\n"
            + (f"sys.modules[{hide!r}] = None\n" if hide else "")
            + f"from fencelock._lab.configs import by_id\nprint(json.dumps(by_id({config!r}).availability()[1]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, **env})
    reason: str | None = json.loads(done.stdout)
    return reason


def test_skip_reasons_say_what_is_true_of_this_machine() -> None:
    import shutil

    etcd = shutil.which("etcd") is not None or os.access("/usr/bin/etcd", os.X_OK)
    httpx = importlib.util.find_spec("httpx") is not None
    reason = _reason("etcd+guard", {})
    assert (reason is None) is (etcd and httpx), reason
    assert ("etcd is not installed" in (reason or "")) is not etcd
    assert ("httpx is not installed" in (reason or "")) is not httpx
    zk = Path("/usr/share/java/zookeeper.jar").is_file()
    java = shutil.which("java") is not None
    kazoo = importlib.util.find_spec("kazoo") is not None
    reason = _reason("zookeeper+guard", {})
    assert (reason is None) is (zk and java and kazoo), reason
    assert ("ZooKeeper is not installed" in (reason or "")) is not zk
    assert ("Java is not installed" in (reason or "")) is not java
    assert ("kazoo is not installed" in (reason or "")) is not kazoo


def test_a_missing_server_and_a_missing_extra_are_told_apart() -> None:
    if importlib.util.find_spec("httpx") is None or importlib.util.find_spec("kazoo") is None:
        pytest.skip("needs the etcd and zookeeper extras installed, to hide one at a time")
    no_server = _reason("etcd+guard", {"FENCELOCK_ETCD": "/nonexistent/etcd"})
    assert no_server == "etcd is not installed: /nonexistent/etcd is not an executable file"
    no_extra = _reason("etcd+guard", {"FENCELOCK_ETCD": sys.executable}, hide="httpx")
    assert no_extra == "httpx is not installed: pip install 'fencelock[etcd]'"
    no_jar = _reason("zookeeper+guard", {"FENCELOCK_ZOOKEEPER_JAR": "/nonexistent/zookeeper.jar"})
    assert no_jar is not None
    assert no_jar.startswith("ZooKeeper is not installed (/nonexistent/zookeeper.jar not found)")
    assert "kazoo" not in no_jar
    assert "pip install" not in no_jar
    jar = os.environ.get("FENCELOCK_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar")
    no_kazoo = _reason("zookeeper+guard", {"FENCELOCK_ZOOKEEPER_JAR": jar}, hide="kazoo")
    assert no_kazoo is not None
    assert no_kazoo.startswith("kazoo is not installed: pip install 'fencelock[zookeeper]'")
    assert "apt-get install zookeeper" not in no_kazoo
