"""Bridges to a client library that runs its own threads (kazoo, for ZooKeeper). Twin: `_async/_kazoo.py`."""

from __future__ import annotations

import threading
from typing import Any




def thread_result(result: Any, timeout: float) -> Any:
    """Wait for a result that another thread completes (kazoo's `IAsyncResult`): its value, or its exception.

    Raises `TimeoutError` when `timeout` seconds pass first; the request itself goes on.
    """
    if not result.wait(timeout):
        raise TimeoutError(f"no answer within {timeout} s")
    return result.get(block=False)


class Wakeup:
    """A flag that any thread may set (a watch firing on kazoo's thread) and one thread waits for."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


def wait_thread_event(event: Any, timeout: float) -> bool:
    """Wait at most `timeout` seconds for a `threading.Event` that another thread sets (True: it was set)."""
    return bool(event.wait(timeout))
