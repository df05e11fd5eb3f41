"""Every process a CLI test starts ends with the test, whatever its outcome: a `Popen` left running is reported
by its garbage collection (`ResourceWarning: subprocess N is still running`) inside whichever test runs then, and
fails that one (warnings are errors)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from .test_cli import FORKED, STARTED


def end(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGKILL `proc` if it still runs, reap it, and close our ends of its pipes."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover (SIGKILL does not take 30 s)
        pass
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def end_forked(pid: int) -> None:
    """SIGKILL and reap our child `pid` unless it was reaped already (then the PID may be someone else's now)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return
    if not done:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.fixture(autouse=True)
def _end_started() -> Iterator[None]:
    """Kill and wait for every process the test started through `started`/`start`/`forked`."""
    STARTED.clear()
    FORKED.clear()
    yield
    while STARTED:
        end(STARTED.pop())
    while FORKED:
        end_forked(FORKED.pop())
