"""Calls to several servers at once, returning once enough have answered. Hand-written twin: `_sync/_fanout.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from ._concurrency import Handle, T, _keep
from ._transport import Channel

Call = Callable[[], Awaitable[T]]
"""A request to one server, ready to start (for `fan_out`)."""


async def fan_out(calls: Sequence[Call[T]], timeout: float,
                  enough: Callable[[dict[int, T]], bool], lanes: Sequence[Channel] | None = None,
                  ) -> tuple[dict[int, T], list[Handle[T]]]:
    """Start every call at once; return as soon as `enough(results)` holds, or when `timeout` passes.

    Returns the results of the calls that finished, by their index, and every call's handle: calls still
    running go on in the background, and cleanup can be chained after each one (`then`). Calls must not raise.
    (`lanes`: the servers the calls talk to, for the synchronous twin's threads; tasks need none.)
    """
    return await _gather([asyncio.ensure_future(call()) for call in calls], timeout, enough)


async def _gather(tasks: list[asyncio.Future[T]], timeout: float,
                  enough: Callable[[dict[int, T]], bool]) -> tuple[dict[int, T], list[Handle[T]]]:
    """`fan_out` of tasks already started."""
    for task in tasks:
        _keep(task)
    results: dict[int, T] = {}
    index = {task: i for i, task in enumerate(tasks)}
    pending: set[asyncio.Future[T]] = set(tasks)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pending:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        done, pending = await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            results[index[task]] = task.result()
        if enough(results):
            break
    return results, tasks
