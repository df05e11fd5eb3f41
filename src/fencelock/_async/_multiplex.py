"""`run_scripts`: one script on each of several servers at once, one task per request. Hand-written twin:
`_sync/_multiplex.py`, the deliberate sync-only fork (a select loop that reads every server's reply from one thread)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from .._redis.channel import maintains
from .._redis.request import Held, Packed, ScriptRequest
from ._concurrency import Handle, _caller, _keep
from ._fanout import _gather
from ._transport import _call_script


async def run_scripts(requests: Sequence[ScriptRequest], timeout: float,
                      enough: Callable[[dict[int, Any]], bool]) -> tuple[dict[int, Any], list[Handle[Any]]]:
    """Run one script on each of several servers at once, one task per request on its server's `Channel`; like
    `fan_out`. A reply is the script's answer, or the exception the server or network gave; one still missing at
    the end is read in the background, and the caller's next request to that server waits for it."""
    caller = _caller()
    packed: Packed = {}  # requests sharing their key and argument lists (and wait): packed once
    tasks: list[asyncio.Future[Any]] = []
    abandoned = asyncio.get_running_loop().create_future()  # set if the caller is cancelled
    late = asyncio.get_running_loop().create_future()  # set when the round is over (or the caller cancelled)
    for request in requests:
        channel = request.channel
        before = channel.in_flight(caller)  # our previous request there: this one must not overtake it
        tasks.append(asyncio.ensure_future(_call_script(request, packed, channel.generation, before, abandoned,
                                                        late=late)))
        _keep(tasks[-1])
    try:
        found = await _gather(tasks, timeout, enough)
    except asyncio.CancelledError:
        abandoned.set_result(None)  # a request still waiting for its predecessor is not sent after all
        late.set_result(None)
        raise
    finally:
        for request, task in zip(requests, tasks, strict=True):
            if not task.done():  # in flight: the caller's next request to that server waits for it
                request.channel.track(caller, task, timeout)
    if not all(maintains(request.lua) for request in requests):
        # The round is over: an acquire still waiting for a connection is not sent late (it would only be given
        # back). One behind its predecessor there still goes; renewals and releases still go.
        late.set_result(None)
    for i, (request, task) in enumerate(zip(requests, tasks, strict=True)):
        if i not in found[0] and not task.done() and request.channel.holding(late):
            # Nothing of it was written by the round's end: its server is not to blame (issue 14).
            found[0][i] = Held(f"not sent to {request.channel.where} within the round: it waited for a connection")
    return found
