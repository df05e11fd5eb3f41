# Generated from _async/etcd.py by scripts/unasync.py: do not edit, edit that file instead.
"""The etcd backend: locks as etcd's `concurrency.Mutex` keeps them, over etcd's v3 JSON gateway.

The layout of the keys and every decision (who holds, what an answer means, the TTL mapping) are in
`fencelock._logic.etcd`; this module carries requests. Every httpx error and every error etcd answers with is
turned into `BackendError` here, in `_Gateway`, at this one boundary.

Why this client: it is a thin one of our own, on etcd's JSON gateway (`/v3/kv/range`, `/v3/kv/txn`,
`/v3/lease/grant`, `/v3/lease/keepalive`, `/v3/lease/revoke`, `/v3/lease/timetolive`, `/v3/watch`), which every
etcd since 3.4 serves on its client port, over httpx:

- httpx's `Client` and `Client` have one API, so this file is the one source of both the asyncio and the
  synchronous backend (`scripts/unasync.py` generates `_sync/etcd.py`), as for Redis;
- no grpc or protobuf: the python `etcd3` package no longer works with current protobuf, and the gRPC-based
  asyncio clients (`aetcd`, `etcd3aio`) pin them and are asyncio-only, so the synchronous front end would need a
  second client with its own errors and timeouts;
- the gateway streams a watch as one JSON line per event on one HTTP response, and takes several keep-alives in
  one request body (one line each in the answer), which is all a lock needs: a waiter watches one key for as long
  as it may block (the read timeout ends the watch), and the watchdog refreshes a batch of leases in one request.

Keys and values are base64 on the gateway, 64-bit numbers come back as strings, and zero fields are left out.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from .._errors import MissingExtra

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingExtra("etcd:// URLs need httpx, which the etcd extra installs: pip install 'fencelock[etcd]'") \
        from exc

from .._errors import BackendError
from .._logic.etcd import (
    BLOCK_CAP,
    GRANT_TRIES,
    MAX_TXN_OPS,
    SCAN_PAGE,
    EtcdTarget,
    Kv,
    Verdict,
    b64,
    fence_key,
    granted,
    keepalive_suffices,
    kvs,
    lease_seconds,
    lock_key,
    name_dir,
    name_of,
    number,
    range_end,
    released,
    retry_after,
    verdict,
)
from .._logic.outcomes import Attempt, Released
from .._logic.status import LockStatus
from .._logic.timing import Deadline

SPARE_LEASES = 16
"""Leases a client keeps, per TTL, from acquisitions it released, for its next acquisitions: a spare lease needs a
keep-alive (the leader answers it without a disk write) where a new one needs a grant (a raft write and an fsync).
"""

KEEPALIVE_BATCH = 32
"""Leases refreshed by one keep-alive request. The gateway may answer only the first part of a longer request
(docs/design/etcd.md); the leases it did not answer are sent again."""

CLOSE_TIMEOUT = 0.5
"""Seconds `close()` spends at most revoking the spare leases (keyless leases kept for reuse). A stalled or
unreachable server does not make `close()` wait for a request timeout: the leases it did not revoke end by their
TTL."""

RENEWAL_BATCH = 1000
"""Leases of one watchdog batch handled together: keep-alive requests, then transactions checking their keys."""

_TRANSIENT_CODES = {4, 14}
"""gRPC codes etcd gives while it has no leader or cannot commit in time: DEADLINE_EXCEEDED, UNAVAILABLE."""

_LEASE_GONE = "requested lease not found"
_LEASE_EXISTS = "lease already exists"


class EtcdAnswer(Exception):
    """An error etcd answered with (the `__cause__` of the `BackendError` raised for it)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Gateway:
    """HTTP requests to the members' JSON gateways: failover between endpoints, auth, and the error boundary."""

    def __init__(self, target: EtcdTarget) -> None:
        verify: ssl.SSLContext | bool = True
        if target.tls:
            verify = ssl.create_default_context(cafile=target.ssl_ca_certs)
            if target.ssl_certfile:
                verify.load_cert_chain(target.ssl_certfile, target.ssl_keyfile)
        # One connection per watching waiter: no pool limit that would make waiters queue for a connection.
        self._transport = httpx.HTTPTransport(
            verify=verify, limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
        self._http = httpx.Client(timeout=httpx.Timeout(target.timeout), transport=self._transport,
                                       trust_env=False)
        self._closed = False
        self.keepalive_requests = 0
        self._target = target
        self._endpoints = target.endpoints
        self._current = 0
        self._auth: str | None = None  # the token /v3/auth/authenticate gave (never shown)
        self.shown = "etcd at " + ",".join(endpoint.split("://", 1)[1] for endpoint in target.endpoints)

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

    def _post(self, path: str, content: bytes, what: str, name: str | None,
                    timeout: float | None = None) -> httpx.Response:
        """POST to the current endpoint; a refused connection (nothing sent) moves on to the next one. `timeout`
        (seconds) replaces the URL's request timeout for this request."""
        response: httpx.Response | None = None
        try:
            response = self._post_once(path, content, what, name, timeout)
            return response
        finally:
            if self._closed:
                self._close_after(response)

    def _post_once(self, path: str, content: bytes, what: str, name: str | None,
                         timeout: float | None) -> httpx.Response:
        limit: Any = httpx.USE_CLIENT_DEFAULT if timeout is None else httpx.Timeout(timeout)
        for tried in range(len(self._endpoints)):
            endpoint = self._endpoints[self._current]
            try:
                return self._http.post(endpoint + path, content=content, headers=self._headers(),
                                             timeout=limit)
            except RuntimeError as exc:  # httpx: the client has been closed
                raise self._failed(exc, what, name) from exc
            except httpx.ConnectError as exc:
                self._current = (self._current + 1) % len(self._endpoints)
                if tried == len(self._endpoints) - 1:
                    raise self._failed(exc, what, name) from exc
            except (httpx.HTTPError, httpx.StreamError) as exc:
                # It may have been sent: the caller decides whether to try again (on the next member).
                self._current = (self._current + 1) % len(self._endpoints)
                raise self._failed(exc, what, name) from exc
        raise AssertionError("unreachable")

    def call(self, path: str, body: dict[str, Any], what: str, name: str | None,
                   accept: tuple[str, ...] = (), timeout: float | None = None) -> dict[str, Any]:
        """One unary request. An etcd error whose message contains one of `accept` comes back as
        `{"error": message}`; any other raises `BackendError`. `timeout` (seconds) replaces the URL's request
        timeout for each request this makes."""
        content = json.dumps(body).encode()
        if self._target.username is not None and self._auth is None:
            self._authenticate(name, timeout)
        for attempt in range(2):
            response = self._post(path, content, what, name, timeout)
            data = self._decode(response, what, name)
            error = data.get("error")
            if error is None:
                return data
            message = str(data.get("message") or error)
            if any(text in message for text in accept):
                return {"error": message}
            if attempt == 0 and self._target.username is not None and "auth token" in message:
                self._auth = None  # the server forgot it (restart, expiry): log in again, once
                self._authenticate(name, timeout)
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

    def _authenticate(self, name: str | None, timeout: float | None = None) -> None:
        body = json.dumps({"name": self._target.username, "password": self._target.password}).encode()
        data = self._decode(self._post("/v3/auth/authenticate", body, "authentication", name, timeout),
                            "authentication", name)
        if "error" in data or not data.get("token"):
            # etcd's own message ("authentication failed, invalid user ID or password") names no secret
            message = str(data.get("message") or data.get("error") or "no token")
            raise BackendError(f"authentication as {self._target.username!r} failed on {self.shown}: {message}",
                               name=name) from EtcdAnswer(number(data.get("code")), message)
        self._auth = str(data["token"])

    def keepalive(self, leases: list[int], name: str | None) -> dict[int, int]:
        """Refresh leases, `KEEPALIVE_BATCH` per request; returns each lease's TTL now (0: the server no longer
        has it). A lease the gateway left unanswered is sent again: a missing answer never counts as "gone"."""
        ttls: dict[int, int] = {}
        left = list(dict.fromkeys(leases))
        while left:
            answered = self._keepalive_once(left[:KEEPALIVE_BATCH], name)
            if not answered:
                raise BackendError(f"keep-alive got no answer from {self.shown}", name=name)
            ttls.update(answered)
            left = [lease for lease in left if lease not in ttls]
        return ttls

    def _keepalive_once(self, leases: list[int], name: str | None) -> dict[int, int]:
        """One keep-alive request; the TTL of each lease it answered for."""
        self.keepalive_requests += 1
        content = b"".join(json.dumps({"ID": lease}).encode() for lease in leases)
        if self._target.username is not None and self._auth is None:
            self._authenticate(name)
        response = self._post("/v3/lease/keepalive", content, "keep-alive", name)
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

    def watch_delete(self, key: bytes, start_revision: int, wait: float) -> bool:
        """Return when `key` is deleted at or after `start_revision` (True), or after about `wait` seconds with no
        news (False).

        Any fault ends the watch early and quietly (True): the look that follows meets it and reports it.
        """
        request = {"create_request": {"key": b64(key), "start_revision": start_revision, "filters": ["NOPUT"]}}
        endpoint = self._endpoints[self._current]
        timeout = httpx.Timeout(self._target.timeout, read=max(wait, 0.001))
        opened: httpx.Response | None = None
        try:
            with self._http.stream("POST", endpoint + "/v3/watch", content=json.dumps(request).encode(),
                                         headers=self._headers(), timeout=timeout) as response:
                opened = response
                if response.status_code != 200:
                    return True
                for line in response.iter_lines():
                    result = json.loads(line).get("result") if line.strip() else None
                    if not isinstance(result, dict) or result.get("canceled") or result.get("events"):
                        return True  # an error, a cancelled watch (e.g. compacted history), or the delete
            return True
        except httpx.ReadTimeout:
            return False
        except (httpx.HTTPError, httpx.StreamError, ValueError, RuntimeError):
            return True
        finally:
            if self._closed:
                self._close_after(opened)

    def _close_after(self, response: httpx.Response | None) -> None:
        """Closed while a request was out (a background cleanup): close the connection it used too, and whatever
        the pool made meanwhile. The pool's own close cannot reach a connection that was still connecting when it
        closed (it had no socket yet, and the pool forgets it), so the request's answer names its socket."""
        stream = None if response is None else response.extensions.get("network_stream")
        if stream is not None:
            stream.close()
        self._transport.close()

    def close(self) -> None:
        self._closed = True
        self._http.close()


@dataclass
class _Held:
    """One acquisition's lease and key on the server (from its first attempt until it is released or gives up)."""

    key: bytes
    lease: int
    seconds: int      # the lease's TTL as the server granted it
    asked: int        # the lease's TTL as we asked for it
    rev: int = 0      # our key's create revision, once known


def _range(key: bytes, end: bytes | None = None, **options: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"key": b64(key)}
    if end is not None:
        request["range_end"] = b64(end)
    request.update(options)
    return {"request_range": request}


def _oldest(directory: bytes) -> dict[str, Any]:
    """The key of `directory` with the lowest create revision: the holder."""
    return _range(directory, range_end(directory), sort_order="ASCEND", sort_target="CREATE", limit=1)


def _ranges(data: dict[str, Any]) -> list[list[Kv]]:
    return [kvs(response.get("response_range", {})) for response in data.get("responses", ())]


class EtcdBackend:
    """Locks in etcd, one lease and one key per acquisition (see `fencelock._logic.etcd` for the layout)."""

    def __init__(self, target: EtcdTarget, *, prefix: str) -> None:
        self._gateway = Gateway(target)
        self._prefix = prefix
        self.shown = self._gateway.shown
        self.block_cap = BLOCK_CAP
        self.supports_fair = True   # every waiter queues in arrival order; fair=True changes nothing
        self.always_queues = True
        self._held: dict[str, _Held] = {}   # by token: the leases of acquisitions in progress or held
        self._spare: dict[int, list[tuple[int, int]]] = {}  # asked TTL: (lease, granted TTL), carrying no key
        self._spare_pid = os.getpid()  # a forked child never shares its parent's spare leases
        self.renewal_requests = 0  # keep-alive requests the watchdog made (for benchmarks)

    def retry_after(self, exc: BackendError, failures: int) -> float | None:
        cause = exc.__cause__
        transient = isinstance(cause, httpx.TransportError) or (
            isinstance(cause, EtcdAnswer) and cause.code in _TRANSIENT_CODES)
        return retry_after(failures, transient, self._gateway.endpoints)

    def _txn(self, body: dict[str, Any], what: str, name: str) -> dict[str, Any]:
        return self._gateway.call("/v3/kv/txn", body, what, name)

    def _fence_put(self, name: str, fence: int) -> dict[str, Any]:
        """Record the fence of a lease that is being released (in the release's transaction)."""
        return {"request_put": {"key": b64(fence_key(self._prefix, name)), "value": b64(str(fence).encode())}}

    def _revoke(self, lease: int, name: str) -> None:
        """Best effort: end a lease (and delete the key on it). Unreachable: it ends with its TTL."""
        try:
            self._gateway.call("/v3/lease/revoke", {"ID": lease}, "revoke", name, accept=(_LEASE_GONE,))
        except BackendError:
            pass

    def _grant(self, seconds: int, name: str) -> tuple[int, int]:
        """A new lease of `seconds`, whose ID the server chooses: (its ID, the TTL granted).

        Never retried as "the same lease" (see `fencelock._logic.etcd.granted`): a grant whose answer is lost
        (a timeout, a reset, a cancellation) leaves an orphan lease on the server. No key of ours is on it and
        nothing here knows its ID, so nothing waits on it or counts it; its TTL ends it. A retried acquire grants
        another one, and the acquire loop bounds its retries (`retry_after`). "lease already exists" means the
        server's chosen ID is a lease another client granted with an ID of its own: not ours, so ask again.
        """
        for _ in range(GRANT_TRIES):
            data = self._gateway.call("/v3/lease/grant", {"ID": 0, "TTL": seconds}, "lease grant", name,
                                            accept=(_LEASE_EXISTS,))
            if "error" in data:
                continue  # another client's lease: the next grant gets a new ID
            lease = granted(data, seconds)
            if lease is None:
                raise BackendError(f"lease grant failed on {self._gateway.shown}: the answer names no lease",
                                   name=name)
            return lease
        message = (f"lease grant failed on {self._gateway.shown}: {GRANT_TRIES} times the server chose the ID of "
                   "a lease that already exists (another client grants leases with IDs it picks itself)")
        raise BackendError(message, name=name) from EtcdAnswer(9, _LEASE_EXISTS)

    def try_acquire(self, name: str, token: str, ttl_ms: int, wait: float = 0.0,
                          fair: bool = False) -> Attempt:
        """Join the name's queue (once per acquisition) and report whether we are its head; with `wait` > 0,
        watch our predecessor's key for up to `wait` seconds, then look again.

        Idempotent for one token: a retry after a lost answer finds its own lease and key.
        """
        started = time.monotonic()
        value = token.encode()
        held, mine, owner, before, revision = self._join(name, token, ttl_ms)
        state = verdict(mine, value, owner)
        while state is Verdict.WAITING and time.monotonic() - started < wait:
            if before is None:
                mine, owner, before, revision = self._look(name, held)
                state = verdict(mine, value, owner)
                if state is not Verdict.WAITING or before is None:
                    break
            if not self._gateway.watch_delete(before.key, revision + 1, wait - (time.monotonic() - started)):
                break  # the wait ended with our predecessor still there: not granted, nothing to look at
            # After a wake-up, look again, our own key first: it may have gone with our lease meanwhile.
            mine, owner, before, revision = self._look(name, held)
            state = verdict(mine, value, owner)
        if state is Verdict.GRANTED and mine is not None:
            return Attempt(True, mine.create_revision, None)
        return Attempt(False, 0, None)

    def _join(self, name: str, token: str,
                    ttl_ms: int) -> tuple[_Held, Kv | None, Kv | None, Kv | None, int]:
        """Our lease, refreshed (or granted), and our key, put if it is absent; then our key, the holder's, and
        (when known) our predecessor's with the revision it was read at."""
        held = self._held.get(token)
        if held is not None:
            # Refresh first: the validity of a lease won now counts from before this attempt.
            ttl = (self._gateway.keepalive([held.lease], name))[held.lease]
            if ttl <= 0:
                held = None  # our lease ended (we paused, or it was revoked), and took our key: queue again
            elif held.rev:
                # Queued already: a look (a read) is enough, unless our key went (an operator removed it).
                mine, owner, before, revision = self._look(name, held)
                if verdict(mine, token.encode(), owner) is not Verdict.GONE:
                    return held, mine, owner, before, revision
        seconds = lease_seconds(ttl_ms)
        if held is None:
            spare = self._take_spare(seconds)
            if spare is not None:
                held = _Held(lock_key(self._prefix, name, spare[0]), spare[0], spare[1], seconds)
                self._held[token] = held
                if (self._gateway.keepalive([held.lease], name))[held.lease] <= 0:
                    held = None  # it ran out while spare
                    del self._held[token]
        if held is None:
            # The lease is ours only once the grant's answer names it; a lost answer leaves an orphan lease with
            # no key on it, which its TTL ends (see `_grant`).
            lease, granted_s = self._grant(seconds, name)
            held = _Held(lock_key(self._prefix, name, lease), lease, granted_s, seconds)
            self._held[token] = held  # before the put: a retry after a lost answer finds its key by lease and token
        key = b64(held.key)
        directory = name_dir(self._prefix, name)
        looks = [_range(held.key), _oldest(directory)]
        data = self._txn({
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
            "success": [{"request_put": {"key": key, "value": b64(token.encode()), "lease": held.lease}}, *looks],
            "failure": looks,
        }, "acquire", name)
        ranges = _ranges(data)[-2:]
        mine = ranges[0][0] if ranges[0] else None
        if mine is not None:
            held.rev = mine.create_revision
        return held, mine, ranges[1][0] if ranges[1] else None, None, 0

    def _look(self, name: str, held: _Held) -> tuple[Kv | None, Kv | None, Kv | None, int]:
        """Our key, the holder's, and our predecessor's (the newest key older than ours), at one revision."""
        directory = name_dir(self._prefix, name)
        data = self._txn({"success": [
            _range(held.key), _oldest(directory),
            _range(directory, range_end(directory), sort_order="DESCEND", sort_target="CREATE", limit=1,
                   max_create_revision=max(held.rev - 1, 1), keys_only=True),
        ]}, "acquire", name)
        mine, owner, before = (found[0] if found else None for found in _ranges(data))
        if before is not None and before.create_revision >= held.rev:
            before = None
        return mine, owner, before, number(data.get("header", {}).get("revision"))

    def leave(self, name: str, token: str) -> None:
        """A waiter gives up (or was cancelled): revoke its lease, which deletes its key."""
        held = self._held.pop(token, None)
        if held is not None:
            self._gateway.call("/v3/lease/revoke", {"ID": held.lease}, "revoke", name,
                                     accept=(_LEASE_GONE,))

    def release(self, name: str, token: str, fence: int) -> Released:
        """Delete our key if it still holds our token (and fence), recording the fence, in one transaction; then
        keep the lease as a spare (it carries no key now) or revoke it."""
        directory = name_dir(self._prefix, name)
        newer = _range(directory, range_end(directory), min_create_revision=fence + 1, count_only=True)
        held = self._held.get(token)
        if held is None:  # nothing of ours is left on the server (released, or reported lost before)
            data = self._txn({"success": [newer]}, "release", name)
            return released(False, number(data["responses"][0]["response_range"].get("count")))
        key = b64(held.key)
        compare: list[dict[str, Any]] = [
            {"key": key, "target": "VALUE", "result": "EQUAL", "value": b64(token.encode())}]
        if fence:
            compare.append({"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": fence})
        success: list[dict[str, Any]] = [{"request_delete_range": {"key": key}}]
        if fence:
            success.append(self._fence_put(name, fence))
        data = self._txn({"compare": compare, "success": success, "failure": [newer]}, "release", name)
        self._held.pop(token, None)  # the server answered: the token's work is done either way
        deleted = bool(data.get("succeeded"))
        if not (deleted and self._keep_spare(held)):
            self._revoke(held.lease, name)
        count = 0 if deleted else number(data["responses"][0]["response_range"].get("count"))
        return released(deleted, count)

    def _take_spare(self, asked: int) -> tuple[int, int] | None:
        if self._spare_pid != os.getpid():
            self._spare, self._spare_pid = {}, os.getpid()
        try:
            return self._spare.get(asked, []).pop()
        except IndexError:
            return None

    def _keep_spare(self, held: _Held) -> bool:
        """Keep the lease of a released acquisition (its key is deleted) for a next one, if there is room."""
        spare = self._spare.setdefault(held.asked, [])
        if self._spare_pid != os.getpid() or len(spare) >= SPARE_LEASES:
            return False
        spare.append((held.lease, held.seconds))
        return True

    def extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        held = self._held.get(token)
        if held is None:
            return False
        if not keepalive_suffices(held.seconds, ttl_ms):
            return self._move(name, token, fence, ttl_ms, held)
        ttl = (self._gateway.keepalive([held.lease], name))[held.lease]
        ours = ttl > 0 and self._ours(name, [(token, fence, held)]) == [True]
        if not ours:
            self._lost(name, token, held, ttl > 0)
        return ours

    def _ours(self, name: str, keys: list[tuple[str, int, _Held]]) -> list[bool]:
        """Whether each key still holds its token and fence, and is on its lease (one transaction)."""
        data = self._txn({"success": [_range(held.key) for _, _, held in keys]}, "extend", name)
        answers = []
        for (token, fence, held), found in zip(keys, _ranges(data), strict=True):
            kv = found[0] if found else None
            answers.append(kv is not None and kv.value == token.encode() and kv.create_revision == fence
                           and kv.lease == held.lease)
        return answers

    def _lost(self, name: str, token: str, held: _Held, lease_alive: bool) -> None:
        """Our key is gone or not ours: forget the acquisition, and end its lease if it still runs."""
        self._held.pop(token, None)
        if lease_alive:
            self._revoke(held.lease, name)

    def _move(self, name: str, token: str, fence: int, ttl_ms: int, held: _Held) -> bool:
        """Extend past the lease's own TTL: put our key on a new, longer lease (its create revision, the fence,
        stays), then revoke the old lease."""
        lease, seconds = self._grant(lease_seconds(ttl_ms), name)
        key = b64(held.key)
        try:
            data = self._txn({
                "compare": [{"key": key, "target": "VALUE", "result": "EQUAL", "value": b64(token.encode())},
                            {"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": fence}],
                "success": [{"request_put": {"key": key, "value": b64(token.encode()), "lease": lease}}],
            }, "extend", name)
        except BackendError:
            self._revoke(lease, name)
            raise
        if not data.get("succeeded"):
            self._revoke(lease, name)
            self._lost(name, token, held, True)
            return False
        old, held.lease, held.seconds, held.asked = held.lease, lease, seconds, lease_seconds(ttl_ms)
        self._revoke(old, name)
        return True

    def extend_many(self, leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
        """The watchdog's batch: one keep-alive request per `KEEPALIVE_BATCH` leases, then one transaction per
        `MAX_TXN_OPS` keys to check that each key is still ours. True extended, False lost, None no answer."""
        results: list[bool | None] = [None] * len(leases)
        plain: list[int] = []
        for i, (name, token, fence, ms) in enumerate(leases):
            held = self._held.get(token)
            if held is None:
                results[i] = False
            elif keepalive_suffices(held.seconds, ms):
                plain.append(i)
            else:
                try:
                    results[i] = self.extend(name, token, fence, ms)
                except BackendError:
                    pass
        for start in range(0, len(plain), RENEWAL_BATCH):
            chunk = plain[start:start + RENEWAL_BATCH]
            helds = {i: self._held[leases[i][1]] for i in chunk if leases[i][1] in self._held}
            sent = self._gateway.keepalive_requests
            try:
                ttls = self._gateway.keepalive([held.lease for held in helds.values()], leases[chunk[0]][0])
            except BackendError:
                continue
            finally:
                self.renewal_requests += self._gateway.keepalive_requests - sent
            alive = []
            for i, held in helds.items():
                if ttls[held.lease] > 0:
                    alive.append(i)
                else:
                    results[i] = False
                    self._lost(leases[i][0], leases[i][1], held, False)
            for first in range(0, len(alive), MAX_TXN_OPS):
                group = alive[first:first + MAX_TXN_OPS]
                try:
                    answers = self._ours(leases[group[0]][0],
                                               [(leases[i][1], leases[i][2], helds[i]) for i in group])
                except BackendError:
                    continue
                for i, ours in zip(group, answers, strict=True):
                    results[i] = ours
                    if not ours:
                        self._lost(leases[i][0], leases[i][1], helds[i], True)
        return results

    # ------------------------------------------------------------------------------------------ operators

    def _time_to_live(self, lease: int, name: str) -> float:
        data = self._gateway.call("/v3/lease/timetolive", {"ID": lease}, "status", name)
        return float(max(0, number(data.get("TTL"))))

    def _head(self, name: str) -> tuple[Kv | None, int]:
        directory = name_dir(self._prefix, name)
        data = self._gateway.call("/v3/kv/range", {
            "key": b64(directory), "range_end": b64(range_end(directory)), "sort_order": "ASCEND",
            "sort_target": "CREATE", "limit": 1, "keys_only": True}, "status", name)
        found = kvs(data)
        return (found[0] if found else None), number(data.get("count"))

    def status(self, name: str) -> LockStatus:
        """The holder (the oldest key), its fence, its lease's TTL left (whole seconds) and the waiters.

        A free lock shows the fence of the last lease released through fencelock (`release()` or `force_release`
        record it in their transaction); None if none was: etcd keeps nothing of a lease that expired.
        """
        owner, count = self._head(name)
        if owner is None:
            data = self._gateway.call("/v3/kv/range", {"key": b64(fence_key(self._prefix, name))}, "status",
                                            name)
            found = kvs(data)
            last = int(found[0].value) if found and found[0].value.isdigit() else None
            return LockStatus(name, False, last, None, 0)
        return LockStatus(name, True, owner.create_revision, self._time_to_live(owner.lease, name), count - 1)

    def scan(self, pattern: str) -> list[LockStatus]:
        """Every held lock whose name matches `pattern`, read in pages of `SCAN_PAGE` keys at one revision."""
        head = f"{self._prefix}/".encode()
        end = range_end(head)
        start, revision = head, 0
        found: dict[str, list[Any]] = {}  # name: [oldest key, keys]
        while True:
            body: dict[str, Any] = {"key": b64(start), "range_end": b64(end), "limit": SCAN_PAGE, "keys_only": True}
            if revision:
                body["revision"] = revision
            data = self._gateway.call("/v3/kv/range", body, "list", None)
            revision = revision or number(data.get("header", {}).get("revision"))
            page = kvs(data)
            for kv in page:
                name = name_of(self._prefix, kv.key)
                if name is None or not fnmatchcase(name, pattern):
                    continue
                entry = found.setdefault(name, [kv, 0])
                entry[1] += 1
                if kv.create_revision < entry[0].create_revision:
                    entry[0] = kv
            if not data.get("more") or not page:
                break
            start = page[-1].key + b"\x00"
        statuses = []
        for name in sorted(found):
            owner, count = found[name]
            statuses.append(LockStatus(name, True, owner.create_revision,
                                       self._time_to_live(owner.lease, name), count - 1))
        return statuses

    def force_release(self, name: str) -> LockStatus:
        """Delete the holder's key and revoke its lease (the next waiter gets the lock); returns what was removed."""
        for _ in range(3):
            owner, count = self._head(name)
            if owner is None:
                return LockStatus(name, False, None, None, 0)
            remaining = self._time_to_live(owner.lease, name)
            key = b64(owner.key)
            data = self._txn({
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL",
                             "create_revision": owner.create_revision}],
                "success": [{"request_delete_range": {"key": key}}, self._fence_put(name, owner.create_revision)],
            }, "force-release", name)
            if data.get("succeeded"):
                self._revoke(owner.lease, name)
                return LockStatus(name, True, owner.create_revision, remaining, count - 1)
        raise BackendError("the holder kept changing while it was being removed", name=name)

    def close(self) -> None:
        """End the spare leases, within `CLOSE_TIMEOUT` in all (best effort: their TTL ends the others), and close
        the connections."""
        spare, self._spare = self._spare, {}
        if self._spare_pid == os.getpid():
            deadline = Deadline.after(CLOSE_TIMEOUT, time.monotonic())
            for lease in [lease for leases in spare.values() for lease, _ in leases]:
                left = min(deadline.remaining(time.monotonic()), self._gateway.timeout)
                if left <= 0:
                    break
                try:
                    self._gateway.call("/v3/lease/revoke", {"ID": lease}, "revoke", None,
                                             accept=(_LEASE_GONE,), timeout=left)
                except BackendError:
                    break  # the server does not answer in time: the spare leases end by their TTL
        self._gateway.close()
