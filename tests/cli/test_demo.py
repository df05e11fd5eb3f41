"""The README's first command runs the demo on an embedded server; this runs it the same way."""

from __future__ import annotations

import subprocess
import sys


def test_the_demo_shows_the_unguarded_write_lost_and_the_guarded_one_rejected() -> None:
    done = subprocess.run([sys.executable, "-m", "fencelock", "demo"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "started an embedded server" in done.stdout
    assert "the record now says b'paid by A': B's update is lost" in done.stdout
    assert "through the guard:            rejected" in done.stdout
    assert "the record still says b'paid by B'" in done.stdout
    assert "LockLost" in done.stdout


def test_the_entry_point_alone_shows_the_commands_help() -> None:
    done = subprocess.run([sys.executable, "-m", "fencelock"], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 2
    assert "Usage: fencelock [OPTIONS] COMMAND" in done.stdout
