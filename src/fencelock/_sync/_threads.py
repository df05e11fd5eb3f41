# Generated from _async/_threads.py by scripts/unasync.py: do not edit, edit that file instead.
"""Blocking work in a daemon thread, waited for at most a timeout (kazoo's blocking calls)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._kazoo import wait_thread_event


def blocking(work: Callable[[], object], timeout: float) -> bool:
    """Run a blocking call in a daemon thread and wait at most `timeout` seconds for it (True: it finished)."""
    finished = threading.Event()

    def run() -> None:
        try:
            work()
        except Exception:
            pass
        finally:
            finished.set()

    threading.Thread(target=run, name="fencelock-blocking", daemon=True).start()
    return wait_thread_event(finished, timeout)
