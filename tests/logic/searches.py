"""The exhaustive model searches, started when the session starts in one low-priority process, so that their
minutes of CPU overlap the suite's waits on servers instead of adding to them.

A test names its search with ``@pytest.mark.search("name")`` and asks for its result with `result(name)`;
`conftest.py` starts the searches of the selected tests. A search that was not started (the test run alone, or
from another directory's session) runs in the test itself. The result is the search's own return value.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
from collections.abc import Callable, Iterable
from typing import Any

SEARCHES: dict[str, Callable[[], Any]] = {}
"""name -> the search, a picklable callable with no arguments (a module-level function, or a partial of one)."""

_pool: multiprocessing.pool.Pool | None = None
_started: dict[str, multiprocessing.pool.AsyncResult[Any]] = {}


def register(name: str, search: Callable[[], Any]) -> None:
    SEARCHES[name] = search


def _low_priority() -> None:
    os.nice(19)  # only the CPU that the suite's own processes and servers leave idle


def start(names: Iterable[str]) -> None:
    """Start these searches, in order, in one background process."""
    global _pool
    wanted = [name for name in names if name in SEARCHES and name not in _started]
    if not wanted:
        return
    if _pool is None:
        _pool = multiprocessing.get_context("spawn").Pool(1, initializer=_low_priority)
    for name in wanted:
        _started[name] = _pool.apply_async(SEARCHES[name])


def result(name: str) -> Any:
    """The search's result: from the background process if it was started there, else computed here."""
    started = _started.get(name)
    return SEARCHES[name]() if started is None else started.get()


def stop() -> None:
    """End the background process, finished or not (a session cut short must not leave it running)."""
    global _pool
    if _pool is not None:
        _pool.terminate()
        _pool.join()
        _pool = None
    _started.clear()
