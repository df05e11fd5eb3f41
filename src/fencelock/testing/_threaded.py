"""A TCP server on a free loopback port, run by an asyncio loop in a daemon thread of its own.

The proxies (`proxy`, `faults`) and the lab's resource are this shape: they keep serving while the caller sleeps or
blocks, and `close()` leaves no socket open.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from ._harness import Harness

__all__ = ["START_TIMEOUT", "ThreadedServer", "wind_down"]

#: Seconds `ThreadedServer.start` waits for the listening socket, and `close` for the thread to end.
START_TIMEOUT = 5.0

T = TypeVar("T")
S = TypeVar("S", bound="ThreadedServer")


async def wind_down(server: asyncio.Server, transports: Callable[[], Iterable[asyncio.BaseTransport]],
                    timeout: float = 2.0) -> None:
    """End a server so that no socket is left open, from inside its running loop: stop accepting, then abort every
    connection and let every task finish by itself (a connection accepted a moment ago still reaches its
    handler, which must abort it at once when it sees the server closing), and only then cancel what is left."""
    server.close()
    me = asyncio.current_task()
    deadline = time.monotonic() + timeout
    while True:
        for transport in list(transports()):
            abort: Any = getattr(transport, "abort", transport.close)
            abort()
        pending = asyncio.all_tasks() - {me}
        if not pending or time.monotonic() >= deadline:
            break
        await asyncio.wait(pending, timeout=0.05)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    # A connection accepted as the server closed can be left with its protocol never told (connection_made not
    # run, so no handler to abort it); the loop still knows it by its file descriptor.
    known: Any = getattr(asyncio.get_running_loop(), "_transports", {})
    for transport in list(known.values()):
        if not transport.is_closing():
            transport.abort()
    await asyncio.sleep(0.01)  # let the aborted transports finish closing


class ThreadedServer(Harness):
    """Accept connections on ``host:port`` (a free loopback port, known once started) and serve each with
    `_serve` on the loop thread; `close()` stops accepting and aborts every transport `_connections()` names.
    Idempotent close; a connection that arrives while closing is aborted before `_serve` sees it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.host = "127.0.0.1"
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._closing = False

    @property
    def started(self) -> bool:
        return self._thread is not None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _connections(self) -> Iterable[asyncio.BaseTransport]:
        """Every transport still open, for `close()` to abort."""
        raise NotImplementedError

    def start(self: S) -> S:
        """Start the loop thread and wait (at most `START_TIMEOUT`) until it listens."""
        self._thread = threading.Thread(target=self._run, name=f"fencelock-{self.name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT) or self._server is None:
            raise RuntimeError(f"{self.name}: did not start listening within {START_TIMEOUT:g} s")
        self._live()
        return self

    def close(self) -> None:
        """Stop listening and cut every connection. Idempotent."""
        loop, self._loop = self._loop, None
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            if self._thread is not None:
                self._thread.join(START_TIMEOUT)
        self._gone()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `coro` on the loop thread and wait (at most `timeout`) for its result."""
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"{self.name} is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- the loop thread -------------------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(asyncio.start_server(self._accept, self.host, 0))
            self.port = int(self._server.sockets[0].getsockname()[1])
            self._ready.set()
            loop.run_forever()  # until `_shutdown` has closed every connection
        finally:
            self._ready.set()
            loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            writer.transport.abort()
            return
        await self._serve(reader, writer)

    async def _shutdown(self) -> None:
        self._closing = True
        try:
            assert self._server is not None
            await wind_down(self._server, self._connections)
        finally:
            asyncio.get_running_loop().stop()
