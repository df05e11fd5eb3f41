"""An independent watcher of Redis-family lock keys, a history of what clients claimed, and the invariants over both.

The `Watcher` reads each watched name's lock key (token and PTTL, in one script call, so the two agree) on every
node, straight from the servers with plain redis-py, in a thread of its own. The `History` records what the
clients under test said: each lease's token, its `remaining()` at given moments, each operation's start, end and
error. `check()` compares the two and returns the broken invariants, each as one line::

    never two leases that both claim validity at one time (for one name)
    remaining() never exceeds what the server will keep (the key's PTTL, past the watcher's round trip)
    no lease reports "released" while the server still keeps its token
    no key outlives its TTL unless its holder is alive and renewing (a minority of nodes: by `straggle` at most)
    every error is a fencelock error that names the lock
    after the fault, the same client acquires and releases again (`History.liveness`)

Times are `time.monotonic()`, the clock fencelock's leases count by, so client and watcher share one timeline.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._errors import LockError
from .._redis.keys import redis_keys

__all__ = ["Claim", "EtcdReader", "History", "LeaseRecord", "Op", "Sample", "Watcher", "ZooKeeperReader", "check"]

_READ = "local v = redis.call('GET', KEYS[1]) return {v or false, redis.call('PTTL', KEYS[1])}"

EPSILON = 0.03
"""Seconds of slack for the granularity of Redis's millisecond expiry and the scheduling of this process."""


@dataclass(frozen=True)
class Sample:
    """One look at one name on every node: between `start` and `end`, node i held `tokens[i]` with `pttls[i]` ms
    left (-2: no key; None: the node did not answer), or up to `spans[i]` ms more (a server that counts in seconds).
    """

    name: str
    start: float
    end: float
    tokens: tuple[str | None, ...]
    pttls: tuple[int | None, ...]
    spans: tuple[int, ...] = ()

    def kept(self, token: str, quorum: int) -> tuple[float, float] | None:
        """Until when (earliest, latest) the servers keep `token` for `name`: its quorum-th longest key. None:
        fewer than `quorum` nodes hold it. A node that did not answer counts as holding it for ever."""
        ends: list[tuple[float, float]] = []
        spans = self.spans or (0,) * len(self.pttls)
        for held, pttl, span in zip(self.tokens, self.pttls, spans, strict=True):
            if pttl is None:
                ends.append((math.inf, math.inf))
            elif held == token:
                if pttl < 0:
                    ends.append((math.inf, math.inf))
                else:
                    ends.append((self.start + pttl / 1000, self.end + (pttl + span) / 1000))
        if len(ends) < quorum:
            return None
        ends.sort(reverse=True)
        return ends[quorum - 1]

    def holders(self, quorum: int) -> set[str]:
        """The tokens at least `quorum` answering nodes hold."""
        seen = [t for t, p in zip(self.tokens, self.pttls, strict=True) if t is not None and p is not None]
        return {t for t in set(seen) if seen.count(t) >= quorum}

    @property
    def answered(self) -> bool:
        return all(p is not None for p in self.pttls)


