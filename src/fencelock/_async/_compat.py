"""The few things asyncio and threads really do differently. Hand-written twin: `_sync/_compat.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

_running: set[asyncio.Future[Any]] = set()


async def shielded(awaitable: Awaitable[T]) -> T:
    """Run `awaitable` to completion even if the caller is cancelled meanwhile.

    Cleanup that must happen (deleting a key we may have created) goes through here. The task is kept referenced
    until it finishes, so it is never garbage-collected half-way; the caller's cancellation still propagates.
    """
    task = asyncio.ensure_future(awaitable)
    _running.add(task)
    task.add_done_callback(_running.discard)
    return await asyncio.shield(task)


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
