"""The scenarios: each injects one classic fault for real, against real servers and real worker processes.

A scenario records `fault` events saying what it did and whether it took effect; `history.judge` decides.
This module holds the cells' machinery and the scenarios without data loss; `scenarios_loss` holds those with
(4, 5), and `catalog.SCENARIOS` lists them all.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import redis

from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisServer

from .._redis.keys import redis_keys
from .configs import Config, Service, faketime_missing, start_redis, start_redlock
from .history import Event, Evidence
from .procs import WorkerPool, WorkerProc
from .resource import Resource

Expect = Literal["SAFE", "UNSAFE"]

#: Longer than the workers' socket timeout: requests queued on a stopped node die with their connections before
#: it resumes (otherwise the node would grant them late, which is a different fault).
QUEUED_DIE = 0.4


class Skip(Exception):
    """The scenario cannot run for this configuration (the message says why)."""


class Lab:
    """What all cells of one run share: the worker pool and the long-lived lock services."""

    def __init__(self, *, quick: bool, seed: int) -> None:
        self.quick = quick
        self.seed = seed
        self.pool = WorkerPool(spare=3)
        self._services: dict[str, Service] = {}
        #: the base TTL of a cell's leases, in seconds
        self.ttl = 0.4 if quick else 0.6

    def service(self, config: Config) -> Service:
        if config.kind not in self._services:
            self._services[config.kind] = config.start()
        return self._services[config.kind]

    def close(self) -> None:
        self.pool.close()
        for svc in self._services.values():
            svc.close()
        self._services.clear()


class Cell:
    """One run of one scenario on one configuration."""

    def __init__(self, lab: Lab, config: Config, scenario: Scenario, rng: random.Random) -> None:
        self.lab = lab
        self.config = config
        self.scenario = scenario
        self.rng = rng
        self.name = f"lab:{scenario.id}:{config.id}:{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}"
        self.resource = Resource(guarded=config.fenced).start()
        self.faults: list[Event] = []
        self.workers: list[WorkerProc] = []
        self._cleanups: list[Callable[[], None]] = []
        self.started = time.monotonic()
        # a little seeded jitter on every pause, so repeated runs do not all hit the same instant
        self.jitter = 1.0 + rng.uniform(0.0, 0.15)

    @property
    def ttl(self) -> float:
        return max(self.lab.ttl, self.config.min_ttl)

    def service(self) -> Service:
        return self.lab.service(self.config)

    def cleanup(self, fn: Callable[[], None]) -> None:
        self._cleanups.append(fn)

    def worker(self, role: str, svc: Service | None = None, *, target: Any = None,
               resource: tuple[str, int] | None = None, options: dict[str, Any] | None = None) -> WorkerProc:
        svc = svc if svc is not None else (self.service() if target is None else None)
        w = self.lab.pool.take(role)
        self.workers.append(w)
        w.call("connect", role=role, name=self.name, target=target if target is not None else svc.target()
               if svc else None, resource=list(resource or self.resource.address),
               options=options if options is not None else (svc.options if svc else {}))
        return w

    def proxy(self, address: tuple[str, int], **kw: Any) -> Proxy:
        p = Proxy(*address, **kw).start()
        self.cleanup(p.close)
        return p

    def fault(self, detail: str, *, ok: bool | None = True, worker: str = "lab", fence: int | None = None) -> None:
        self.faults.append(Event(time.monotonic(), worker, "fault", fence=fence, ok=ok, detail=detail))

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds * self.jitter)

    def events(self) -> list[Event]:
        out = list(self.faults) + self.resource.events()
        for w in self.workers:
            out += w.peek_events()
        return sorted(out, key=lambda e: e.t)

    def close(self) -> None:
        for w in self.workers:
            if w.paused:
                w.resume()
        for fn in reversed(self._cleanups):
            try:
                fn()
            except Exception:
                pass
        self.lab.pool.give_back()
        self.resource.close()


@dataclass
class Scenario:
    id: str
    number: int
    title: str
    fault: str
    source: str
    run: Callable[[Cell], None]
    expect: Callable[[Config], Expect]
    applies: Callable[[Config], str | None] = lambda c: None   # why it does not apply (None: it does)
    evidence: Evidence = "overlap"
    kinds: tuple[str, ...] = field(default=("redis", "redlock", "etcd", "zookeeper"))
    not_applicable: str = ""   # why the other kinds of configuration do not have this fault
    beyond: Callable[[Config], str | None] = lambda c: None  # why fencelock is SAFE where the literature is not
    # why a cell is UNSAFE although fencelock does better elsewhere: the edge of one of its stated assumptions
    boundary: Callable[[Config], str | None] = lambda c: None

    def skip_reason(self, config: Config) -> str | None:
        if config.kind not in self.kinds:
            return f"not applicable to {config.kind}: {self.not_applicable}" if self.not_applicable else \
                f"not applicable to {config.kind}"
        return self.applies(config)


def fenced_only(config: Config) -> Expect:
    """What the literature predicts for a holder that acts after its lease ended: only a fence saves it."""
    return "SAFE" if config.fenced else "UNSAFE"


def always(verdict: Expect) -> Callable[[Config], Expect]:
    return lambda config: verdict


# -- helpers -------------------------------------------------------------------------------------------------


def _acquire(w: WorkerProc, ttl: float, wait: float = 2.0, **kw: Any) -> int:
    reply = w.call("acquire", ttl=ttl, wait=wait, **kw)
    if not reply.get("ok"):
        raise RuntimeError(f"{w.role} could not take the lock at the start of the scenario: {reply}")
    return int(reply["fence"])


def _takes_over(b: WorkerProc, ttl: float, wait: float) -> None:
    """B asks for the lock while the fault holds A's; once granted it does its read-modify-write at once."""
    if b.call("acquire", ttl=ttl, wait=wait)["ok"]:
        b.call("rmw")


