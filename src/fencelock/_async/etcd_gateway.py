"""A client of etcd's v3 JSON gateway: failover between members, auth, leases, keep-alive, watch.

Every httpx error and every error etcd answers with becomes a `BackendError` here, at this one boundary. Why a
client of our own, over httpx: docs/design/etcd.md.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
from collections.abc import Callable
from typing import Any

from .._errors import MissingExtra

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingExtra("etcd:// URLs need httpx, which the etcd extra installs: pip install 'fencelock[etcd]'") \
        from exc

from .._errors import BackendError, unsent
from .._etcd.rules import GRANT_TRIES, b64, granted, number, range_end, unb64
from .._etcd.txn import Body
from .._etcd.url import EtcdTarget
from .._logic.admission import Admission, Urgency, turn_wait
from .._logic.timing import Clock, lease_clock
from ._concurrency import Signal, now

KEEPALIVE_BATCH = 32
"""Leases refreshed by one keep-alive request. The gateway may answer only the first part of a longer request
(docs/design/etcd.md); the leases it did not answer are sent again."""

MAX_IN_FLIGHT = 8
"""Requests one client has out at once (watches apart: each waiter's watch keeps a connection of its own while it
blocks). More wait their turn in the client (`_logic.admission`): renewals first, then the requests of attempts
whose lease runs, then releases, then new grants; so no burst of callers opens a connection each, starves a held
lease's renewals, or has a lease granted long before its key can be put (decision 2026-12-05-etcd-burst). Few: a
request's CPU in the client, not the server, bounds one client's rate, and httpx's pool costs more per request the
more connections it holds (measured in the decision)."""

QUEUE_TIMEOUT = 30.0
"""Seconds a request waits at most for its turn among `MAX_IN_FLIGHT`; then it fails with a `BackendError` saying
that too many requests went through one client at once (nothing was sent)."""

_TRANSIENT_CODES = {4, 14}
"""gRPC codes etcd gives while it has no leader or cannot commit in time: DEADLINE_EXCEEDED, UNAVAILABLE."""

_LEASE_GONE = "requested lease not found"
_LEASE_EXISTS = "lease already exists"


class EtcdAnswer(Exception):
    """An error etcd answered with (the `__cause__` of the `BackendError` raised for it)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def tls_context(target: EtcdTarget) -> ssl.SSLContext:
    """The TLS context of an `etcds://` URL. A file option that names no readable file, or a file that holds no
    certificate (or key), is a ValueError naming the option: raised at `connect()`, before anything is sent."""
    files = {"ssl_ca_certs": target.ssl_ca_certs, "ssl_certfile": target.ssl_certfile,
             "ssl_keyfile": target.ssl_keyfile}
    for option, path in files.items():
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ValueError(f"url {target.shown!r}: {option} names a file that cannot be read "
                             f"({exc.strerror or type(exc).__name__})") from None
    try:
        context = ssl.create_default_context(cafile=target.ssl_ca_certs)
    except ssl.SSLError as exc:
        raise ValueError(f"url {target.shown!r}: ssl_ca_certs holds no certificate that can be read "
                         f"({exc.reason or exc})") from None
    if target.ssl_certfile:
        try:
            context.load_cert_chain(target.ssl_certfile, target.ssl_keyfile)
        except ssl.SSLError as exc:
            raise ValueError(f"url {target.shown!r}: ssl_certfile and ssl_keyfile hold no certificate and key "
                             f"that can be read ({exc.reason or exc})") from None
    return context


class _Turn:
    """A request waiting for its turn (`AsyncGateway._enter`): `handed` once `_leave` passed it a turn."""

    __slots__ = ("handed", "signal")

    def __init__(self) -> None:
        self.signal = Signal()
        self.handed = False


