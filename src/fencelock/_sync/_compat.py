"""The few things asyncio and threads really do differently. Hand-written twin: `_async/_compat.py`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def shielded(value: T) -> T:
    """A synchronous call has already run to completion when its value is passed here: nothing to shield."""
    return value


def in_background(work: Callable[[], object]) -> None:
    """Start best-effort `work` and return at once; it runs to its end in a daemon thread.

    Its failure is nobody's to report (the caller has moved on, the client may be closed): it is dropped.
    """

    def run() -> None:
        try:
            work()
        except Exception:
            return

    threading.Thread(target=run, name="fencelock-cleanup", daemon=True).start()


def undo_if_interrupted(request: Callable[[], T], undo: Callable[[], object]) -> T:
    """Send `request`; if it is interrupted (KeyboardInterrupt, SystemExit), run `undo` before re-raising.

    Unlike asyncio, a thread cannot let the interrupted request finish first, so `undo` may reach the server
    before the request does; then the key (if any) lives until its TTL ends.
    """
    try:
        return request()
    except Exception:
        raise
    except BaseException:
        undo()
        raise


def sleep(seconds: float) -> None:
    time.sleep(seconds)
