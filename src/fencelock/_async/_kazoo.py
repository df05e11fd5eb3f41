"""Bridges to a client library that runs its own threads (kazoo, for ZooKeeper). Twin: `_sync/_kazoo.py`."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


async def thread_result(result: Any, timeout: float) -> Any:
    """Await a result that another thread completes (kazoo's `IAsyncResult`): its value, or its exception.

    Its completion callback runs on that thread and hands the outcome to this loop. Raises `TimeoutError` when
    `timeout` seconds pass first; the request itself goes on, and its outcome is then dropped.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle() -> None:
        if future.done():
            return
        if result.successful():
            future.set_result(result.value)
        else:
            future.set_exception(result.exception)

    def done(_: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    result.rawlink(done)
    try:
        return await asyncio.wait_for(future, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no answer within {timeout} s") from None
    finally:
        result.unlink(done)


class Wakeup:
    """A flag that any thread may set (a watch firing on kazoo's thread) and one task waits for."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def set(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    async def wait(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


async def wait_thread_event(event: Any, timeout: float) -> bool:
    """Wait at most `timeout` seconds for a `threading.Event` that another thread sets (True: it was set)."""
    if event.is_set():
        return True
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(value: bool) -> None:
        if not done.done():
            done.set_result(value)

    def watch() -> None:
        value = event.wait(timeout)
        try:
            loop.call_soon_threadsafe(settle, value)
        except RuntimeError:
            pass

    # A daemon thread, not the loop's executor: it must never keep the process from exiting.
    threading.Thread(target=watch, name="fencelock-wait", daemon=True).start()
    return bool(await done)
