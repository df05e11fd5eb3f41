"""What asyncio and threads really do differently: background work, cancellation, signals and runners.
Hand-written twin: `_sync/_concurrency.py` (httpcore's `_synchronization.py` is the model)."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

from .._logic.admission import no_caller_deadline

T = TypeVar("T")

log = logging.getLogger("fencelock")

Handle = asyncio.Future
"""A call started by `fan_out` that may still be running."""

Call = Callable[[], Awaitable[T]]
"""A request to one server, ready to start (for `fan_out`)."""


_background: set[asyncio.Future[Any]] = set()


def _keep(task: asyncio.Future[Any]) -> None:
    """Keep a background task referenced until it ends, so it is never garbage-collected half-way."""
    _background.add(task)
    task.add_done_callback(_background.discard)


_origin: weakref.WeakKeyDictionary[asyncio.Future[Any], Any] = weakref.WeakKeyDictionary()
"""A task started on a caller's behalf (`shielded`, `undo_if_interrupted`) -> that caller's task."""


def _caller() -> Any:
    """Who is sending, for the order of requests on `Channel`s: the running task, or the task it runs for."""
    task = asyncio.current_task()
    return _origin.get(task, task) if task is not None else None


def _on_behalf(task: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """`task` sends for the running task: its requests to one server stay in order with the caller's own."""
    _origin[task] = _caller()
    return task


async def shielded(awaitable: Awaitable[T]) -> T:
    """Run `awaitable` to completion even if the caller is cancelled meanwhile (the cancellation still propagates)."""
    task = _on_behalf(asyncio.ensure_future(awaitable))
    _keep(task)
    return await asyncio.shield(task)


def in_background(work: Callable[[], Awaitable[object]], *, ours: bool = False) -> None:
    """Start best-effort `work` and return at once; it runs to its end as a task of the running loop.

    Its failure is nobody's to report (the caller has moved on, the client may be closed): it is dropped.
    `ours`: it sends as the caller, so its requests to a server follow the caller's own still in flight there.
    """

    async def run() -> None:
        _given_up.set(None)  # a cleanup always goes, whoever gave up on the request that started it
        no_caller_deadline()  # (and is not bound by the wait of the acquire that started it)
        try:
            await work()
        except Exception:
            return

    task = asyncio.ensure_future(run())
    _keep(_on_behalf(task) if ours else task)


class _Caller:
    """The caller of a request `undo_if_interrupted` runs: whether it was cancelled, and an event set then."""

    __slots__ = ("cancelled", "gone")

    def __init__(self) -> None:
        self.cancelled = False
        self.gone = asyncio.Event()

    def cancel(self) -> None:
        self.cancelled = True
        self.gone.set()


_given_up: contextvars.ContextVar[_Caller | None] = contextvars.ContextVar("fencelock_given_up", default=None)
"""In a request `undo_if_interrupted` runs: its caller."""


def given_up() -> bool:
    """The caller this request runs for was cancelled: what it has not written yet is never sent."""
    caller = _given_up.get()
    return caller is not None and caller.cancelled


