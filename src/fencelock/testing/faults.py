"""A TCP proxy that reads RESP, so that a test can fault one chosen request of a Redis client, deterministically.

The proxy counts the commands a client sends (a script call is named by its script: ``"release"``, ``"extend_many"``,
``"redlock_acquire"``...; any other command by its name: ``"blpop"``, ``"ping"``) and pairs each with its reply
(a connection answers in order). A `Rule` picks the k-th request that matches, counted from when the rule was
armed, and does one fault to it::

    with FaultProxy("127.0.0.1", server.port) as proxy:       # the client connects to proxy.port
        rule = proxy.arm(Rule(LOSE, "release"))               # the next release runs; its reply never comes
        ...
        rule.hit.wait(1)                                       # it happened (rule.at: when, by time.monotonic)
        proxy.clear()                                          # the fault ends; what it held back is delivered

The faults (`KINDS`): `LOSE` the reply (the connection stays open); `LATE`: the reply waits ``delay`` seconds,
then comes; `RESET_BEFORE`: the connection is reset, the request never reaches the server; `RESET_AFTER`: the
server runs the request, then (``delay`` seconds later) the connection is reset and the reply lost; `CLOSE`: the
server closed the idle connection just as the request came (FIN, not run); `PAUSE`: the server is paused across
the request for ``delay`` seconds (``on_pause``/``on_resume``, e.g. SIGSTOP/SIGCONT of the real server, else the
proxy holds the request back). `close_idle()` closes every connection that has no request in flight, as a
server's idle timeout or a load balancer does.

Another protocol's framing (`fencelock.testing.framing`: ZooKeeper's, etcd's HTTP) reads its requests and replies
instead: ``FaultProxy(host, port, framing=ZOOKEEPER)``. A streamed reply (HTTP chunks) keeps its connection busy
until it ends: `close_idle()` leaves it open, and the rest of a lost reply is lost with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import _scripts
from ._threaded import ThreadedServer
from .framing import Framing

__all__ = ["CLOSE", "KINDS", "LATE", "LOSE", "PAUSE", "RESET_AFTER", "RESET_BEFORE", "RESP", "FaultProxy",
           "Request", "Rule", "script_names"]

LOSE = "lose"
LATE = "late"
RESET_BEFORE = "reset_before"
RESET_AFTER = "reset_after"
CLOSE = "close"
PAUSE = "pause"
KINDS = (LOSE, LATE, RESET_BEFORE, RESET_AFTER, CLOSE, PAUSE)


def script_names() -> dict[bytes, str]:
    """Every fencelock script's SHA1 and source (as sent), mapped to its name."""
    found: dict[bytes, str] = {}
    for value in vars(_scripts).values():
        if isinstance(value, _scripts.Lua):
            found[value.sha.encode()] = value.name
            found[value.source.encode()] = value.name
    return found


_SCRIPTS = script_names()


@dataclass(frozen=True)
class Request:
    """One command a client sent: on which connection (numbered from 1), its name, when it arrived, and how many
    requests that connection carried before it (`index`)."""

    connection: int
    name: str
    args: tuple[bytes, ...]
    at: float
    index: int = 0


def request_name(args: list[bytes]) -> str:
    if not args:
        return ""
    command = args[0].decode(errors="replace").lower()
    if command in ("evalsha", "eval", "evalsha_ro", "eval_ro") and len(args) > 1:
        return _SCRIPTS.get(args[1], command)
    return command


@dataclass(eq=False)
class Rule:
    """Do `kind` to the `nth` request whose name matches `match` (an fnmatch pattern, or a predicate), counted
    from when the rule was armed (on `connection` only, if given). One rule fires once."""

    kind: str
    match: str | Callable[[Request], bool]
    nth: int = 1
    delay: float = 0.0
    connection: int | None = None
    on_pause: Callable[[], object] | None = None
    on_resume: Callable[[], object] | None = None
    on_hit: Callable[[Request], object] | None = None
    #: set when the rule fires (`at`, `request`); `done` when what it held back was delivered or dropped
    hit: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    at: float | None = None
    ended_at: float | None = None
    request: Request | None = None
    seen: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.nth < 1:
            raise ValueError(f"nth must be >= 1, got {self.nth!r}")

    def matches(self, request: Request) -> bool:
        if self.connection is not None and request.connection != self.connection:
            return False
        if callable(self.match):
            return bool(self.match(request))
        return fnmatch.fnmatchcase(request.name, self.match)

    def _end(self) -> None:
        if not self.done.is_set():
            self.ended_at = time.monotonic()
            self.done.set()