class Watcher:
    """Sample the lock key of every watched name on every node of `raws` (plain redis-py clients, straight to the
    servers, or readers of another backend with a ``read_lock(name) -> (token or None, ms left or -2)`` method,
    such as `ZooKeeperReader`, or ``(token, ms left at least, up to this many ms more)``, such as `EtcdReader`)
    every `interval` seconds, until `stop()`."""

    def __init__(self, raws: list[Any], *, interval: float = 0.01) -> None:
        self._raws = raws
        self._interval = interval
        self._names: list[str] = []
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples: list[Sample] = []

    def watch(self, name: str) -> None:
        with self._guard:
            if name not in self._names:
                self._names.append(name)

    def sample(self, name: str) -> Sample:
        """Look at `name` now (also recorded in `samples`)."""
        key = redis_keys(name).lock
        start = time.monotonic()
        tokens: list[str | None] = []
        pttls: list[int | None] = []
        spans: list[int] = []
        for raw in self._raws:
            try:
                value, pttl, *span = raw.read_lock(name) if hasattr(raw, "read_lock") else raw.eval(_READ, 1, key)
            except Exception:  # a paused or cut node: no answer from it this time
                tokens.append(None)
                pttls.append(None)
                spans.append(0)
                continue
            tokens.append(None if not value else value if isinstance(value, str) else bytes(value).decode())
            pttls.append(int(pttl))
            spans.append(int(span[0]) if span else 0)
        found = Sample(name, start, time.monotonic(), tuple(tokens), tuple(pttls), tuple(spans))
        with self._guard:
            self.samples.append(found)
        return found

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self._run, name="fencelock-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._guard:
                names = list(self._names)
            for name in names:
                self.sample(name)

    def __enter__(self) -> Watcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ZooKeeperReader:
    """A `Watcher`'s reader of ZooKeeper locks, straight to the server (its own kazoo client): the holder is the
    head of the name's queue, and what the server keeps for it is its TTL from the node's last write (what
    `status` shows). Each read gives up after `timeout` seconds (a paused server: no answer this time)."""

    def __init__(self, hosts: str, chroot: str, prefix: str = "fencelock", *, timeout: float = 0.2) -> None:
        from kazoo.client import KazooClient

        from .._zk.rules import encode_name, root_path
        self._root = root_path(chroot, encode_name(prefix))
        self._timeout = timeout
        self._client = KazooClient(hosts=hosts, timeout=10.0)
        self._client.start(timeout=10)

    def read_lock(self, name: str) -> tuple[str | None, int]:
        from kazoo.exceptions import NoNodeError

        from .._zk.rules import child_name, decode_lease, lock_path, queue
        directory = lock_path(self._root, name)
        try:
            line = queue(self._client.get_children_async(directory).get(timeout=self._timeout))
            if not line:
                return None, -2
            data, stat = self._client.get_async(f"{directory}/{child_name(line[0])}").get(timeout=self._timeout)
        except NoNodeError:
            return None, -2
        ttl = decode_lease(data)[0]
        if ttl is None:
            return line[0].token, -1
        return line[0].token, max(0, int(stat.mtime + ttl - time.time() * 1000.0))

    def close(self) -> None:
        self._client.stop()
        self._client.close()


class EtcdReader:
    """A `Watcher`'s reader of etcd locks, straight to one member's JSON gateway: the holder is the name's oldest
    key (its value is the token), kept for its lease's TTL (`/v3/lease/timetolive`: whole seconds, rounded down,
    so up to a second more). Each request gives up after `timeout` seconds (a paused server: no answer)."""

    def __init__(self, host: str, port: int, prefix: str = "fencelock", *, timeout: float = 0.2) -> None:
        self._address = (host, port, timeout)
        self._http: Any = None
        self._prefix = prefix
        self._guard = threading.Lock()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import json

        with self._guard:
            if self._http is None:
                import http.client

                host, port, timeout = self._address
                self._http = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                self._http.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
                answer: dict[str, Any] = json.loads(self._http.getresponse().read() or b"{}")
            except Exception:
                self._http.close()
                self._http = None
                raise
            return answer

    def read_lock(self, name: str) -> tuple[str | None, int, int]:
        from .._etcd.rules import b64, kvs, name_dir, range_end
        directory = name_dir(self._prefix, name)
        found = kvs(self._post("/v3/kv/range", {"key": b64(directory), "range_end": b64(range_end(directory)),
                                                "sort_order": "ASCEND", "sort_target": "CREATE", "limit": 1}))
        if not found:
            return None, -2, 0
        lease = self._post("/v3/lease/timetolive", {"ID": found[0].lease})
        ttl = int(lease.get("TTL") or 0)
        if ttl < 0:  # the lease is gone: its key goes with it (read in between)
            return found[0].value.decode(), 0, 0
        granted = int(lease.get("grantedTTL") or 0)
        return found[0].value.decode(), ttl * 1000, max(0, min(ttl + 1, granted) - ttl) * 1000

    def close(self) -> None:
        with self._guard:
            if self._http is not None:
                self._http.close()
                self._http = None


@dataclass(eq=False)
class LeaseRecord:
    """A lease as its client reported it. `ended`: when the client stopped holding it, and how (released: the
    release returned; lost: the lease said so; exit: the `with` block ended with an error; abandoned: the test
    gave up on it)."""

    name: str
    token: str
    ttl: float
    renewing: bool
    client: str
    acquired_at: float
    ended_at: float | None = None
    ended: str = ""
    max_ttl: float = 0.0

    def __post_init__(self) -> None:
        self.max_ttl = self.ttl


@dataclass(frozen=True)
class Claim:
    """At `at`, the lease said it had `remaining` seconds of validity (ensure() passed iff `ensured`)."""

    lease: LeaseRecord
    at: float
    remaining: float
    ensured: bool


@dataclass(eq=False)
class Op:
    """One call the test made: on which lock (and lease), when, what TTL it asked for, and what it raised."""

    what: str
    name: str
    lease: LeaseRecord | None
    start: float
    ttl: float | None = None
    end: float | None = None
    error: BaseException | None = None


