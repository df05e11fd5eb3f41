"""A TCP proxy on a loopback port that delays or stalls what passes through it, for fault injection.

There is no `tc netem` in this kernel and no toxiproxy server to install, so the lab and the tests put this proxy
between a client and a server::

    with Proxy("127.0.0.1", server.port) as proxy:   # clients connect to proxy.port instead
        proxy.delay = 0.8      # every byte that arrives from now on is forwarded 0.8 s later, in order
        proxy.stall()          # nothing passes either way; connections stay open (a partition, not a reset)
        proxy.heal()           # what open connections held back is delivered, as TCP would after a partition
                               # heals; a connection its client closed or reset meanwhile is dropped with it

It runs its own asyncio loop in a daemon thread (`ThreadedServer`), so it keeps forwarding while the caller sleeps or
blocks.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable

from ._threaded import START_TIMEOUT as START_TIMEOUT
from ._threaded import ThreadedServer, wind_down

__all__ = ["Proxy", "wind_down"]


class Proxy(ThreadedServer):
    """Forward connections from ``host:port`` (a free loopback port) to ``target_host:target_port``.

    ``delay`` (seconds, settable at any time) applies to bytes read after it was set, in both directions by default
    (``delay_replies=False`` delays only what the client sends). ``stall()`` holds back every byte until ``heal()``;
    a connection whose client hangs up while stalled is dropped with what it held back.
    """

    def __init__(self, target_host: str, target_port: int, *, delay: float = 0.0, delay_replies: bool = True,
                 name: str = "proxy") -> None:
        super().__init__(name)
        self.target_host = target_host
        self.target_port = target_port
        self.delay = delay
        self.delay_replies = delay_replies
        self._open = threading.Event()          # set: bytes flow; clear: stalled
        self._open.set()
        self._writers: set[asyncio.StreamWriter] = set()
        #: connections accepted so far
        self.connections = 0
        #: bytes read from clients so far (a test can wait until what it sent has reached the proxy)
        self.received = 0
        self._holding: dict[int, int] = {}      # a client->server pump's id: chunks read, not yet forwarded

    def __repr__(self) -> str:
        state = "stalled" if self.stalled else f"delay={self.delay:g}s"
        return f"<Proxy {self.name} :{self.port} -> {self.target_host}:{self.target_port} {state}>"

    @property
    def stalled(self) -> bool:
        return not self._open.is_set()

    def stall(self) -> None:
        """From now on nothing passes, either way; what arrives is held back."""
        self._open.clear()

    def heal(self) -> None:
        """Let bytes pass again, the held-back ones first."""
        self._open.set()

    @property
    def held_back(self) -> int:
        """Chunks that clients sent and the server has not been given yet (0: nothing is on its way)."""
        return sum(list(self._holding.values()))

    def _connections(self) -> Iterable[asyncio.BaseTransport]:
        return [w.transport for w in self._writers]

    # -- the loop thread -------------------------------------------------------------------------------------

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            self._writers.discard(client_w)
            client_w.transport.abort()
            return
        self._writers.add(server_w)
        pumps = [asyncio.create_task(self._pump(client_r, server_w, True, from_client=True)),
                 asyncio.create_task(self._pump(server_r, client_w, self.delay_replies))]
        try:
            # When either side is done (hung up, or its last bytes delivered), the connection is over.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the proxy is closing
        finally:
            for pump in pumps:
                pump.cancel()
            for writer in (client_w, server_w):
                self._writers.discard(writer)
                writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool, *,
                    from_client: bool = False) -> None:
        """Read as it comes; forward each chunk at (arrival + delay), in order, and only while not stalled."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        me = id(queue)

        async def forward() -> None:
            while True:
                due, data = await queue.get()
                while True:
                    wait = due - time.monotonic()
                    if self._open.is_set() and wait <= 0:
                        break
                    await asyncio.sleep(min(max(wait, 0.002), 0.01))
                if not data:
                    writer.write_eof() if writer.can_write_eof() else writer.close()
                    return
                writer.write(data)
                if from_client:
                    self._holding[me] -= 1
                await writer.drain()

        sender = asyncio.create_task(forward())
        try:
            while True:
                data = await reader.read(65536)
                if not data and self.stalled:
                    break  # the peer gave up during a partition: what it sent never arrives
                queue.put_nowait((time.monotonic() + (self.delay if delayed else 0.0), data))
                if from_client:
                    self.received += len(data)
                    self._holding[me] = self._holding.get(me, 0) + (1 if data else 0)
                if not data:
                    await sender
                    break
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not sender.done():
                sender.cancel()
            self._holding.pop(me, None)  # a connection that ends takes what it held back with it
