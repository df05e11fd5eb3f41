"""Calls to several servers at once, returning once enough have answered (written once for both front ends)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .._logic.timing import overslept
from ._concurrency import Call, Handle, T, catch_up, now, start, wait_first
from ._transport import Channel


async def fan_out(calls: Sequence[Call[T]], timeout: float,
                  enough: Callable[[dict[int, T]], bool], lanes: Sequence[Channel] | None = None,
                  ) -> tuple[dict[int, T], list[Handle[T]]]:
    """Start every call at once; return as soon as `enough(results)` holds, or when `timeout` passes.

    Returns the results of the calls that finished, by their index, and every call's handle: calls still
    running go on in the background, and cleanup can be chained after each one (`then`). Calls must not raise.
    `lanes`: call i talks to the server of `lanes[i]` (the sync twin runs it on that server's own threads).
    """
    return await _gather([start(call, None if lanes is None else lanes[i]) for i, call in enumerate(calls)],
                         timeout, enough)


async def _gather(handles: list[Handle[T]], timeout: float,
                  enough: Callable[[dict[int, T]], bool]) -> tuple[dict[int, T], list[Handle[T]]]:
    """`fan_out` of calls already started."""
    results: dict[int, T] = {}
    index = {handle: i for i, handle in enumerate(handles)}
    pending: set[Handle[T]] = set(handles)
    deadline = now() + timeout
    extended = False
    while pending:
        remaining = deadline - now()
        if remaining <= 0:
            if extended:
                break
            # Replies received in time may still wait to be read behind the client's other work: read them first
            # (one look that does not wait). A client that was too busy to run (not the servers) gives the replies
            # that long again.
            extended = True
            await catch_up()
            woke = now()
            deadline = woke + overslept(deadline, woke, timeout)
            remaining = deadline - woke
        done, pending = await wait_first(pending, remaining)
        for handle in done:
            results[index[handle]] = handle.result()
        if enough(results):
            break
    return results, handles