@dataclass
class History:
    """What the clients under test said and did, for `check()`."""

    leases: list[LeaseRecord] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    #: (name, when): an operator's force-release, after which no holder's earlier claim is owed anything
    cuts: list[tuple[str, float]] = field(default_factory=list)
    #: when injected faults last delivered something they held back (a held request reaches the server then)
    fault_ends: list[float] = field(default_factory=list)
    #: failures of the same client after the fault had ended
    liveness: list[str] = field(default_factory=list)
    #: errors that are the test's own doing (a cancellation it injected) and not checked as fencelock errors
    expected: list[type[BaseException]] = field(default_factory=list)

    def lease(self, lease: Any, *, renewing: bool, client: str = "client") -> LeaseRecord:
        record = LeaseRecord(lease.name, lease.token, float(lease.ttl), renewing, client, time.monotonic())
        self.leases.append(record)
        self.claim(record, lease)
        return record

    def claim(self, record: LeaseRecord, lease: Any) -> Claim:
        at = time.monotonic()
        remaining = float(lease.remaining())
        try:
            lease.ensure()
            ensured = True
        except LockError:
            ensured = False
        claim = Claim(record, at, remaining if ensured else 0.0, ensured)
        self.claims.append(claim)
        if lease.lost and record.ended_at is None:
            self.end(record, "lost")
        return claim

    def end(self, record: LeaseRecord, how: str) -> None:
        if record.ended_at is None:
            record.ended_at = time.monotonic()
            record.ended = how

    def begin(self, what: str, name: str, lease: LeaseRecord | None = None, ttl: float | None = None) -> Op:
        op = Op(what, name, lease, time.monotonic(), ttl)
        self.ops.append(op)
        if lease is not None and ttl is not None:
            lease.max_ttl = max(lease.max_ttl, ttl)
        if what == "force_release":
            self.cuts.append((name, op.start))
        return op

    def finish(self, op: Op, error: BaseException | None = None) -> None:
        op.end = time.monotonic()
        op.error = error


def _cut(history: History, claim: Claim) -> float:
    """When a claim stops being owed: at the next call on its lease that may shorten it, or a force-release."""
    end = claim.at + claim.remaining
    for op in history.ops:
        if op.start <= claim.at and ((op.what == "release" and op.lease is claim.lease)
                                     or (op.what == "force_release" and op.name == claim.lease.name)):
            return claim.at  # asked to release, or force-released: owed nothing more, whatever the answer was
        if op.start >= claim.at and (op.lease is claim.lease or (op.what == "force_release"
                                                                and op.name == claim.lease.name)):
            end = min(end, op.start)
    if claim.lease.ended_at is not None and claim.lease.ended in ("released",):
        end = min(end, claim.lease.ended_at)
    return end