class AsyncGateway:
    """HTTP requests to the members' JSON gateways: failover between endpoints, auth, and the error boundary."""

    def __init__(self, target: EtcdTarget, clock: Clock = lease_clock) -> None:
        self._verify: ssl.SSLContext | bool = tls_context(target) if target.tls else True
        self._transport, self._http = self._connections(target)
        self._clock = clock  # the client's: a request's sending is taken on it
        self._admission: Admission[_Turn] = Admission(MAX_IN_FLIGHT)
        self._admission_lock = threading.Lock()  # (never held across an await)
        self._pid = os.getpid()
        self._closed = False
        self.keepalive_requests = 0
        self._target = target
        self._endpoints = target.endpoints
        self._current = 0
        self._auth: str | None = None  # the token /v3/auth/authenticate gave (never shown)
        self.shown = "etcd at " + ",".join(endpoint.split("://", 1)[1] for endpoint in target.endpoints)

    def _connections(self, target: EtcdTarget) -> tuple[httpx.AsyncHTTPTransport, httpx.AsyncClient]:
        # One connection per watching waiter: no pool limit that would make waiters queue for a connection. The other
        # requests are at most `MAX_IN_FLIGHT` at once (`_enter`): the connections they use are all kept for reuse.
        transport = httpx.AsyncHTTPTransport(
            verify=self._verify, limits=httpx.Limits(max_connections=None, max_keepalive_connections=MAX_IN_FLIGHT))
        return transport, httpx.AsyncClient(timeout=httpx.Timeout(target.timeout), transport=transport,
                                            trust_env=False)

    def _client(self) -> httpx.AsyncClient:
        """The connection pool of this process. A forked child gets a pool of its own: the sockets it inherited
        are its parent's, and two processes writing and reading one socket get each other's answers. They are
        left alone, never closed from here (a close could end the parent's TLS session)."""
        self._own()
        return self._http

    def _own(self) -> None:
        """A forked child starts with a pool and a count of requests out of its own (its parent's are not its)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._transport, self._http = self._connections(self._target)
            self._admission, self._admission_lock = Admission(MAX_IN_FLIGHT), threading.Lock()

    async def _enter(self, urgency: Urgency, what: str, name: str | None) -> None:
        """Wait for this request's turn among `MAX_IN_FLIGHT` (`_logic.admission`); every `_enter` that returns is
        followed by one `_leave`. A request whose turn does not come within `QUEUE_TIMEOUT`, or whose client closes
        first, fails here, and nothing is sent."""
        self._own()
        turn = _Turn()
        with self._admission_lock:
            if self._closed:
                raise unsent(BackendError(f"{what} failed on {self.shown}: this client is closed", name=name))
            if self._admission.enter(turn, urgency):
                return
            others = self._admission.waiting - 1
        limit = turn_wait(QUEUE_TIMEOUT, self.timeout, now())
        try:
            await turn.signal.wait(limit)
        except BaseException:
            if self._stop_waiting(turn):
                self._leave()  # (its turn came as its caller gave up: it passes on)
            raise
        if self._stop_waiting(turn):
            if not self._closed:
                return  # (its turn may have come just as its wait timed out: it goes)
            self._leave()  # (handed a turn as the client closed: it passes on)
        if self._closed:
            raise unsent(BackendError(f"{what} failed on {self.shown}: this client is closed", name=name))
        raise unsent(BackendError(
            f"{what} failed on {self.shown}: its turn among this client's {MAX_IN_FLIGHT} requests at once did not "
            f"come within {limit:.3g} s ({others} others were waiting when it came); nothing was sent: too many "
            "requests at once through one client", name=name))

    def _stop_waiting(self, turn: _Turn) -> bool:
        """True if `turn` was handed its turn; else it is taken out of line (it will not go)."""
        with self._admission_lock:
            self._admission.withdraw(turn)
            return turn.handed

    def _leave(self) -> None:
        """A request that had its turn is done: the next one waiting has it now."""
        with self._admission_lock:
            following = self._admission.done()
            if following is not None:
                following.handed = True
        if following is not None:
            following.signal.set()

    @property
    def endpoints(self) -> int:
        return len(self._endpoints)

    @property
    def timeout(self) -> float:
        """Seconds one request may take (the URL's `?timeout=`)."""
        return self._target.timeout

    def _failed(self, exc: Exception, what: str, name: str | None) -> BackendError:
        return BackendError(f"{what} failed on {self.shown}: {type(exc).__name__}: {exc}", name=name)

    def _headers(self) -> dict[str, str]:
        return {} if self._auth is None else {"Authorization": self._auth}

    async def _post(self, path: str, content: bytes, what: str, name: str | None,
                    timeout: float | None = None, again: bool = True) -> httpx.Response:
        """POST to the current endpoint; a refused connection (nothing sent) moves on to the next one, and with
        `again` a connection the server closed before it answered is sent once more (every request fencelock
        sends may be repeated: `call`). `timeout` (seconds) replaces the URL's request timeout for this request."""
        response: httpx.Response | None = None
        try:
            try:
                response = await self._post_once(path, content, what, name, timeout)
            except BackendError as exc:
                if not (again and self.unanswered(exc)):
                    raise
                response = await self._post_once(path, content, what, name, timeout)
            return response
        finally:
            if self._closed:
                await self._close_after(response)

    async def _post_once(self, path: str, content: bytes, what: str, name: str | None,
                         timeout: float | None) -> httpx.Response:
        limit: Any = httpx.USE_CLIENT_DEFAULT if timeout is None else httpx.Timeout(timeout)
        for tried in range(len(self._endpoints)):
            endpoint = self._endpoints[self._current]
            try:
                return await self._client().post(endpoint + path, content=content, headers=self._headers(),
                                             timeout=limit)
            except RuntimeError as exc:  # httpx: the client has been closed
                raise self._failed(exc, what, name) from exc
            except httpx.ConnectError as exc:
                self._current = (self._current + 1) % len(self._endpoints)
                if tried == len(self._endpoints) - 1:  # refused everywhere: nothing was sent
                    raise unsent(self._failed(exc, what, name)) from exc
            except (httpx.HTTPError, httpx.StreamError) as exc:
                # It may have been sent: the caller decides whether to try again (on the next member).
                self._current = (self._current + 1) % len(self._endpoints)
                raise self._failed(exc, what, name) from exc
        raise AssertionError("unreachable")

    async def call(self, path: str, body: dict[str, Any], what: str, name: str | None,
                   accept: tuple[str, ...] = (), timeout: float | None = None,
                   urgency: Urgency = Urgency.NEW, again: bool = True) -> dict[str, Any]:
        """One unary request, once its turn comes (`urgency`: its place in line, `_enter`). An etcd error whose
        message contains one of `accept` comes back as `{"error": message}`; any other raises `BackendError`.
        `timeout` (seconds) replaces the URL's request timeout for each request this makes. `again=False`: a
        request whose outcome a second sending would hide (a delete) is not sent again when the server closed the
        connection before answering (`unanswered`)."""
        return (await self.call_sent(path, body, what, name, accept, timeout, urgency, again))[0]

    async def call_sent(self, path: str, body: dict[str, Any], what: str, name: str | None,
                        accept: tuple[str, ...] = (), timeout: float | None = None,
                        urgency: Urgency = Urgency.NEW, again: bool = True) -> tuple[dict[str, Any], float]:
        """`call`, and the instant (on the client's clock) its request went out: taken when its turn came, before
        anything was written, so the server received it later (never earlier)."""
        content = json.dumps(body).encode()
        await self._enter(urgency, what, name)
        try:
            sent_at = self._clock()
            return await self._call_once(path, content, what, name, accept, timeout, again), sent_at
        finally:
            self._leave()

    async def _call_once(self, path: str, content: bytes, what: str, name: str | None, accept: tuple[str, ...],
                         timeout: float | None, again: bool) -> dict[str, Any]:
        if self._target.username is not None and self._auth is None:
            await self._authenticate(name, timeout)
        for attempt in range(2):
            response = await self._post(path, content, what, name, timeout, again)
            data = self._decode(response, what, name)
            error = data.get("error")
            if error is None:
                return data
            message = str(data.get("message") or error)
            if any(text in message for text in accept):
                return {"error": message}
            if attempt == 0 and self._target.username is not None and "auth token" in message:
                self._auth = None  # the server forgot it (restart, expiry): log in again, once
                await self._authenticate(name, timeout)
                continue
            cause = EtcdAnswer(number(data.get("code")), message)
            raise BackendError(f"{what} failed on {self.shown}: {message}", name=name) from cause
        raise AssertionError("unreachable")

    def _decode(self, response: httpx.Response, what: str, name: str | None) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError as exc:
            raise BackendError(f"{what} failed on {self.shown}: HTTP {response.status_code} without a JSON body",
                               name=name) from exc
        if not isinstance(data, dict):
            raise BackendError(f"{what} failed on {self.shown}: unexpected answer", name=name)
        if response.status_code != 200 and "error" not in data:
            data = {"error": f"HTTP {response.status_code}", "code": data.get("code", 0)}
        return data

    async def _authenticate(self, name: str | None, timeout: float | None = None) -> None:
        body = json.dumps({"name": self._target.username, "password": self._target.password}).encode()
        data = self._decode(await self._post("/v3/auth/authenticate", body, "authentication", name, timeout),
                            "authentication", name)
        if "error" in data or not data.get("token"):
            # etcd's own message ("authentication failed, invalid user ID or password") names no secret
            message = str(data.get("message") or data.get("error") or "no token")
            raise BackendError(f"authentication as {self._target.username!r} failed on {self.shown}: {message}",
                               name=name) from EtcdAnswer(number(data.get("code")), message)
        self._auth = str(data["token"])

    def unanswered(self, exc: BackendError) -> bool:
        """Whether the server closed the connection before any answer (an idle connection's close racing the
        request, or a server that turned a new connection away): most likely not run, but not surely."""
        return isinstance(exc.__cause__, httpx.RemoteProtocolError)

    def transient(self, exc: BackendError) -> bool:
        """Whether a failed request may succeed if sent again: a network fault, or a cluster between leaders."""
        cause = exc.__cause__
        return isinstance(cause, httpx.TransportError) or (
            isinstance(cause, EtcdAnswer) and cause.code in _TRANSIENT_CODES)

    async def txn(self, body: Body, what: str, name: str | None, urgency: Urgency, again: bool = True) -> Body:
        """One transaction (`fencelock._etcd.txn` builds its body); `again` as `call`'s."""
        return await self.call("/v3/kv/txn", body, what, name, urgency=urgency, again=again)

    async def read(self, body: Body, what: str, name: str | None) -> Body:
        """One range request (`fencelock._etcd.txn` builds its body): an operator's, new work."""
        return await self.call("/v3/kv/range", body, what, name)

    # ------------------------------------------------------------------------------------------ leases

    async def grant(self, seconds: int, name: str, urgency: Urgency) -> tuple[int, int, float]:
        """A new lease of `seconds`, whose ID the server chooses: (its ID, the TTL granted, the instant the grant
        that made it went out: the server's TTL began no earlier).

        Never retried as "the same lease" (`fencelock._etcd.rules.granted` says why): a grant whose answer is lost
        leaves an orphan lease, with no key, that its TTL ends. "lease already exists" means the server chose the ID
        of a lease another client granted with an ID of its own: not ours, so ask again (`GRANT_TRIES` in all).
        """
        for _ in range(GRANT_TRIES):
            data, sent_at = await self.call_sent("/v3/lease/grant", {"ID": 0, "TTL": seconds}, "lease grant", name,
                                                 accept=(_LEASE_EXISTS,), urgency=urgency)
            if "error" in data:
                continue  # another client's lease: the next grant gets a new ID
            lease = granted(data, seconds)
            if lease is None:
                raise BackendError(f"lease grant failed on {self.shown}: the answer names no lease", name=name)
            return lease[0], lease[1], sent_at
        message = (f"lease grant failed on {self.shown}: {GRANT_TRIES} times the server chose the ID of "
                   "a lease that already exists (another client grants leases with IDs it picks itself)")
        raise BackendError(message, name=name) from EtcdAnswer(9, _LEASE_EXISTS)

    async def revoke(self, lease: int, name: str | None, timeout: float | None = None,
                     urgency: Urgency = Urgency.RELEASE) -> None:
        """End a lease, which deletes every key on it; a lease the server no longer has is not an error."""
        await self.call("/v3/lease/revoke", {"ID": lease}, "revoke", name, accept=(_LEASE_GONE,), timeout=timeout,
                        urgency=urgency)

    async def time_to_live(self, lease: int, name: str) -> float:
        """Whole seconds left of a lease's TTL (0: it is gone)."""
        data = await self.call("/v3/lease/timetolive", {"ID": lease}, "status", name)
        return float(max(0, number(data.get("TTL"))))

    async def keepalive(self, leases: list[int], name: str | None,
                        urgency: Urgency = Urgency.RENEWAL) -> tuple[dict[int, int], float]:
        """Refresh leases, `KEEPALIVE_BATCH` per request; returns each lease's TTL now (0: the server no longer
        has it), and the instant the first request went out (every lease's TTL restarted no earlier). A lease the
        gateway left unanswered is sent again: a missing answer never counts as "gone"."""
        ttls: dict[int, int] = {}
        left = list(dict.fromkeys(leases))
        first: float | None = None
        while left:
            await self._enter(urgency, "keep-alive", name)
            try:
                sent_at = self._clock()
                answered = await self._keepalive_once(left[:KEEPALIVE_BATCH], name)
            finally:
                self._leave()
            first = sent_at if first is None else first
            if not answered:
                raise BackendError(f"keep-alive got no answer from {self.shown}", name=name)
            ttls.update(answered)
            left = [lease for lease in left if lease not in ttls]
        return ttls, self._clock() if first is None else first

    async def _keepalive_once(self, leases: list[int], name: str | None) -> dict[int, int]:
        """One keep-alive request (its turn came); the TTL of each lease it answered for."""
        self.keepalive_requests += 1
        content = b"".join(json.dumps({"ID": lease}).encode() for lease in leases)
        if self._target.username is not None and self._auth is None:
            await self._authenticate(name)
        response = await self._post("/v3/lease/keepalive", content, "keep-alive", name)
        ttls: dict[int, int] = {}
        for line in response.text.splitlines():
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError as exc:
                raise BackendError(f"keep-alive failed on {self.shown}: an answer that is not JSON",
                                   name=name) from exc
            if "error" in data:
                error = data["error"]
                message = str(error.get("message") if isinstance(error, dict) else error)
                if "auth token" in message:
                    self._auth = None  # the next call logs in again
                code = number(error.get("grpc_code") or error.get("code")) if isinstance(error, dict) else 0
                raise BackendError(f"keep-alive failed on {self.shown}: {message}", name=name) \
                    from EtcdAnswer(code, message)
            result = data.get("result", {})
            ttls[number(result.get("ID"))] = number(result.get("TTL"))
        return {lease: ttls[lease] for lease in leases if lease in ttls}

    async def server_version(self) -> str | None:
        """The version of the member that answers (`GET /version`); None if it cannot be read (best effort: no
        error leaves this call)."""
        response: httpx.Response | None = None
        try:
            await self._enter(Urgency.NEW, "version", None)
        except BackendError:
            return None
        try:
            response = await self._client().get(self._endpoints[self._current] + "/version")
            data = response.json()
            return str(data["etcdserver"]) if isinstance(data, dict) and data.get("etcdserver") else None
        except (httpx.HTTPError, httpx.StreamError, ValueError, RuntimeError):
            return None
        finally:
            self._leave()
            if self._closed:
                await self._close_after(response)

    async def watch_deletes(self, directory: bytes, start_revision: int, quiet: float,
                            deleted: Callable[[bytes, int], None]) -> bool:
        """Watch the deletes of every key under `directory` from `start_revision` on, calling `deleted(key,
        revision)` for each, in order, until the stream stays silent for `quiet` seconds after etcd confirmed the
        watch (True: every delete up to the last one passed on was seen; a new watch may go on after it), or until
        anything else ends it (False: a fault, a cancelled watch such as compacted history, a closed client).

        One connection for every waiter of a name (`etcd_waiting.AsyncSharedWatches`), not counted among
        `MAX_IN_FLIGHT`."""
        request = {"create_request": {"key": b64(directory), "range_end": b64(range_end(directory)),
                                      "start_revision": start_revision, "filters": ["NOPUT"]}}
        endpoint = self._endpoints[self._current]
        timeout = httpx.Timeout(self._target.timeout, read=max(quiet, 0.001))
        opened: httpx.Response | None = None
        created = False
        try:
            async with self._client().stream("POST", endpoint + "/v3/watch", content=json.dumps(request).encode(),
                                             headers=self._headers(), timeout=timeout) as response:
                opened = response
                if response.status_code != 200:
                    return False
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result")
                    if not isinstance(result, dict) or result.get("canceled"):
                        return False
                    created = created or bool(result.get("created"))
                    for event in result.get("events") or ():
                        kv = event.get("kv") or {}
                        deleted(unb64(kv.get("key")), number(kv.get("mod_revision")))
            return False
        except httpx.ReadTimeout:
            return created and not self._closed
        except (httpx.HTTPError, httpx.StreamError, ValueError, RuntimeError):
            return False
        finally:
            if self._closed:
                await self._close_after(opened)

    async def _close_after(self, response: httpx.Response | None) -> None:
        """Closed while a request was out (a background cleanup): close the connection it used too, and whatever
        the pool made meanwhile. The pool's own close cannot reach a connection that was still connecting when it
        closed (it had no socket yet, and the pool forgets it), so the request's answer names its socket."""
        stream = None if response is None else response.extensions.get("network_stream")
        if stream is not None:
            await stream.aclose()
        await self._transport.aclose()

    async def aclose(self) -> None:
        with self._admission_lock:
            self._closed = True
            waiting = self._admission.close()
        for turn in waiting:
            turn.signal.set()  # (each fails in `_enter`: nothing more is sent)
        await self._client().aclose()  # (a forked child's own pool: its parent's sockets are not its to close)
