"""The source distribution: built offline from the checkout's tracked files, it holds the docs the README links to
(docs/design, docs/decisions) and leaves the tests out (MANIFEST.in)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[2]


def _setuptools_version() -> tuple[int, ...]:
    try:
        from importlib.metadata import version

        return tuple(int(part) for part in version("setuptools").split(".")[:2])
    except Exception:
        return (0,)


def test_the_sdist_holds_the_docs_and_not_the_tests(tmp_path: Path) -> None:
    if _setuptools_version() < (77,):  # `license = "MIT"` (PEP 639) needs it; the test group asks for it
        message = "setuptools>=77 is needed to build the sdist (the `test` dependency group installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (its tracked files are what an sdist is built from)")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    copy = tmp_path / "checkout"
    for name in filter(None, tracked.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    built = subprocess.run([sys.executable, "-c", "from setuptools import build_meta; "
                            "print(build_meta.build_sdist('dist'))"],
                           cwd=copy, capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    sdist = copy / "dist" / built.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert "docs/design/run.md" in names
    assert "docs/decisions/README.md" in names
    assert "src/fencelock/_cli/guardian.py" in names
    assert not [name for name in names if name.startswith("tests/")]