# -- RESP framing -----------------------------------------------------------------------------------------------

_AGGREGATES = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2, ord("|"): 2}
_BULK = {ord("$"), ord("!"), ord("=")}


async def _frames(reader: asyncio.StreamReader, framing: Framing) -> AsyncGenerator[tuple[int, bytes, Any], None]:
    """Each whole frame that arrives on `reader`: its number (from 0), its bytes and its parsed value, until the
    end of file."""
    buf = bytearray()
    index = 0
    while data := await reader.read(65536):
        buf += data
        while (found := framing.split(buf)) is not None:
            end, value = found
            raw = bytes(buf[:end])
            del buf[:end]
            yield index, raw, value
            index += 1


def parse_frame(buf: bytes | bytearray, pos: int = 0) -> tuple[int, Any] | None:
    """One RESP2/RESP3 value at `pos`: (end offset, value: bytes, or a list for aggregates), or None if more bytes
    are needed. Inline commands (a line of words) are read as a list too."""
    if pos >= len(buf):
        return None
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind = buf[pos]
    head = bytes(buf[pos + 1:line_end])
    after = line_end + 2
    if kind in _BULK:
        size = int(head)
        if size < 0:
            return after, None
        if len(buf) < after + size + 2:
            return None
        return after + size + 2, bytes(buf[after:after + size])
    if kind in _AGGREGATES:
        count = int(head)
        items: list[Any] = []
        for _ in range(max(0, count) * _AGGREGATES[kind]):
            found = parse_frame(buf, after)
            if found is None:
                return None
            after, item = found
            items.append(item)
        return after, items
    if kind in b"+-:_#,(":
        return after, head
    return after, bytes(buf[pos:line_end]).split()  # an inline command


class RespFraming(Framing):
    """Redis's RESP: script calls named by their script, other commands by their name; MOVED/ASK redirections
    point at the proxy in front of their server (`FaultProxy.redirects`)."""

    name = "resp"

    def split(self, buf: bytes | bytearray) -> tuple[int, Any] | None:
        return parse_frame(buf)

    def request(self, index: int, raw: bytes, value: Any) -> tuple[str, tuple[bytes, ...]]:
        args = [bytes(a) for a in value] if isinstance(value, list) else [bytes(value or b"")]
        return request_name(args), tuple(args)

    def rewrite(self, raw: bytes, redirects: dict[int, int]) -> bytes:
        """``-MOVED <slot> <host>:<port>``: the port of the proxy in front of that server, if there is one."""
        if not raw.startswith((b"-MOVED ", b"-ASK ")):
            return raw
        head, _, address = raw.rstrip(b"\r\n").rpartition(b" ")
        host, _, port = address.rpartition(b":")
        mapped = redirects.get(int(port)) if port.isdigit() else None
        if mapped is None:
            return raw
        return head + b" " + host + b":" + str(mapped).encode() + b"\r\n"


RESP = RespFraming()


# -- the proxy --------------------------------------------------------------------------------------------------

@dataclass(eq=False)
class _Pending:
    rule: Rule | None


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, number: int, client_w: asyncio.StreamWriter) -> None:
        self.number = number
        self.client_w = client_w
        self.server_w: asyncio.StreamWriter | None = None
        self.pending: deque[_Pending] = deque()
        self.to_server: asyncio.Queue[tuple[float, bytes, Rule | None]] = asyncio.Queue()
        self.to_client: asyncio.Queue[tuple[float, bytes, Rule | None]] = asyncio.Queue()
        self.last_up = 0.0     # the due time of the last chunk queued towards the server (order is kept)
        self.last_down = 0.0
        self.closed = False
        self.streaming = False  # a reply is still coming in parts (a watch): the connection is not idle
        self.dropping = False   # the reply those parts belong to was lost: they are lost too
        self.forwarding = 0    # chunks taken off a queue and not yet written


