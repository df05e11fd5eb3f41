"""What asyncio and threads really do differently: background work, cancellation, signals and runners.
Hand-written twin: `_async/_concurrency.py` (httpcore's `_synchronization.py` is the model)."""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from .._logic.admission import no_caller_deadline

T = TypeVar("T")

log = logging.getLogger("fencelock")


def shielded(value: T) -> T:
    """A synchronous call has already run to completion when its value is passed here: nothing to shield."""
    return value


_sender = threading.local()
"""`.origin`: the thread a cleanup thread sends for (`in_background(ours=True)`)."""


def caller() -> Any:
    """Who is sending, for the order of requests on `Channel`s: this thread, or the thread it sends for."""
    return getattr(_sender, "origin", None) or threading.get_ident()


def in_background(work: Callable[[], object], *, ours: bool = False) -> None:
    """Start best-effort `work` and return at once; it runs to its end in a daemon thread.

    Its failure is nobody's to report (the caller has moved on, the client may be closed): it is dropped.
    `ours`: it sends as the caller, so its requests to a server follow the caller's own still in flight there.
    """
    origin = caller() if ours else None

    def run() -> None:
        _sender.origin = origin  # (a thread starts with a context of its own: no caller's deadline)
        try:
            work()
        except Exception:
            return

    threading.Thread(target=run, name="fencelock-cleanup", daemon=True).start()


def given_up() -> bool:
    """A thread is never cancelled half-way through a request: never."""
    return False


def unless_given_up(result: T) -> T | None:
    """The result of a wait that sends nothing: a thread is never cancelled during it (twin of asyncio's)."""
    return result


def undo_if_interrupted(request: Callable[[], T], undo: Callable[[], object], interrupted: Callable[[], object]) -> T:
    """Send `request`; if it is interrupted (KeyboardInterrupt, SystemExit), call `interrupted()`, then run `undo`
    before re-raising.

    Unlike asyncio, a thread cannot let the interrupted request finish first, so `undo` may reach the server
    before the request does; then the key (if any) lives until its TTL ends.
    """
    try:
        return request()
    except Exception:
        raise
    except BaseException:
        interrupted()
        contextvars.copy_context().run(_cleanup, undo)  # (not bound by the wait of the caller it interrupts)
        raise


def _cleanup(work: Callable[[], object]) -> None:
    no_caller_deadline()
    work()


Handle = Future

Call = Callable[[], T]
"""A request to one server, ready to start (for `fan_out`)."""


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


def start(call: Call[T], lane: Any = None) -> Handle[T]:
    """Start `call` in a thread: on `lane`'s own (its server's `Channel.submit`), so that a stalled server never
    holds up the calls to the others, or else in the shared pool."""
    return _POOL.submit(call) if lane is None else lane.submit(call)


def then(handle: Handle[Any], work: Callable[[], object]) -> None:
    """Run best-effort `work` in the background once `handle` (from `fan_out`) has finished."""

    def after(_: Future[Any]) -> None:
        in_background(work)

    handle.add_done_callback(after)


class Signal:
    """A flag one side sets and the other waits for, with a timeout (a `threading.Event` here)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)


Runner = threading.Thread
"""Something running on its own: a daemon thread here, a task in the asyncio twin."""


def spawn(work: Callable[[], None], name: str) -> Runner:
    """Start `work` in a daemon thread (it never keeps the process alive); it must stop by itself when asked to."""
    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    return thread


def alive(runner: Runner) -> bool:
    return runner.is_alive()


def join(runner: Runner, timeout: float) -> None:
    """Wait for a runner to stop, at most `timeout` seconds."""
    if runner is not threading.current_thread():
        runner.join(timeout)


def current_task() -> Any:
    """Threads cannot be interrupted safely: there is nothing to cancel."""
    return None


def cancel(task: Any) -> None:
    """Nothing to cancel in a thread (see `current_task`)."""


def is_cancellation(exc: BaseException | None) -> bool:
    return False


def uncancel(task: Any) -> None:
    """Nothing was cancelled (see `current_task`)."""


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def catch_up() -> None:
    """Let the threads reading replies already received run first (they wait for the interpreter, not the servers)."""
    time.sleep(0)


def event_loop() -> object:
    """What connections belong to: threads share them (None; asyncio: the running loop)."""
    return None


def now() -> float:
    """The clock that deadlines are measured on."""
    return time.monotonic()


def wait_first(handles: Collection[Handle[T]], timeout: float) -> tuple[set[Handle[T]], set[Handle[T]]]:
    """Wait at most `timeout` seconds for the first of `handles` to finish: (the finished ones, the others)."""
    done, pending = wait(handles, timeout=max(0.0, timeout), return_when=FIRST_COMPLETED)
    return done, pending


class Callbacks:
    """Runs a client's callbacks (`on_lost`) off the watchdog: one after another, in the order they came, on a
    daemon thread of the client's own (started when needed, ended once idle), so that a slow one never holds up
    the renewal of the other leases. Twin: `_async/_concurrency.Callbacks` (the loop's `call_soon`)."""

    IDLE = 5.0  # seconds the thread waits for more work before it ends

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False
        self._pid = os.getpid()

    def call(self, work: Callable[[], object]) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's thread does not exist here
                self._queue, self._running, self._pid = queue.SimpleQueue(), False, os.getpid()
            self._queue.put(work)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="fencelock-callbacks", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                work = self._queue.get(timeout=self.IDLE)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._running = False
                        return
                continue
            try:
                work()
            except Exception:
                log.exception("a fencelock callback failed")


def run_result(result: object, what: str) -> None:
    """What a user's callback returned: a coroutine (an `async def` callback) cannot run in a thread; it is closed
    and the mistake logged as `what`."""
    if inspect.iscoroutine(result):
        result.close()
        log.error("%s: it returned a coroutine, which the synchronous client cannot run; pass a plain function",
                  what)

