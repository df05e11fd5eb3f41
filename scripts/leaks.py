r"""A pytest plugin that collects garbage after every test and names the test whose objects were left unclosed.

    PYTHONPATH=scripts .venv/bin/python -m pytest -q -p leaks tests/redis
    PYTHONTRACEMALLOC=8 PYTHONPATH=scripts ...    # also where each leaked object was made (much slower)

A `ResourceWarning` (an unclosed socket or transport) found by that collection is written to `leaks.txt` in the
working directory, under the test that ran just before; the suite's own run reports such a leak only when a
collection happens to find it, in whichever test is running then.
"""

from __future__ import annotations

import gc
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

REPORT = Path("leaks.txt")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    found = [w for w in caught if issubclass(w.category, ResourceWarning)]
    if not found:
        return
    with REPORT.open("a") as report:
        report.write(f"{item.nodeid}: {len(found)}\n")
        for w in found[:20]:
            report.write(f"    {str(w.message)[:200]}\n")
            made = tracemalloc.get_object_traceback(w.source) if w.source is not None else None
            if made is not None:
                report.write("      " + "\n      ".join(made.format()) + "\n")