async def unless_given_up(wait: Awaitable[T]) -> T | None:
    """Await `wait`, a wait that sends nothing (a watch, a wake-up); None, at once, if the caller this request runs
    for is cancelled meanwhile (the wait is cancelled): a cancelled waiter stops waiting, and its undo follows."""
    caller = _given_up.get()
    task = asyncio.ensure_future(wait)
    if caller is None:
        return await task
    stop = asyncio.ensure_future(caller.gone.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # (its own clean-up: a watch's stream is closed)
    if task.cancelled():
        return None
    return task.result()


async def undo_if_interrupted(request: Callable[[], Awaitable[T]], undo: Callable[[], Awaitable[object]],
                              interrupted: Callable[[], object]) -> T:
    """Send `request`; if the caller is cancelled before the answer, call `interrupted()` at once, let the request
    finish, then run `undo`.

    A cancelled acquire may already be on the wire: dropping it and deleting "our key" at once could run the
    delete before the server runs the acquire. So the request runs to its end in the background, and `undo`
    (delete the key with our token) follows it, in that order. What it has not written by then is not sent.
    """
    caller = _Caller()

    async def marked() -> T:
        _given_up.set(caller)  # (this task's own context, and that of the tasks it starts)
        return await request()

    task = _on_behalf(asyncio.ensure_future(marked()))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        caller.cancel()
        interrupted()
        _keep(_on_behalf(asyncio.ensure_future(_undo_after(task, undo))))  # after the request's own requests
        raise


async def _undo_after(task: asyncio.Future[Any], undo: Callable[[], Awaitable[object]]) -> None:
    no_caller_deadline()  # (a cleanup: not bound by the wait of the caller that left)
    try:
        await task
    except BaseException:
        pass
    await undo()


def start(call: Call[T], lane: Any = None) -> Handle[T]:
    """Start `call` as a task of the running loop (`lane`: its server, for the sync twin's threads; tasks need none)."""
    task = asyncio.ensure_future(call())
    _keep(task)
    return task


def then(handle: Handle[Any], work: Callable[[], Awaitable[object]]) -> None:
    """Run best-effort `work` in the background once `handle` (from `fan_out`) has finished."""

    async def after() -> None:
        try:
            await handle
        except BaseException:
            pass
        await work()

    in_background(after)


class Signal:
    """A flag one side sets and the other waits for, with a timeout (an `asyncio.Event` here)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None) -> bool:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


Runner = asyncio.Task[None]
"""Something running on its own: a task here, a daemon thread in the synchronous twin."""


def spawn(work: Callable[[], Awaitable[None]], name: str) -> Runner:
    """Start `work` on its own (a task of the running loop); it must stop by itself when asked to. It runs for no
    caller: neither the cancellation nor the deadline of the one whose call started it applies to it."""

    async def run() -> None:
        _given_up.set(None)
        no_caller_deadline()
        await work()

    task: Runner = asyncio.ensure_future(run())
    _keep(task)
    return task


def alive(runner: Runner) -> bool:
    """Still running: a task ends with its event loop, so a client used by a second `asyncio.run` needs anew."""
    return not runner.done() and runner.get_loop() is asyncio.get_running_loop()


async def join(runner: Runner, timeout: float) -> None:
    """Wait for a runner to stop, at most `timeout` seconds (then cancel it). A task of another event loop
    (a client closed by a later `asyncio.run` than the one that used it) cannot be awaited here: it is told to
    stop, and ends with its loop."""
    loop = runner.get_loop()
    if loop is not asyncio.get_running_loop():
        if not loop.is_closed():
            loop.call_soon_threadsafe(runner.cancel)
        return
    try:
        await asyncio.wait_for(asyncio.shield(runner), timeout)
    except asyncio.TimeoutError:
        runner.cancel()


def current_task() -> Any:
    """What `cancel` can interrupt: the running task (None in the synchronous twin: threads are never cancelled)."""
    return asyncio.current_task()


def cancel(task: Any) -> None:
    task.cancel()


def is_cancellation(exc: BaseException | None) -> bool:
    return isinstance(exc, asyncio.CancelledError)


def uncancel(task: Any) -> None:
    """Withdraw a cancellation we caused and turned into another error (Python 3.11+ counts them)."""
    if hasattr(task, "uncancel"):
        task.uncancel()


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def catch_up() -> None:
    """Let the client's own work already under way run first: replies already received are read and handed on (a
    reply takes a few turns of the loop from its socket to its caller). A deadline then judges the servers, not
    how busy the client was."""
    for _ in range(CATCH_UP_TURNS):
        await asyncio.sleep(0)


CATCH_UP_TURNS = 3


def event_loop() -> object:
    """What connections belong to: the running event loop (None in the synchronous twin)."""
    return asyncio.get_running_loop()


def now() -> float:
    """The clock that deadlines are measured on (the running loop's)."""
    return asyncio.get_running_loop().time()


async def wait_first(handles: Collection[Handle[T]], timeout: float) -> tuple[set[Handle[T]], set[Handle[T]]]:
    """Wait at most `timeout` seconds for the first of `handles` to finish: (the finished ones, the others)."""
    return await asyncio.wait(handles, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)


class Callbacks:
    """Runs a client's callbacks (`on_lost`) off the watchdog: each one soon, on the loop, after the watchdog's
    current step (`call_soon`); one that returns an awaitable (an `async def` callback) has it run as a task.
    Twin: `_sync/_concurrency.Callbacks` (a thread of the client's own)."""

    def call(self, work: Callable[[], object]) -> None:
        asyncio.get_running_loop().call_soon(work)


def run_result(result: object, what: str) -> None:
    """What a user's callback returned: an awaitable runs to its end as a task (its failure logged as `what`)."""
    if not inspect.isawaitable(result):
        return

    async def run() -> None:
        try:
            await result
        except Exception:
            log.exception(what)

    _keep(asyncio.ensure_future(run()))

