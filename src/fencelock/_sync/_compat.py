"""The few things asyncio and threads really do differently. Hand-written twin: `_async/_compat.py`."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple, TypeVar

from redis.exceptions import NoScriptError

T = TypeVar("T")


def shielded(value: T) -> T:
    """A synchronous call has already run to completion when its value is passed here: nothing to shield."""
    return value


def in_background(work: Callable[[], object]) -> None:
    """Start best-effort `work` and return at once; it runs to its end in a daemon thread.

    Its failure is nobody's to report (the caller has moved on, the client may be closed): it is dropped.
    """

    def run() -> None:
        try:
            work()
        except Exception:
            return

    threading.Thread(target=run, name="fencelock-cleanup", daemon=True).start()


def undo_if_interrupted(request: Callable[[], T], undo: Callable[[], object]) -> T:
    """Send `request`; if it is interrupted (KeyboardInterrupt, SystemExit), run `undo` before re-raising.

    Unlike asyncio, a thread cannot let the interrupted request finish first, so `undo` may reach the server
    before the request does; then the key (if any) lives until its TTL ends.
    """
    try:
        return request()
    except Exception:
        raise
    except BaseException:
        undo()
        raise


_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fencelock")
"""Threads that talk to several servers at once (Redlock). Created lazily, shared by every client."""

Handle = Future

Call = Callable[[], T]
"""A request to one server, ready to start (for `fan_out`)."""


def fan_out(calls: Sequence[Call[T]], timeout: float,
            enough: Callable[[dict[int, T]], bool]) -> tuple[dict[int, T], list[Handle[T]]]:
    """Start every call at once; return as soon as `enough(results)` holds, or when `timeout` passes.

    Returns the results of the calls that finished, by their index, and every call's handle: calls still
    running go on in the background, and cleanup can be chained after each one (`then`). Calls must not raise.
    """
    futures = [_POOL.submit(call) for call in calls]
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


def run_scripts(requests: Sequence[ScriptRequest], timeout: float,
                enough: Callable[[dict[int, Any]], bool]) -> tuple[dict[int, Any], list[Handle[Any]]]:
    """Run one script on each of several servers at once, from this thread alone; like `fan_out`.

    Threads cost more than they save here (each request is mostly Python work under one lock), so the request
    is written to an idle pooled connection of every server first, and the replies are read as they arrive
    (`select`). A reply is the script's answer, or the exception the server or network gave. A server with no
    idle connection (the first request, or after a failure) is served from a thread, so a stalled one never
    holds the caller past `timeout`. Replies still missing at the end are read in the background before their
    connection is reused; the returned handles complete then, so cleanup can be chained after each (`then`).
    """
    results: dict[int, Any] = {}
    handles: list[Handle[Any]] = []
    waiting: dict[Any, tuple[int, Any, Any, Future[Any]]] = {}   # socket -> (index, pool, connection, handle)
    threads: dict[Future[Any], int] = {}
    packed: dict[tuple[str, int, int], Any] = {}  # requests sharing their key and argument lists: packed once
    for i, request in enumerate(requests):
        pool = request.client.connection_pool
        conn = _idle_connection(pool)
        if conn is None:
            future = _POOL.submit(_call_script, request)
            threads[future] = i
            handles.append(future)
            continue
        handle: Future[Any] = Future()
        handles.append(handle)
        try:
            same = request.lua.sha, id(request.keys), id(request.args)
            command = packed.get(same)
            if command is None:
                command = packed[same] = conn.pack_command("EVALSHA", request.lua.sha, len(request.keys),
                                                           *request.keys, *request.args)
            conn.send_packed_command(command, check_health=False)
        except Exception as exc:
            pool.release(conn)
            results[i] = exc
            handle.set_result(exc)
            continue
        waiting[conn._sock] = (i, pool, conn, handle)
    deadline = time.monotonic() + timeout
    decided = False
    while waiting or threads:
        if not decided and enough(results):
            # Decided. Replies due any moment still get a short grace: a connection read now is free for the
            # next request, where one left to the background would send that request to a thread.
            decided = True
            deadline = min(deadline, time.monotonic() + _GRACE)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if waiting:
            ready, _, _ = select.select(list(waiting), [], [], min(remaining, 0.002) if threads else remaining)
        else:
            wait(list(threads), timeout=remaining, return_when=FIRST_COMPLETED)
            ready = []
        for sock in ready:
            i, pool, conn, handle = waiting.pop(sock)
            results[i] = _read_reply(pool, conn, requests[i])
            handle.set_result(results[i])
        for future in [f for f in threads if f.done()]:
            results[threads.pop(future)] = future.result()
    for i, pool, conn, handle in waiting.values():
        _POOL.submit(_drain, pool, conn, requests[i], handle)
    return results, handles


_GRACE = 0.002  # seconds


class ScriptRequest(NamedTuple):
    """One script call on one server, for `run_scripts`. Requests that share their `keys` and `args` lists
    (the same objects) carry the same command: it is encoded once."""

    client: Any
    lua: Any  # fencelock._scripts.Lua
    keys: list[str]
    args: list[Any]


def _idle_connection(pool: Any) -> Any:
    """An idle, connected connection of a plain redis-py pool, or None (then a thread serves the request).

    Only one already connected: connecting (and the client's handshake) to a stalled server would block here.
    """
    idle = getattr(pool, "_available_connections", None)
    if not idle or getattr(idle[-1], "_sock", None) is None:
        return None
    try:
        conn = pool.get_connection()
    except Exception:
        return None
    if getattr(conn, "_sock", None) is None:
        pool.release(conn)
        return None
    return conn


def _read_reply(pool: Any, conn: Any, request: ScriptRequest) -> Any:
    try:
        reply = conn.read_response()
    except Exception as exc:
        reply = exc
    finally:
        pool.release(conn)
    if isinstance(reply, NoScriptError):
        return _call_script(request)  # the server lost its script cache: EVAL it, which caches it again
    return reply


def _drain(pool: Any, conn: Any, request: ScriptRequest, handle: Future[Any]) -> None:
    handle.set_result(_read_reply(pool, conn, request))


def _call_script(request: ScriptRequest) -> Any:
    client = request.client
    try:
        try:
            return client.evalsha(request.lua.sha, len(request.keys), *request.keys, *request.args)
        except NoScriptError:
            return client.eval(request.lua.source, len(request.keys), *request.keys, *request.args)
    except Exception as exc:
        return exc


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


# -- bridges to a client library that runs its own threads (kazoo, for ZooKeeper) ----------------------------

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


def blocking(work: Callable[[], object], timeout: float) -> bool:
    """Run a blocking call in a daemon thread and wait at most `timeout` seconds for it (True: it finished)."""
    finished = threading.Event()

    def run() -> None:
        try:
            work()
        except Exception:
            pass
        finally:
            finished.set()

    threading.Thread(target=run, name="fencelock-blocking", daemon=True).start()
    return finished.wait(timeout)
