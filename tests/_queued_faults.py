"""A burst of acquires queued inside one asyncio client, a fault injected while they wait, and what must hold after
it (issue 14, decision 2026-12-05-queued-faults): shared by the Redis, Redlock and etcd tests of queued faults.

`burst` starts `ours` acquires through one client (`locks`) and, at once, a competing client's acquires of part of
the same names; once requests wait in the client's queue (`queued() > 0`), it injects `fault`, and collects each
call's outcome. The checks read the servers through the test's own clients (`kept`).

`Network` does the network's faults instead (decision 2026-12-05-queued-network-faults): the client under test
connects through `FaultProxy`s (the rival and the checks straight to the servers), and rules fault some of the
burst's requests as they leave the client's queue: a reply lost, the connection then reset (`reset_after`); a reply
lost, the client left to time out (`lose`); a reply held back past the client's socket timeout, then delivered
(`late`); the connection reset before the request reaches the server (`reset_before`); the idle connections
closed by the server, and the next requests meeting a connection the server closed as they came (`idle`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fencelock import LockError, _scripts
from fencelock.testing.faults import CLOSE, LATE, LOSE, RESET_AFTER, RESET_BEFORE, FaultProxy, Request, Rule
from fencelock.testing.servers import RedisServer


@dataclass
class Outcome:
    client: str
    name: str
    lease: Any = None
    error: BaseException | None = None
    cancelled: bool = False
    took: float = 0.0


@dataclass
class Burst:
    outcomes: list[Outcome]
    queued_at_fault: int
    tasks: list[asyncio.Task[Outcome]]

    def granted(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.lease is not None]


async def _one(client: str, locks: Any, name: str, ttl: float, wait: float) -> Outcome:
    outcome = Outcome(client, name)
    started = time.monotonic()
    try:
        outcome.lease = await locks.acquire(name, ttl=ttl, wait=wait, renew=False)
    except asyncio.CancelledError:
        outcome.cancelled = True
        raise
    except BaseException as exc:  # (checked: every error must be a fencelock error naming the lock)
        outcome.error = exc
    finally:
        outcome.took = time.monotonic() - started
    return outcome


async def burst(locks: Any, rival: Any, names: list[str], contested: int, ttl: float, wait: float,
                queued: Callable[[], int], fault: Callable[[list[asyncio.Task[Outcome]]], Awaitable[None]],
                limit: float) -> Burst:
    """`names` acquired through `locks`, the first `contested` of them at once through `rival` too; `fault` runs
    (given `locks`' tasks) once `queued()` shows requests waiting in the client. Every call ends within `limit`."""
    ours = [asyncio.ensure_future(_one("ours", locks, name, ttl, wait)) for name in names]
    theirs = [asyncio.ensure_future(_one("rival", rival, name, ttl, wait)) for name in names[:contested]]
    deadline = time.monotonic() + 5.0
    while queued() == 0 and time.monotonic() < deadline:  # noqa: ASYNC110 (the client's own state: no event)
        await asyncio.sleep(0.001)
    depth = queued()
    await fault(ours)
    _, pending = await asyncio.wait([*ours, *theirs], timeout=limit)
    assert not pending, f"{len(pending)} calls still running {limit} s after the burst began"
    outcomes: list[Outcome] = []
    for task, name in zip([*ours, *theirs], [*names, *names[:contested]], strict=True):
        if task.cancelled():
            outcomes.append(Outcome("ours", name, cancelled=True))
        else:
            outcomes.append(task.result())
    return Burst(outcomes, depth, ours)


def check_errors(result: Burst, limit: float) -> None:
    """Every call that failed raised a fencelock error naming its lock, and ended within `limit`."""
    foreign = [(o.name, repr(o.error)) for o in result.outcomes
               if o.error is not None and not (isinstance(o.error, LockError) and o.error.name == o.name)]
    assert not foreign, f"errors that are not a fencelock error naming the lock: {foreign[:5]}"
    slow = [(o.name, round(o.took, 2)) for o in result.outcomes if o.took > limit]
    assert not slow, f"calls that took longer than {limit} s: {slow[:5]}"


def check_claims(result: Burst, kept: Callable[[list[Any]], list[float | None]], rounding: float = 0.001) -> None:
    """No two granted leases of one name both claim validity, and none claims more than the server keeps for its
    token (`kept`: seconds left per lease, None if its token is not there; `rounding`: the server's own)."""
    leases = [o.lease for o in result.granted()]
    left = kept(leases)
    # (after the servers: a claim only falls since, so one read later than the server's answer is never favoured;
    # read before, a slow server read, as etcd's one lease at a time, would make the server look short)
    claims = [lease.remaining() for lease in leases]
    held = [lease.held for lease in leases]
    by_name: dict[str, list[Any]] = {}
    for lease, claim, is_held in zip(leases, claims, held, strict=True):
        if claim > 0 and is_held:
            by_name.setdefault(lease.name, []).append(lease)
    twice = [name for name, valid in by_name.items() if len(valid) > 1]
    assert not twice, f"names with two leases that both claim validity: {twice[:5]}"
    over = [(lease.name, round(claim, 3), server) for lease, claim, is_held, server
            in zip(leases, claims, held, left, strict=True)
            if claim > 0 and is_held and (server is None or claim > server + rounding)]
    assert not over, f"remaining() above what the server keeps (name, claimed, kept): {over[:5]}"


async def settle(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """`check()` once it is true (the client's background give-backs have run), else its last value."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        value = check()
    return value


async def release_all(result: Burst) -> None:
    for o in result.granted():
        try:
            await o.lease.release()
        except LockError:
            pass


async def inject(fault: str, tasks: list[asyncio.Task[Outcome]], locks: Any, *, pause: Callable[[], None],
                 resume: Callable[[], None], kill: Callable[[], object] | None = None) -> None:
    """The fault named `fault` while `tasks` are queued in `locks`: `pause*` stops the server (`pause`) for 1 s,
    or 3.5 s (`_long`, past the keeper's TTL), cancelling every other caller (`_cancel`) or closing the client
    (`_close`) meanwhile; `kill` kills its connections; `cancel` cancels every other caller; `close` closes."""
    if fault.startswith(("pause", "stall")):
        pause()
        closing = None
        if fault.endswith(("cancel", "close")):  # (while it is paused: callers queued behind hanging requests)
            await asyncio.sleep(0.3)
            if fault.endswith("cancel"):
                for task in tasks[::2]:
                    task.cancel()
            else:
                closing = asyncio.ensure_future(locks.aclose())
        await asyncio.sleep(3.5 if fault.endswith("long") else 1.0)
        resume()
        if closing is not None:
            await closing
    elif fault == "kill":
        assert kill is not None, "this backend has no kill fault"
        kill()
    elif fault == "cancel":
        for task in tasks[::2]:
            task.cancel()
    else:
        await locks.aclose()


NETWORK = ["reset_after", "lose", "late", "reset_before", "idle"]
"""The network's faults (`Network`), as the single-request fault matrix has them (tests/matrix/cells.py)."""

SOCKET_TIMEOUT = 1.0
"""Redis clients under test behind a proxy: a lost reply costs one this long (etcd's: its URL's `timeout`)."""
LATE_BY = 1.5
"""A late reply comes this long after the server's: past `SOCKET_TIMEOUT`."""

_KINDS = {"reset_after": RESET_AFTER, "lose": LOSE, "late": LATE, "reset_before": RESET_BEFORE, "idle": CLOSE}


class Network:
    """The network fault `fault` on the requests named `match` that pass `proxies` (every client connection of the
    client under test): `count` of them per proxy, the first as the fault is injected, the others every `spread`
    requests after it, so that they come while the client's queue drains; a late reply comes `late` seconds
    after the server's (past the client's socket timeout). `idle` first closes every idle connection, as a
    server's idle timeout does, then closes connections under the next requests as they come (FIN, not run)."""

    def __init__(self, fault: str, proxies: list[FaultProxy], match: str, *, late: float, count: int = 4,
                 spread: int = 25) -> None:
        self.fault, self.proxies, self.match = fault, proxies, match
        self.late, self.count, self.spread = late, count, spread
        self.rules: list[Rule] = []
        self.depths: list[int] = []  # the client's queue as each rule fired
        self.closed = 0

    async def inject(self, queued: Callable[[], int]) -> None:
        """Arm the rules (and close the idle connections); return once every rule fired, or after 5 s."""
        def hit(request: Request) -> None:  # (on the proxy's thread: a deque's length, read without its lock)
            self.depths.append(queued())
        kind = _KINDS[self.fault]
        for proxy in self.proxies:
            for i in range(self.count):
                self.rules.append(proxy.arm(Rule(kind, self.match, nth=1 + i * self.spread, on_hit=hit,
                                                 delay=self.late if kind == LATE else 0.0)))
        if self.fault == "idle":
            for proxy in self.proxies:
                self.closed += await asyncio.to_thread(proxy.close_idle)
        deadline = time.monotonic() + 5.0
        for rule in self.rules:
            await asyncio.to_thread(rule.hit.wait, max(0.0, deadline - time.monotonic()))

    def end(self) -> str:
        """Disarm what did not fire; what went wrong with the fault itself ("" if nothing): a rule that never
        fired, or one that fired with nothing queued in the client."""
        for proxy in self.proxies:
            proxy.clear()
        unfired = [rule for rule in self.rules if not rule.hit.is_set()]
        if unfired:
            return f"{len(unfired)} of {len(self.rules)} {self.fault} faults on {self.match!r} never fired"
        if not self.rules or min(self.depths, default=0) == 0:
            return f"a {self.fault} fault came with nothing queued in the client (queue at each: {self.depths})"
        return ""


@contextlib.contextmanager
def own_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own, resumed before it is closed if a fault left it paused."""
    started = RedisServer().start()
    try:
        yield started
    finally:
        if started.paused:
            started.resume()
        started.close()


@contextlib.contextmanager
def proxied(server: RedisServer) -> Iterator[FaultProxy]:
    """A proxy in front of a Redis `server`; every fencelock script is loaded first, so that a fault meets the
    request that does the work, not a NOSCRIPT answer before it."""
    client: Any = server.client()
    for lua in vars(_scripts).values():
        if isinstance(lua, _scripts.Lua):
            client.script_load(lua.source)
    with FaultProxy("127.0.0.1", server.port, name=f"queued-{server.port}") as proxy:
        yield proxy
