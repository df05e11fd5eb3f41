"""The few things asyncio and threads really do differently. Hand-written twin: `_sync/_compat.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_background: set[asyncio.Future[Any]] = set()


def _keep(task: asyncio.Future[Any]) -> None:
    """Keep a background task referenced until it ends, so it is never garbage-collected half-way."""
    _background.add(task)
    task.add_done_callback(_background.discard)


async def shielded(awaitable: Awaitable[T]) -> T:
    """Run `awaitable` to completion even if the caller is cancelled meanwhile (the cancellation still propagates)."""
    task = asyncio.ensure_future(awaitable)
    _keep(task)
    return await asyncio.shield(task)


def in_background(work: Callable[[], Awaitable[object]]) -> None:
    """Start best-effort `work` and return at once; it runs to its end as a task of the running loop.

    Its failure is nobody's to report (the caller has moved on, the client may be closed): it is dropped.
    """

    async def run() -> None:
        try:
            await work()
        except Exception:
            return

    _keep(asyncio.ensure_future(run()))


async def undo_if_interrupted(request: Callable[[], Awaitable[T]], undo: Callable[[], Awaitable[object]]) -> T:
    """Send `request`; if the caller is cancelled before the answer, let the request finish, then run `undo`.

    A cancelled acquire may already be on the wire: dropping it and deleting "our key" at once could run the
    delete before the server runs the acquire. So the request runs to its end in the background, and `undo`
    (delete the key with our token) follows it, in that order.
    """
    task = asyncio.ensure_future(request())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _keep(asyncio.ensure_future(_undo_after(task, undo)))
        raise


async def _undo_after(task: asyncio.Future[Any], undo: Callable[[], Awaitable[object]]) -> None:
    try:
        await task
    except BaseException:
        pass
    await undo()


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
