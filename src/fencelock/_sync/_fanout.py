"""Calls to several servers at once, returning once enough have answered. Hand-written twin: `_async/_fanout.py`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait


from ._concurrency import Handle, T
from ._transport import Channel


def _new_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=64, thread_name_prefix="fencelock")


_POOL = _new_pool()
"""Threads that talk to several servers at once (Redlock). Its threads start when needed, shared by every client.
A forked child gets a pool of its own: the parent's threads do not exist there, and the parent's pool would
queue work for them for ever."""


def _pool_after_fork() -> None:
    global _POOL
    _POOL = _new_pool()


os.register_at_fork(after_in_child=_pool_after_fork)


Call = Callable[[], T]
"""A request to one server, ready to start (for `fan_out`)."""


def fan_out(calls: Sequence[Call[T]], timeout: float,
            enough: Callable[[dict[int, T]], bool], lanes: Sequence[Channel] | None = None,
            ) -> tuple[dict[int, T], list[Handle[T]]]:
    """Start every call at once; return as soon as `enough(results)` holds, or when `timeout` passes.

    Returns the results of the calls that finished, by their index, and every call's handle: calls still
    running go on in the background, and cleanup can be chained after each one (`then`). Calls must not raise.
    `lanes`: call i talks to the server of `lanes[i]`, and runs on that server's own threads, so that a stalled
    server never holds up the calls to the others.
    """
    futures = [_POOL.submit(call) if lanes is None else lanes[i].submit(call) for i, call in enumerate(calls)]
    results: dict[int, T] = {}
    index = {future: i for i, future in enumerate(futures)}
    pending = set(futures)
    deadline = time.monotonic() + timeout
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        done, pending = wait(pending, timeout=remaining, return_when=FIRST_COMPLETED)
        for future in done:
            results[index[future]] = future.result()
        if enough(results):
            break
    return results, futures
