"""Starts the model searches of the selected tests in the background (`searches.py`)."""

from __future__ import annotations

import pytest

from . import searches


def pytest_collection_finish(session: pytest.Session) -> None:
    names = []
    for item in session.items:
        for marker in item.iter_markers("search"):
            names += list(marker.args)
    if names:
        # The modules that register the searches are imported already: collecting them did it.
        searches.start(names)


def pytest_sessionfinish(session: pytest.Session) -> None:
    searches.stop()
