r"""A pytest plugin that times the test process's full garbage collections and prints the longest at the end.

    PYTHONPATH=scripts .venv/bin/python -m pytest -q -p gc_pauses \
        tests/matrix/test_matrix.py -k "test_cluster and async"

The summary's pairs are (seconds, objects in the oldest generation when the collection began).
"""

from __future__ import annotations

import gc
import time
from typing import Any

_started: list[float] = []
_objects: list[int] = []
_pauses: list[tuple[float, int]] = []


def _timer(phase: str, info: dict[str, Any]) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _objects[:] = [len(gc.get_objects(2))]
        _started[:] = [time.perf_counter()]
    elif _started:
        _pauses.append((time.perf_counter() - _started[0], _objects[0]))


gc.callbacks.append(_timer)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    longest = sorted(_pauses, reverse=True)[:10]
    terminalreporter.write_line(f"full collections: {len(_pauses)}, {sum(p for p, _ in _pauses):.2f} s in all; "
                                f"longest: {[(round(p, 3), n) for p, n in longest]}")