def _finish(a: WorkerProc, b: WorkerProc) -> None:
    """The end of most stories: A releases (however that goes), B writes once more and releases."""
    a.call("release")
    b.call("rmw")
    b.call("release")


def _stopped(cell: Cell, nodes: list[RedisServer], which: list[int], action: Callable[[], Any],
             why: str) -> Any:
    """Run `action` while some nodes are stopped, and let its requests queued on them die before they resume."""
    for i in which:
        nodes[i].pause()
    cell.fault(f"nodes {' and '.join(map(str, which))} are stopped (SIGSTOP): {why}")
    try:
        result = action()
        time.sleep(QUEUED_DIE)
    finally:
        for i in which:
            nodes[i].resume()
    return result


def _lock_key_on(node: RedisServer, name: str) -> bytes | None:
    client = redis.Redis(host=node.host, port=node.port, socket_timeout=2)
    try:
        value: Any = client.get(redis_keys(name).lock)
        return None if value is None else bytes(value)
    finally:
        client.close()


def _wait_gone(node: RedisServer, name: str, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _lock_key_on(node, name) is None:
            return True
        time.sleep(0.02)
    return False


# -- 1, 2, 3: the holder acts after its lease ended ------------------------------------------------------------


def pause_past_ttl(cell: Cell) -> None:
    t = cell.ttl
    a, b = cell.worker("A"), cell.worker("B")
    _acquire(a, t)
    a.call("read")
    a.pause()
    cell.fault(f"A is stopped with SIGSTOP (a GC pause) for longer than its {t:g} s TTL", worker="A")
    cell.sleep(t * 1.3)
    _takes_over(b, t * 6, t * 3)
    a.resume()
    cell.fault("A continues (SIGCONT) and writes what it computed before the pause", worker="A")
    a.call("write")
    _finish(a, b)


def pause_after_check(cell: Cell) -> None:
    t = cell.ttl
    a, b = cell.worker("A"), cell.worker("B")
    _acquire(a, t)
    a.call("read")
    check = a.call("check")
    a.pause()
    cell.fault(f"A asked 'is my lease still valid?' ({'yes' if check['valid'] else 'no'}, "
               f"{check['remaining']:.3f} s left) and is stopped (SIGSTOP) before its write", worker="A",
               ok=bool(check["valid"]))
    cell.sleep(t * 1.3)
    _takes_over(b, t * 6, t * 3)
    a.resume()
    a.call("write")
    _finish(a, b)


def network_delay(cell: Cell) -> None:
    t = cell.ttl
    link = cell.proxy(cell.resource.address, name="resource-link", delay_replies=False)
    a, b = cell.worker("A", resource=(link.host, link.port)), cell.worker("B")
    _acquire(a, t)
    a.call("read")
    delay = t * 3
    link.delay = delay
    cell.fault(f"the network from A to the resource now delays every packet by {delay:g} s", worker="A")
    a.send("write")  # sent now, while A's lease is valid; it arrives after the lease ended
    cell.sleep(t * 1.3)
    _takes_over(b, t * 8, t * 3)
    a.wait_reply(delay + 10)
    link.delay = 0.0
    _finish(a, b)


# -- 6: clock jump -----------------------------------------------------------------------------------------------


def _no_faketime(config: Config) -> str | None:
    why = faketime_missing()
    return f"libfaketime cannot run here: {why}" if why else None


def clock_jump(cell: Cell) -> None:
    t = cell.ttl
    redlock = cell.config.kind == "redlock"
    svc = start_redlock(clock=True) if redlock else start_redis(clock=True)
    cell.cleanup(svc.close)
    assert svc.clock_stamp is not None
    jumper: RedisServer = svc.servers.nodes[2] if redlock else svc.servers
    a, b = cell.worker("A", svc), cell.worker("B", svc)
    if redlock:
        _stopped(cell, svc.servers.nodes, [3, 4], lambda: _acquire(a, t * 10, wait=1.0),
                 "A takes the lock on nodes 0, 1 and 2 only")
    else:
        _acquire(a, t * 10, wait=1.0)
    a.call("read")
    svc.clock_stamp.write_text("+60s")
    gone = _wait_gone(jumper, cell.name)
    cell.fault(f"{'node 2' if redlock else 'the lock server'}'s clock jumps 60 s forward (libfaketime): "
               "A's key there expires at once, while A's own clock says it has time left", ok=gone)
    if redlock:
        got = _stopped(cell, svc.servers.nodes, [0, 1], lambda: b.call("acquire", ttl=t * 10, wait=1.0),
                       "B reaches only nodes 2, 3 and 4")
    else:
        got = b.call("acquire", ttl=t * 10, wait=1.0)
    if got.get("ok"):
        b.call("rmw")
    a.call("write", only_if_valid=True)
    _finish(a, b)


# -- 7: partition from the lock service ------------------------------------------------------------------------


def partition(cell: Cell) -> None:
    t = cell.ttl
    svc = cell.service()
    proxies = [cell.proxy(ep, name="lock-link") for ep in svc.endpoints]
    a = cell.worker("A", target=svc.target([(p.host, p.port) for p in proxies]), options=svc.options)
    b = cell.worker("B")
    _acquire(a, t, renew=True)
    a.send("write_loop", every=t / 5, duration=t * 3)
    cell.sleep(t / 3)
    for p in proxies:
        p.stall()
    cell.fault("A is cut off from the lock service (a stalling proxy drops nothing, delivers nothing); it still "
               "reaches the resource, and it keeps writing", worker="A")
    if b.call("acquire", ttl=t * 8, wait=t * 4)["ok"]:
        b.call("rmw")
        time.sleep(t / 4)
        b.call("rmw")
    a.wait_reply(t * 10)
    for p in proxies:
        p.heal()
    _finish(a, b)


# -- 8: a stale holder releases or extends -----------------------------------------------------------------------


def _needs_redis_protocol(config: Config) -> str | None:
    return None if config.kind in ("redis", "redlock") else "a naive DEL/PEXPIRE needs a Redis-protocol lock"


def _stale_holder(cell: Cell) -> tuple[WorkerProc, WorkerProc, WorkerProc]:
    t = cell.ttl
    a, b, c = cell.worker("A"), cell.worker("B"), cell.worker("C")
    _acquire(a, t)
    a.call("read")
    a.pause()
    cell.fault(f"A is stopped (SIGSTOP) past its {t:g} s TTL", worker="A")
    cell.sleep(t * 1.3)
    _takes_over(b, t * 8, t * 3)
    a.resume()
    return a, b, c


def stale_naive(cell: Cell) -> None:
    t = cell.ttl
    a, b, c = _stale_holder(cell)
    extended = a.call("naive_extend", ttl=t)
    cell.fault("A renews with a plain PEXPIRE (no owner check): " +
               ("it succeeds on B's key, so A believes it still holds the lock" if extended["ok"] else
                "it found no key"), worker="A", ok=bool(extended["ok"]))
    a.call("write")
    released = a.call("naive_release")
    cell.fault("A releases with a plain DEL (no owner check): " +
               ("it deletes B's key" if released["ok"] else "it found no key"), worker="A", ok=bool(released["ok"]))
    if c.call("acquire", ttl=t * 8, wait=0)["ok"]:
        c.call("rmw")
    b.call("rmw")
    c.call("release")
    b.call("release")


def stale_scripts(cell: Cell) -> None:
    t = cell.ttl
    a, b, c = _stale_holder(cell)
    extended = a.call("extend", ttl=t)
    released = a.call("release")
    taken = c.call("acquire", ttl=t * 8, wait=0)
    refused = not extended["ok"] and not released["ok"] and not taken["ok"]
    cell.fault("A's stale extend and release go through fencelock's compare-and-pexpire / compare-and-delete "
               + ("scripts: both refused (LockLost), B's key kept, C is refused" if refused else
                  f"scripts: extend ok={extended['ok']}, release ok={released['ok']}, C got it={taken['ok']}"),
               worker="A", ok=refused)
    if taken["ok"]:
        c.call("rmw")
        c.call("release")
    b.call("rmw")
    b.call("release")


# -- 9: blocked event loop ---------------------------------------------------------------------------------------


def blocked_loop(cell: Cell) -> None:
    t = cell.ttl
    a, b = cell.worker("A"), cell.worker("B")
    block = t * 3
    a.send("loop_blocked", ttl=t, wait=2.0, block=block)
    deadline = time.monotonic() + 10
    while not any(e.kind == "fault" for e in a.peek_events()):
        if time.monotonic() > deadline:
            raise RuntimeError("A never started its blocking call")
        time.sleep(0.01)
    cell.sleep(t * 1.3)
    _takes_over(b, t * 8, t * 3)
    a.wait_reply(block + 10)
    b.call("rmw")
    b.call("release")


KLEPPMANN = "Kleppmann, How to do distributed locking (2016)"
ANTIREZ = "antirez, Is Redlock safe? (2016)"
REDLOCK = "redis.io, Distributed Locks with Redis (the Redlock page)"
JEPSEN = "Jepsen, etcd 3.4.3 (2020)"

#: The scenarios of this module (all of them, with the data-loss ones: `catalog.SCENARIOS`).
SCENARIOS: list[Scenario] = [
    Scenario("1", 1, "holder paused past its TTL, then writes",
             "SIGSTOP of the holder's process for longer than its TTL", KLEPPMANN, pause_past_ttl, fenced_only),
    Scenario("2", 2, "pause between 'is my lease valid?' and the write",
             "SIGSTOP right after the holder checked its lease", f"{KLEPPMANN}; {ANTIREZ}", pause_after_check,
             fenced_only),
    Scenario("3", 3, "the holder's write is delayed in the network past its TTL",
             "a TCP proxy in front of the resource delays every packet from the holder by 3 TTL", KLEPPMANN,
             network_delay, fenced_only),
    Scenario("6", 6, "a lock server's clock jumps forward",
             "libfaketime moves the server's clock 60 s ahead; the lock key expires early",
             f"{KLEPPMANN} (timing assumptions); {ANTIREZ}", clock_jump, fenced_only, _no_faketime,
             kinds=("redis", "redlock"), not_applicable="the lab moves clocks with libfaketime, which works on "
             "the Valkey binary only; etcd (Go) and ZooKeeper (Java) read time in ways it does not intercept"),
    Scenario("7", 7, "the holder is cut off from the lock service but still reaches the resource",
             "a stalling TCP proxy between the holder and the lock service; renewals cannot get through",
             f"{JEPSEN}; {KLEPPMANN}", partition, fenced_only),
    Scenario("8a", 8, "a stale holder extends and releases with naive PEXPIRE / DEL",
             "after a pause past its TTL the holder sends PEXPIRE and DEL without checking it owns the key",
             f"{REDLOCK} (safe release); {KLEPPMANN}", stale_naive, fenced_only, _needs_redis_protocol),
    Scenario("8b", 8, "a stale holder extends and releases through the compare-and-delete scripts",
             "after a pause past its TTL the holder extends and releases through fencelock",
             f"{REDLOCK} (safe release)", stale_scripts, always("SAFE"), evidence="fault"),
    Scenario("9", 9, "an asyncio event loop blocked long enough to miss renewals",
             "a blocking call inside `async with locks.lock()` holds the loop for 3 TTL",
             KLEPPMANN + " (process pauses)", blocked_loop, fenced_only),
]


__all__ = ["ANTIREZ", "JEPSEN", "KLEPPMANN", "QUEUED_DIE", "REDLOCK", "SCENARIOS", "Cell", "Lab", "Scenario",
           "Skip", "always", "fenced_only"]