def check(history: History, samples: Iterable[Sample], *, quorum: int = 1, epsilon: float = EPSILON,
          straggle: float = 0.0, lag: float = 0.0) -> list[str]:
    """Every broken invariant, one line each (empty: all held).

    `straggle`: how much longer than its TTL a minority of nodes (fewer than `quorum`) may keep a key, because the
    request that set it waited on that node's connection behind an earlier one after the call had its quorum. A
    call that raised (its outcome unknown) may have requests that land up to `straggle` after it, on any node.
    `lag`: how long a server may keep a key after its TTL ran out before it deletes it (etcd looks for expired
    leases every 0.5 s).
    """
    found: list[str] = []
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    for s_list in by_name.values():
        s_list.sort(key=lambda s: s.start)

    # never two leases that both claim validity at one time
    windows = [(c, c.at, _cut(history, c)) for c in history.claims if c.ensured and c.remaining > 0]
    for i, (a, a0, a1) in enumerate(windows):
        for b, b0, b1 in windows[i + 1:]:
            if a.lease is not b.lease and a.lease.name == b.lease.name and max(a0, b0) < min(a1, b1) - epsilon:
                found.append(f"two valid leases: {a.lease.client} claimed {a.remaining:.3f}s at {a0:.3f} and "
                             f"{b.lease.client} claimed {b.remaining:.3f}s at {b0:.3f}: both valid at "
                             f"{max(a0, b0):.3f}")
                break

    # remaining() never exceeds what the server keeps (reported once per lease)
    over: set[int] = set()
    for claim, start, end in windows:
        if id(claim.lease) in over:
            continue
        before = len(found)
        for s in by_name.get(claim.lease.name, []):
            # Only a read that ended before the cut saw the key before the cut: a read held up by a paused node
            # may be served after the release that the cut marks.
            if s.start < start or s.start >= end - epsilon or s.end > end or not s.answered:
                continue
            kept = s.kept(claim.lease.token, quorum)
            if kept is None:
                found.append(f"remaining() over-claims: {claim.lease.client}'s lease said {claim.remaining:.3f}s "
                             f"at {start:.3f} (until {end:.3f}) but at {s.start:.3f} the server held "
                             f"{'another token' if s.holders(quorum) else 'no key'}")
                break
            # The claim is about the server's expiry: compared whole, though only samples before the cut count
            # (a later extend or release may shorten the key legitimately).
            if kept[1] + epsilon < start + claim.remaining:
                found.append(f"remaining() over-claims: {claim.lease.client}'s lease said {claim.remaining:.3f}s "
                             f"at {start:.3f} but the server keeps it only until {kept[1]:.3f} "
                             f"({start + claim.remaining - kept[1]:.3f}s less)")
                break
        if len(found) > before:
            over.add(id(claim.lease))

    # no lease reports released while the server keeps its token
    for lease in history.leases:
        if lease.ended != "released" or lease.ended_at is None:
            continue
        for s in by_name.get(lease.name, []):
            if s.start > lease.ended_at + epsilon and s.answered and s.kept(lease.token, quorum) is not None:
                found.append(f"token dropped before the server released it: {lease.client}'s release returned at "
                             f"{lease.ended_at:.3f}, the server still held it at {s.start:.3f}")
                break

    # no key outlives its TTL unless its holder is alive and renewing
    slack = max(history.fault_ends, default=0.0)
    known = {lease.token: lease for lease in history.leases}
    for name, s_list in by_name.items():
        reported: set[str] = set()
        deadlines: dict[str, float | None] = {}  # token: its deadline (it depends on the history, not the sample)
        for s in s_list:
            late: list[tuple[str, float, float]] = []  # (token, kept until, deadline) of each node past it
            for token, pttl in zip(s.tokens, s.pttls, strict=True):
                if token is None or pttl is None or token in reported:
                    continue
                if token not in deadlines:
                    deadlines[token] = _deadline(history, name, known.get(token), slack, straggle)
                deadline = deadlines[token]
                lives_until = math.inf if pttl < 0 else s.start + pttl / 1000
                if deadline is not None and lives_until > deadline + epsilon + lag:
                    late.append((token, lives_until, deadline))
            for token, lives_until, deadline in late:
                allowed = straggle if sum(t == token for t, _, _ in late) < quorum else 0.0
                if token not in reported and lives_until > deadline + epsilon + lag + allowed:
                    who = f"{known[token].client}'s lease" if token in known else "a key no lease was returned for"
                    found.append(f"key outlives its TTL: {who} on {name!r} is kept until {lives_until:.3f} (seen "
                                 f"at {s.start:.3f}), {lives_until - deadline:.3f}s past the last TTL its client "
                                 "could have set")
                    reported.add(token)

    # every error is a fencelock error that names the lock
    for op in history.ops:
        exc = op.error
        if exc is None or any(isinstance(exc, kind) for kind in history.expected):
            continue
        if not isinstance(exc, LockError):
            found.append(f"{op.what} on {op.name!r} raised {type(exc).__module__}.{type(exc).__name__}: {exc}")
        elif exc.name != op.name or repr(op.name) not in str(exc):
            found.append(f"{op.what} on {op.name!r} raised {type(exc).__name__} without naming the lock: {exc}")

    found.extend(f"not usable after the fault: {line}" for line in history.liveness)
    return found


def _deadline(history: History, name: str, lease: LeaseRecord | None, slack: float,
              straggle: float = 0.0) -> float | None:
    """The latest moment a key may live: the last TTL its client could have set, counted from the end of the
    call that set it (or from when a held-back request finally arrived; `straggle` later for a call that raised,
    whose requests go on in the background). None: alive and renewing."""
    if lease is not None and lease.renewing and lease.ended_at is None:
        return None
    ends: list[float] = []
    for op in history.ops:
        if op.end is None:
            return None  # still in flight when the history was closed
        mine = op.lease is lease if lease is not None else (op.what == "acquire" and op.name == name)
        if mine and op.ttl is not None and op.what in ("acquire", "extend"):
            ends.append(max(op.end + (straggle if op.error is not None else 0.0), slack) + op.ttl)
    if lease is not None:
        ends.append(max(lease.acquired_at, slack) + lease.ttl)
        if lease.renewing and lease.ended_at is not None:
            ends.append(max(lease.ended_at, slack) + lease.max_ttl)
    return max(ends) if ends else None