class FaultProxy(ThreadedServer):
    """Forward connections from ``host:port`` (a free loopback port) to ``target_host:target_port``, reading the
    requests and replies that pass (`framing`: RESP, or one of `fencelock.testing.framing`), and applying the armed
    `Rule`s. Every request is logged in `requests`."""

    def __init__(self, target_host: str, target_port: int, *, name: str = "faults", framing: Framing = RESP) -> None:
        super().__init__(name)
        self.target_host = target_host
        self.target_port = target_port
        self.framing = framing
        self.requests: list[Request] = []
        self.connections = 0
        #: server port -> the port of the proxy in front of it: a Cluster's MOVED/ASK redirections are rewritten
        #: with it, so that a client follows them through the proxies
        self.redirects: dict[int, int] = {}
        self._rules: list[Rule] = []
        self._fired: list[Rule] = []
        self._guard = threading.Lock()
        self._links: dict[int, _Link] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<FaultProxy {self.name} :{self.port} -> {self.target_host}:{self.target_port}>"

    # -- what a test calls (from any thread) ---------------------------------------------------------------------

    def arm(self, rule: Rule) -> Rule:
        """Apply `rule` to the requests that arrive from now on."""
        with self._guard:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Disarm every rule not fired yet. Faults under way run to their end (a late reply still comes)."""
        with self._guard:
            self._rules.clear()

    def names(self, since: float = 0.0) -> list[str]:
        """The names of the requests that arrived at or after `since` (time.monotonic), in order."""
        return [r.name for r in list(self.requests) if r.at >= since]

    def close_idle(self, timeout: float = 2.0) -> int:
        """Close (FIN) every connection with no request in flight, as a server's idle timeout does; returns how
        many were closed."""
        return int(self._call(self._close_idle(), timeout))

    def reset_all(self, timeout: float = 2.0) -> int:
        """Reset every connection (RST), whatever it was doing."""
        return int(self._call(self._reset_all(), timeout))

    # -- the loop thread -----------------------------------------------------------------------------------------

    def _connections(self) -> Iterable[asyncio.BaseTransport]:
        return [w.transport for link in self._links.values() for w in (link.client_w, link.server_w)
                if w is not None]

    async def _close_idle(self) -> int:
        closed = 0
        for link in list(self._links.values()):
            if not (link.pending or link.forwarding or link.streaming) and link.to_server.empty() \
                    and link.to_client.empty():
                closed += 1
                self._end(link, reset=False)
        return closed

    async def _reset_all(self) -> int:
        links = list(self._links.values())
        for link in links:
            self._end(link, reset=True)
        return len(links)

    def _end(self, link: _Link, *, reset: bool) -> None:
        """Close both sides: RST (abort) or FIN (close). Requests still held are dropped, and their rules end."""
        if link.closed:
            return
        link.closed = True
        self._links.pop(link.number, None)
        for writer in (link.client_w, link.server_w):
            if writer is None:
                continue
            if reset:
                writer.transport.abort()
            else:
                with contextlib.suppress(Exception):
                    if writer.can_write_eof():
                        writer.write_eof()
                writer.close()
        for entry in link.pending:
            if entry.rule is not None:
                entry.rule._end()
        for queue in (link.to_server, link.to_client):
            while not queue.empty():
                _, _, rule = queue.get_nowait()
                if rule is not None:
                    rule._end()

    def _choose(self, request: Request) -> Rule | None:
        with self._guard:
            self.requests.append(request)
            for rule in self._rules:
                if rule.matches(request):
                    rule.seen += 1
                    if rule.seen == rule.nth:
                        self._rules.remove(rule)
                        rule.request, rule.at = request, time.monotonic()
                        return rule
        return None

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        link = _Link(self.connections, client_w)
        self._links[link.number] = link
        try:
            server_r, server_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            self._end(link, reset=True)
            return
        link.server_w = server_w
        if link.closed:  # closed by close_idle while connecting
            server_w.transport.abort()
            return
        tasks = [asyncio.create_task(self._read_requests(link, client_r)),
                 asyncio.create_task(self._read_replies(link, server_r)),
                 asyncio.create_task(self._forward(link, link.to_server, server_w)),
                 asyncio.create_task(self._forward(link, link.to_client, client_w))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._end(link, reset=True)

    async def _read_requests(self, link: _Link, reader: asyncio.StreamReader) -> None:
        async with contextlib.aclosing(_frames(reader, self.framing)) as frames:
            async for index, raw, value in frames:
                request_name, args = self.framing.request(index, raw, value)
                request = Request(link.number, request_name, args, time.monotonic(), index)
                rule = self._choose(request)
                if rule is not None and rule.on_hit is not None:
                    rule.on_hit(request)
                if rule is not None:
                    rule.hit.set()
                kind = None if rule is None else rule.kind
                if kind == RESET_BEFORE:
                    rule._end()  # type: ignore[union-attr]
                    self._end(link, reset=True)
                    return
                if kind == CLOSE:
                    rule._end()  # type: ignore[union-attr]
                    self._end(link, reset=False)
                    return
                due = max(time.monotonic(), link.last_up)
                if kind == PAUSE:
                    assert rule is not None
                    due = await self._pause(rule, due)
                link.last_up = due
                link.pending.append(_Pending(rule if kind in (LOSE, LATE, RESET_AFTER) else None))
                held = rule if rule is not None and kind == PAUSE and rule.on_pause is None else None
                link.to_server.put_nowait((due, raw, held))

    async def _pause(self, rule: Rule, due: float) -> float:
        """The server pauses as the request arrives and resumes `delay` later; without hooks the request is held
        back that long instead."""
        if rule.on_pause is None:
            return due + rule.delay
        on_pause = rule.on_pause
        paused = asyncio.Event()

        async def pause_then_resume() -> None:
            # One task, not tied to the connection: the server resumes even if the client hangs up meanwhile.
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, on_pause)
                paused.set()
                await asyncio.sleep(rule.delay)
            finally:
                paused.set()
                try:
                    if rule.on_resume is not None:
                        await loop.run_in_executor(None, rule.on_resume)
                finally:
                    rule._end()

        task = asyncio.get_running_loop().create_task(pause_then_resume())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await paused.wait()
        return due

    async def _read_replies(self, link: _Link, reader: asyncio.StreamReader) -> None:
        async with contextlib.aclosing(_frames(reader, self.framing)) as frames:
            async for index, raw, value in frames:
                raw = self.framing.rewrite(raw, self.redirects)
                if not self.framing.is_reply(index, raw, value):  # the server's own message: it answers nothing
                    if self.framing.continues(value):  # or the rest of the reply before it
                        link.streaming = self.framing.streaming(value)
                        if link.dropping:
                            continue
                    link.last_down = max(time.monotonic(), link.last_down)
                    link.to_client.put_nowait((link.last_down, raw, None))
                    continue
                rule = link.pending.popleft().rule if link.pending else None
                kind = None if rule is None else rule.kind
                link.streaming = self.framing.streaming(value)
                link.dropping = kind == LOSE
                due = max(time.monotonic(), link.last_down)
                if kind == LOSE:
                    rule._end()  # type: ignore[union-attr]
                    continue
                if kind == RESET_AFTER:
                    assert rule is not None
                    if rule.delay > 0:
                        await asyncio.sleep(rule.delay)
                    rule._end()
                    self._end(link, reset=True)
                    return
                if kind == LATE:
                    assert rule is not None
                    due += rule.delay
                link.last_down = due
                link.to_client.put_nowait((due, raw, rule))

    async def _forward(self, link: _Link, queue: asyncio.Queue[tuple[float, bytes, Rule | None]],
                       writer: asyncio.StreamWriter) -> None:
        while True:
            due, data, rule = await queue.get()
            link.forwarding += 1
            try:
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            except OSError:
                return
            finally:
                link.forwarding -= 1
                if rule is not None:
                    rule._end()  # delivered, or dropped with its connection
