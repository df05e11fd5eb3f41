"""The registry of contenders: name -> a factory that connects to a `Target` and gives acquire/release callables.

To add a row (etcd, ZooKeeper, ...): write a factory `(Target) -> Locker` (or an async one giving an
`AsyncLocker`), and `register()` it with the `Need` it has (which service, how many nodes). The Redlock rows
(`Need("redlock", n)`: n independent Redis masters) show how a multi-node row is added.
`services.py` starts what the needs ask for; `workload.py` runs every registered contender the same way.

The contract every factory keeps, so that the rows compare like with like:

- `acquire(name, wait)` makes one acquisition with a 30 s TTL and returns a handle, or None if the lock stayed
  busy: `wait == 0` is one attempt, `wait > 0` blocks at most that many seconds in the library's own way.
- `release(handle)` gives that acquisition back (compare-and-delete on the server).
- Each acquisition builds whatever a user would build for it (a new `Lock` object, a new token): the cost of
  the library's normal use is measured, not a hand-tuned reuse of its internals.
- Each factory makes its own client (connection pool) with the library's default settings.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import redis
import redis.asyncio

import fencelock
import fencelock.aio

TTL = 30.0
"""Seconds: the TTL of every acquisition in every row."""

Role = Literal["floor", "subject", "anchor", "info"]
"""floor: the least work a correct lock can do; subject: fencelock; anchor: a library users pick today;
info: measured and shown, no target depends on it."""


@dataclass(frozen=True)
class Need:
    """What a contender needs running: `nodes` servers of one `service`.

    "redis": one Redis-compatible server (the single-node rows). "redlock": `nodes` independent Redis masters,
    apart from the single-node server (later: "etcd", "zookeeper").
    """

    service: str
    nodes: int = 1

    def __str__(self) -> str:
        return self.service if self.nodes == 1 else f"{self.nodes} x {self.service}"


@dataclass(frozen=True)
class Target:
    """Where the servers of one `Need` listen (picklable: it is handed to worker processes)."""

    service: str
    urls: tuple[str, ...]

    @property
    def url(self) -> str:
        return self.urls[0]


@dataclass(frozen=True)
class Locker:
    """acquire/release callables bound to one client. `close` frees the client."""

    acquire: Callable[[str, float], object | None]
    release: Callable[[object], None]
    close: Callable[[], None]


@dataclass(frozen=True)
class AsyncLocker:
    acquire: Callable[[str, float], Awaitable[object | None]]
    release: Callable[[object], Awaitable[None]]
    close: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Reference:
    """The figures anchors.md gives for this contender (another run, redis-py 5.3), for comparison."""

    uncontended_us: float | None = None
    per_s: float | None = None
    wait_p99_ms: float | None = None
    longest_ms: float | None = None


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    role: Role
    need: Need
    make: Callable[[Target], Locker] | None = None
    make_async: Callable[[Target], AsyncLocker] | None = None
    uncontended: bool = True
    contended: bool = True
    reference: Reference = field(default_factory=Reference)
    note: str = ""
    cycles_scale: float = 1.0
    """Uncontended cycles (and warm-up) per round, as a share of the run's `--cycles`: a slow row makes fewer
    cycles per round, so that every round of every row takes a few tenths of a second."""
    runs: int | None = None
    """At most this many contended runs (None: as many as the run's `--runs`)."""

    @property
    def group(self) -> str:
        """What `--only` accepts besides the key: "single" (one Redis), else the service ("redlock", "etcd")."""
        return "single" if self.need.service == "redis" else self.need.service


REGISTRY: dict[str, Contender] = {}


def register(contender: Contender) -> Contender:
    if contender.key in REGISTRY:
        raise ValueError(f"contender {contender.key!r} registered twice")
    if (contender.make is None) == (contender.make_async is None):
        raise ValueError(f"contender {contender.key!r} needs exactly one of make / make_async")
    if contender.contended and contender.make is None:
        raise ValueError(f"contender {contender.key!r}: the contended workload runs sync lockers in processes")
    REGISTRY[contender.key] = contender
    return contender


# ----------------------------------------------------------------------------------------------------- one node

def _redis_client(target: Target) -> redis.Redis:
    """A plain redis-py client with its default settings, as a user of the anchors would make it."""
    return redis.Redis.from_url(target.url)


_FLOOR_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def floor(target: Target) -> Locker:
    """By hand: `SET name token NX PX 30000`, release by EVALSHA compare-and-delete. No waiting, no fence."""
    client = _redis_client(target)
    sha: str = client.script_load(_FLOOR_RELEASE)
    ttl_ms = int(TTL * 1000)

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        token = secrets.token_hex(16)
        return (name, token) if client.set(name, token, nx=True, px=ttl_ms) else None

    def release(handle: object) -> None:
        name, token = cast("tuple[str, str]", handle)
        client.evalsha(sha, 1, name, token)

    return Locker(acquire, release, client.close)


def floor_async(target: Target) -> AsyncLocker:
    """The floor with redis-py's asyncio client: what any asyncio lock on redis-py pays at least."""
    client = redis.asyncio.Redis.from_url(target.url)
    ttl_ms = int(TTL * 1000)
    sha: str | None = None

    async def acquire(name: str, wait: float) -> object | None:
        nonlocal sha
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        if sha is None:
            sha = await client.script_load(_FLOOR_RELEASE)
        token = secrets.token_hex(16)
        return (name, token) if await client.set(name, token, nx=True, px=ttl_ms) else None

    async def release(handle: object) -> None:
        name, token = cast("tuple[str, str]", handle)
        await client.evalsha(sha, 1, name, token)  # type: ignore[arg-type]

    return AsyncLocker(acquire, release, client.aclose)


def _fencelock_target(target: Target) -> str | list[str]:
    """What `fencelock.connect()` is given: the URL of one node (or of an etcd cluster), or the list of URLs of the
    Redlock nodes."""
    return list(target.urls) if target.service == "redlock" else target.url


def fencelock_sync(target: Target, *, fair: bool = False) -> Locker:
    locks = fencelock.connect(_fencelock_target(target))

    def acquire(name: str, wait: float) -> object | None:
        try:
            return locks.acquire(name, ttl=TTL, wait=wait, fair=fair)
        except fencelock.NotAcquired:
            return None

    def release(handle: object) -> None:
        cast(fencelock.Lease, handle).release()

    return Locker(acquire, release, locks.close)


def fencelock_fair(target: Target) -> Locker:
    return fencelock_sync(target, fair=True)


def fencelock_async(target: Target) -> AsyncLocker:
    locks = fencelock.aio.connect(_fencelock_target(target))

    async def acquire(name: str, wait: float) -> object | None:
        try:
            return await locks.acquire(name, ttl=TTL, wait=wait)
        except fencelock.NotAcquired:
            return None

    async def release(handle: object) -> None:
        await cast(fencelock.aio.Lease, handle).release()

    return AsyncLocker(acquire, release, locks.aclose)


def redis_py_lock(target: Target) -> Locker:
    """redis-py's `Lock` with its defaults: a blocking acquire polls every 0.1 s."""
    client = _redis_client(target)

    def acquire(name: str, wait: float) -> object | None:
        lock = client.lock(name, timeout=TTL)
        got = lock.acquire(blocking=wait > 0, blocking_timeout=wait if wait > 0 else None)
        return lock if got else None

    def release(handle: object) -> None:
        handle.release()  # type: ignore[attr-defined]

    return Locker(acquire, release, client.close)


def python_redis_lock(target: Target) -> Locker:
    """python-redis-lock: `SET NX EX`, a blocking acquire BLPOPs a signal list its release pushes to.

    Its `acquire()` first GETs the key to check that this `Lock` object does not already hold it: three round
    trips per cycle where the others make two. That is its normal use, so it is measured as it is.
    """
    import redis_lock  # a bench-only dependency: imported only when this row runs

    client = _redis_client(target)
    expire = int(TTL)

    def acquire(name: str, wait: float) -> object | None:
        lock = redis_lock.Lock(client, name, expire=expire)
        if wait > 0:
            # Its timeout is whole seconds (it truncates fractions), and may not exceed `expire`.
            got = lock.acquire(blocking=True, timeout=max(1, min(expire, round(wait))))
        else:
            got = lock.acquire(blocking=False)
        return lock if got else None

    def release(handle: object) -> None:
        handle.release()  # type: ignore[attr-defined]

    return Locker(acquire, release, client.close)


def floor_flock(target: Target) -> Locker:
    """The best hand-off this machine can do, without any network: `flock` on one file per name. The kernel wakes
    a blocked waiter the moment the holder unlocks. (Not fair, no TTL, one machine only: a bound, not a lock.)"""
    import fcntl  # POSIX only; the contended workload runs only where multiprocessing does
    import hashlib
    import os
    import tempfile

    files: dict[str, int] = {}

    def acquire(name: str, wait: float) -> object | None:
        fd = files.get(name)
        if fd is None:
            path = os.path.join(tempfile.gettempdir(), f"fencelock-bench-{hashlib.sha1(name.encode()).hexdigest()}")
            fd = files[name] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # wait > 0 blocks until the holder unlocks (the run's 10 s wait is never reached at this speed)
            fcntl.flock(fd, fcntl.LOCK_EX if wait > 0 else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        return fd

    def release(handle: object) -> None:
        fcntl.flock(cast(int, handle), fcntl.LOCK_UN)

    def close() -> None:
        for fd in files.values():
            os.close(fd)

    return Locker(acquire, release, close)


ONE_REDIS = Need("redis")

register(Contender(
    "floor", "floor: SET NX PX + EVALSHA", "floor", ONE_REDIS, make=floor, contended=False,
    reference=Reference(uncontended_us=272),
    note="hand-written with redis-py: the least a correct single-node lock can do",
))
register(Contender(
    "floor-flock", "floor: flock, no network", "floor", ONE_REDIS, make=floor_flock, uncontended=False,
    note="the kernel's hand-off between processes: what no network lock on this machine can beat",
))
register(Contender(
    "fencelock", "fencelock", "subject", ONE_REDIS, make=fencelock_sync,
    note="fencelock.connect(url): acquire(ttl=30) / lease.release()",
))
register(Contender(
    "fencelock-fair", "fencelock, fair", "subject", ONE_REDIS, make=fencelock_fair, uncontended=False,
    note="fencelock.connect(url): acquire(ttl=30, fair=True): waiters served in arrival order",
))
register(Contender(
    "redis-py", "redis-py Lock", "anchor", ONE_REDIS, make=redis_py_lock,
    reference=Reference(uncontended_us=324, per_s=401, wait_p99_ms=408, longest_ms=2325),
    note="r.lock(name, timeout=30): defaults, polls every 0.1 s",
))
register(Contender(
    "python-redis-lock", "python-redis-lock", "anchor", ONE_REDIS, make=python_redis_lock,
    reference=Reference(uncontended_us=297, per_s=508, wait_p99_ms=29, longest_ms=41),
    note="redis_lock.Lock(r, name, expire=30): BLPOP on a signal list",
))
register(Contender(
    "floor-aio", "floor, asyncio", "info", ONE_REDIS, make_async=floor_async, contended=False,
    note="the floor with redis.asyncio: the bar for fencelock.aio",
))
register(Contender(
    "fencelock-aio", "fencelock.aio", "info", ONE_REDIS, make_async=fencelock_async, contended=False,
    note="fencelock.aio.connect(url), one task, for information",
))


# ------------------------------------------------------------------------------------------------------ Redlock

def floor_redlock(target: Target) -> Locker:
    """Redlock's least work, by hand: `SET name token NX PX 30000` written to every node before any answer is read
    (one thread, one connection per node), granted on a majority within the TTL; release by EVALSHA
    compare-and-delete, written to every node the same way. No fencing, no waiting, no per-node timeout."""
    clients = [redis.Redis.from_url(url) for url in target.urls]
    sha = ""
    for client in clients:
        sha = client.script_load(_FLOOR_RELEASE)
    # One connection per node, held for the row's lifetime: the replies are read after every request is written.
    conns: list[Any] = [client.connection_pool.get_connection() for client in clients]  # redis-py: untyped
    quorum = len(conns) // 2 + 1
    ttl_ms = int(TTL * 1000)
    validity = TTL * 0.99 - 0.002  # the Redlock rule: TTL minus 1 % clock drift minus 2 ms

    def everywhere(*args: object) -> list[object]:
        packed = conns[0].pack_command(*args)
        for conn in conns:
            conn.send_packed_command(packed, check_health=False)
        return [conn.read_response() for conn in conns]

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        token = secrets.token_hex(16)
        started = time.monotonic()
        granted = sum(1 for reply in everywhere("SET", name, token, "NX", "PX", ttl_ms) if reply is not None)
        if granted >= quorum and time.monotonic() - started < validity:
            return (name, token)
        everywhere("EVALSHA", sha, 1, name, token)  # give back what a minority granted
        return None

    def release(handle: object) -> None:
        name, token = cast("tuple[str, str]", handle)
        everywhere("EVALSHA", sha, 1, name, token)

    def close() -> None:
        for client, conn in zip(clients, conns, strict=True):
            client.connection_pool.release(conn)
            client.close()

    return Locker(acquire, release, close)


def floor_redlock_scripts(target: Target) -> Locker:
    """The Redlock floor by hand, running fencelock's own node scripts (redlock_acquire.lua, redlock_release.lua)
    instead of SET NX: what those scripts cost on these nodes, with none of fencelock's client logic. On this
    machine the nodes of a row share one server CPU and run one after the other, so every microsecond of script
    time counts as many times as there are nodes."""
    from fencelock._redis.keys import redis_keys
    from fencelock._scripts import REDLOCK_ACQUIRE, REDLOCK_RELEASE

    clients = [redis.Redis.from_url(url) for url in target.urls]
    for client in clients:
        client.script_load(REDLOCK_ACQUIRE.source)
        client.script_load(REDLOCK_RELEASE.source)
    conns: list[Any] = [client.connection_pool.get_connection() for client in clients]  # redis-py: untyped
    quorum = len(conns) // 2 + 1
    ttl_ms = int(TTL * 1000)
    marker = "fencelock:redlock:node"  # a node without it answers "not ready" (see redlock_gate.lua)
    if not any(client.exists(marker) for client in clients):
        for client in clients:  # a new deployment: every node counts at once, as fencelock itself decides
            client.set(marker, "bench")
    proposals: dict[str, int] = {}

    def everywhere(*args: object) -> list[Any]:
        packed = conns[0].pack_command(*args)
        for conn in conns:
            conn.send_packed_command(packed, check_health=False)
        return [conn.read_response() for conn in conns]

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        keys, token = redis_keys(name), secrets.token_hex(16)
        t = proposals[name] = proposals.get(name, 0) + 1
        replies = everywhere("EVALSHA", REDLOCK_ACQUIRE.sha, 4, keys.lock, keys.fence, marker, keys.waiters,
                             token, ttl_ms, t)
        if sum(1 for reply in replies if reply[0] == 1) >= quorum:
            return (keys, token, t)
        proposals[name] = max([t, *(int(reply[1]) for reply in replies)])  # learn the nodes' hwm
        everywhere("EVALSHA", REDLOCK_RELEASE.sha, 4, keys.lock, keys.fence, keys.waiters, keys.wake, token, t)
        return None

    def release(handle: object) -> None:
        keys, token, t = cast("tuple[Any, str, int]", handle)
        everywhere("EVALSHA", REDLOCK_RELEASE.sha, 4, keys.lock, keys.fence, keys.waiters, keys.wake, token, t)

    def close() -> None:
        for client, conn in zip(clients, conns, strict=True):
            client.connection_pool.release(conn)
            client.close()

    return Locker(acquire, release, close)


def pottery_redlock(target: Target) -> Locker:
    """pottery's `Redlock`: a new `ThreadPoolExecutor` per call sends to every master; a blocking acquire polls
    after a random pause of U(0, 0.2 s)."""
    from pottery import Redlock  # a bench-only dependency: imported only when this row runs

    masters = [redis.Redis.from_url(url) for url in target.urls]  # default settings, as for the other anchors

    def acquire(name: str, wait: float) -> object | None:
        lock = Redlock(key=name, masters=masters, auto_release_time=TTL)
        got = lock.acquire(blocking=True, timeout=wait) if wait > 0 else lock.acquire(blocking=False)
        return lock if got else None

    def release(handle: object) -> None:
        cast("Any", handle).release()

    def close() -> None:
        for master in masters:
            master.close()

    return Locker(acquire, release, close)


def redlock_ng(target: Target) -> Locker:
    """redlock-ng's sync `Redlock`: one master after the other; a blocking acquire polls after U(0.1, 0.3 s).

    `retry_count=0` so that `wait == 0` is one attempt (its default, 3, retries a non-blocking acquire three times
    with pauses); `blocking=True` has no wait limit (it polls until it gets the lock), so it is what `wait > 0`
    uses. Its clients have its own defaults (socket timeouts 0.1 s).
    """
    import redlock  # optional dependency (./dev bench installs it), untyped: see pyproject mypy overrides

    manager: Any = redlock.Redlock(list(target.urls), retry_count=0)
    ttl_ms = int(TTL * 1000)

    def acquire(name: str, wait: float) -> object | None:
        lock: object | None = manager.acquire(name, ttl_ms, blocking=wait > 0)
        return lock

    def release(handle: object) -> None:
        manager.release(handle)

    def close() -> None:
        for client in manager.client.instances:
            client.close()

    return Locker(acquire, release, close)


REDLOCK3 = Need("redlock", 3)
REDLOCK5 = Need("redlock", 5)


def _register_redlock(need: Need, *, floor: float, subject: float, pottery: float, ng: float,
                      anchor_runs: int, pottery_ref: Reference = Reference(),
                      ng_ref: Reference = Reference()) -> None:
    """The Redlock rows over `need.nodes` nodes. The scales keep each round of each row at a few tenths of a second
    at the default 1000 cycles (2-core VM, split placement: the single-node rows take ~0.2 ms a cycle, fencelock
    Redlock ~0.5-1.2 ms, redlock-ng ~0.6-2.5 ms (nodes one after the other), pottery ~1-6 ms (a thread pool per
    call; anchors.md measured 5.7 ms unpinned))."""
    n = need.nodes
    register(Contender(
        f"floor-rl{n}", f"floor: Redlock by hand, {n} nodes", "floor", need, make=floor_redlock,
        contended=False, cycles_scale=floor,
        note="SET NX PX to every node at once (one thread), EVALSHA release the same way",
    ))
    register(Contender(
        f"fencelock-rl{n}", f"fencelock Redlock, {n} nodes", "subject", need, make=fencelock_sync,
        cycles_scale=subject, runs=2,
        note=f"fencelock.connect([{n} urls]): acquire(ttl=30) / lease.release()",
    ))
    register(Contender(
        f"pottery-rl{n}", f"pottery Redlock, {n} nodes", "anchor", need, make=pottery_redlock,
        cycles_scale=pottery, runs=anchor_runs, reference=pottery_ref,
        note="pottery.Redlock(key=, masters={clients}, auto_release_time=30): thread pool per call",
    ))
    register(Contender(
        f"redlock-ng-rl{n}", f"redlock-ng, {n} nodes", "anchor", need, make=redlock_ng,
        cycles_scale=ng, runs=anchor_runs, reference=ng_ref,
        note="redlock.Redlock([urls], retry_count=0): acquire(name, 30000, blocking=): nodes one after another",
    ))


_register_redlock(REDLOCK3, floor=0.5, subject=0.4, pottery=0.1, ng=0.25, anchor_runs=1)
_register_redlock(REDLOCK5, floor=0.5, subject=0.25, pottery=0.1, ng=0.2, anchor_runs=2,
                  pottery_ref=Reference(uncontended_us=5670, per_s=116, wait_p99_ms=703, longest_ms=995),
                  ng_ref=Reference(uncontended_us=1430, per_s=166, wait_p99_ms=207, longest_ms=312))
register(Contender(
    "floor-scripts-rl5", "floor by hand, fencelock's node scripts, 5 nodes", "info", REDLOCK5,
    make=floor_redlock_scripts, contended=False, cycles_scale=0.25,
    note="the Redlock floor's fan-out with redlock_acquire.lua / redlock_release.lua: the scripts' own cost",
))
register(Contender(
    "fencelock-aio-rl5", "fencelock.aio Redlock, 5 nodes", "info", REDLOCK5, make_async=fencelock_async,
    contended=False, cycles_scale=0.25,
    note="fencelock.aio.connect([5 urls]), one task, for information",
))


# --------------------------------------------------------------------------------------------------------- etcd

def floor_etcd(target: Target) -> Locker:
    """etcd's least work, by hand over the JSON gateway with one httpx client: grant a lease, put the key only if
    absent (one txn); release by revoking the lease (which deletes only the key on it). Three round trips, no
    waiting, no fence check, no confirmation that the key was still ours."""
    import base64

    import httpx  # the etcd extra

    endpoint = "http://" + target.url.removeprefix("etcd://").split(",")[0]
    client = httpx.Client(base_url=endpoint, trust_env=False)

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        lease: object = client.post("/v3/lease/grant", json={"TTL": int(TTL)}).json()["ID"]
        key = base64.b64encode(name.encode()).decode()
        answer = client.post("/v3/kv/txn", json={
            "compare": [{"key": key, "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": key, "value": base64.b64encode(secrets.token_bytes(16)).decode(),
                                         "lease": lease}}]}).json()
        if answer.get("succeeded"):
            return lease
        client.post("/v3/lease/revoke", json={"ID": lease})
        return None

    def release(handle: object) -> None:
        client.post("/v3/lease/revoke", json={"ID": handle})

    return Locker(acquire, release, client.close)


ONE_ETCD = Need("etcd")
ETCD3 = Need("etcd", 3)

for _need, _where in ((ONE_ETCD, "1 member"), (ETCD3, "3 members")):
    _n = _need.nodes
    _suffix = "" if _n == 1 else str(_n)
    register(Contender(
        f"floor-etcd{_suffix}", f"floor: etcd by hand, {_where}", "floor", _need, make=floor_etcd,
        contended=False, cycles_scale=0.3,
        note="httpx on the JSON gateway: lease grant, txn put-if-absent, lease revoke",
    ))
    register(Contender(
        f"fencelock-etcd{_suffix}", f"fencelock etcd, {_where}", "subject", _need, make=fencelock_sync,
        cycles_scale=0.2, runs=2,
        note="fencelock.connect('etcd://...'): acquire(ttl=30) / lease.release(): grant, txn, txn, revoke",
    ))
register(Contender(
    "fencelock-aio-etcd", "fencelock.aio etcd, 1 member", "info", ONE_ETCD, make_async=fencelock_async,
    contended=False, cycles_scale=0.2,
    note="fencelock.aio.connect('etcd://...'), one task, for information",
))


# ---------------------------------------------------------------------------------------------------- ZooKeeper

def _kazoo_client(target: Target) -> Any:
    """A started kazoo client with its defaults (10 s session), at the host list of a `zookeeper://` URL."""
    from kazoo.client import KazooClient  # a bench-only dependency: imported only when this row runs

    from fencelock._zk.url import parse_zookeeper_url

    client = KazooClient(hosts=parse_zookeeper_url(target.url).hosts_string)
    client.start(timeout=10)
    return client


def _kazoo_close(client: Any) -> Callable[[], None]:
    def close() -> None:
        client.stop()
        client.close()

    return close


def floor_zookeeper(target: Target) -> Locker:
    """By hand with kazoo: create an ephemeral sequential node, list the children, delete it. No waiting, no TTL,
    no fence: the least a correct ZooKeeper lock does (the holder is known only once the queue is read)."""
    client = _kazoo_client(target)
    root = "/bench-floor"

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        path: str = client.create(f"{root}/{name}/{secrets.token_hex(16)}-", ephemeral=True, sequence=True,
                                  makepath=True)
        children = sorted(client.get_children(f"{root}/{name}"), key=lambda child: child[-10:])
        if path.rsplit("/", 1)[1] == children[0]:
            return path
        client.delete(path)
        return None

    def release(handle: object) -> None:
        client.delete(cast(str, handle))

    return Locker(acquire, release, _kazoo_close(client))


def kazoo_lock(target: Target) -> Locker:
    """kazoo's own `Lock` recipe: a uuid-prefixed ephemeral sequential node, each waiter watches its predecessor.
    Its lock lives as long as the client's session (10 s by default): it has no TTL of its own."""
    from kazoo.recipe.lock import Lock

    client = _kazoo_client(target)

    def acquire(name: str, wait: float) -> object | None:
        lock = Lock(client, f"/bench-kazoo/{name}")
        got = lock.acquire(blocking=wait > 0, timeout=wait if wait > 0 else None)
        return lock if got else None

    def release(handle: object) -> None:
        cast("Any", handle).release()

    return Locker(acquire, release, _kazoo_close(client))


ZOOKEEPER = Need("zookeeper")

register(Contender(
    "floor-zk", "floor: ZooKeeper by hand (kazoo)", "floor", ZOOKEEPER, make=floor_zookeeper, contended=False,
    cycles_scale=0.5,
    note="create ephemeral sequential + get_children + delete, with kazoo",
))
register(Contender(
    "fencelock-zk", "fencelock ZooKeeper", "subject", ZOOKEEPER, make=fencelock_sync, cycles_scale=0.5,
    note="fencelock.connect('zookeeper://...'): acquire(ttl=30) / lease.release()",
))
register(Contender(
    "kazoo-lock", "kazoo Lock recipe", "anchor", ZOOKEEPER, make=kazoo_lock, cycles_scale=0.5,
    note="kazoo.recipe.lock.Lock(client, path).acquire(blocking=, timeout=): watches its predecessor",
))
register(Contender(
    "fencelock-aio-zk", "fencelock.aio ZooKeeper", "info", ZOOKEEPER, make_async=fencelock_async,
    contended=False, cycles_scale=0.5,
    note="fencelock.aio.connect('zookeeper://...'), one task, for information",
))
