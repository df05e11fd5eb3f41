"""`FENCELOCK_TIME_SCALE`: the one factor every elapsed-time bound in the tests scales its slack by."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _slack_of(seconds: float, scale: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FENCELOCK_TIME_SCALE"}
    if scale is not None:
        env["FENCELOCK_TIME_SCALE"] = scale
    code = f"from fencelock.testing.timing import slack; print(slack({seconds}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


@pytest.mark.parametrize(("scale", "expected"), [(None, "1.5"), ("1", "1.5"), ("2", "3.0"), ("2.5", "3.75")])
def test_the_scale_multiplies_the_slack(scale: str | None, expected: str) -> None:
    done = _slack_of(1.5, scale)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


@pytest.mark.parametrize("scale", ["fast", "0.5", "nan", "-1"])
def test_a_scale_below_one_or_not_a_number_is_refused_by_name(scale: str) -> None:
    done = _slack_of(1.0, scale)
    assert done.returncode != 0
    assert "FENCELOCK_TIME_SCALE must be a number >= 1" in done.stderr
