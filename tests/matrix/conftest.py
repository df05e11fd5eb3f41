"""Options of the fault matrix: `--seed` picks the soak's random cells, `--duration` (seconds) turns the soak on."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fencelock fault matrix")
    group.addoption("--seed", type=int, default=14, help="seed of the soak's random cells (default 14)")
    group.addoption("--duration", type=float, default=0.0,
                    help="seconds of randomised soak after the matrix (default 0: no soak)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A soak of `--duration` seconds gets that long plus the usual 120 s before pytest-timeout stops it."""
    duration = float(config.getoption("duration", 0.0))
    if duration > 0:
        for item in items:
            if item.name == "test_soak":
                item.add_marker(pytest.mark.timeout(duration + 120))
