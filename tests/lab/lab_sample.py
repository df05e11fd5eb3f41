"""A realistic results dict, as `fencelock lab` writes it: nine scenarios x six configurations.

The stories follow what the lab really does (and what the literature predicts): an unfenced lock lets a paused
holder's stale write through, a guard rejects it; a counter that fails over with the lock does not save the guard;
ZooKeeper is not installed, so its column is SKIPPED. A few cells are deliberately awkward for the report: one whose
outcome differs from the literature, a FAULT-MISSED one, an ERROR whose note carries markup that must stay inert,
workers and details with HTML metacharacters, fences that are null (a lock without fencing tokens), a worker that
takes the lock twice, and a write that never got an answer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

# The markup a hostile or careless error message could carry; the report must show it as text.
SCRIPT_NOTE = "<script>document.body.setAttribute('data-pwned','yes')</script>"

CONFIGS: list[dict[str, Any]] = [
    {"id": "redis", "title": "single Redis, no fencing", "available": True, "why_unavailable": None},
    {"id": "redis-guard", "title": "single Redis + guard", "available": True, "why_unavailable": None},
    {"id": "redlock", "title": "Redlock (5 nodes), no fencing", "available": True, "why_unavailable": None},
    {"id": "redlock-guard", "title": "Redlock + fencing guard", "available": True, "why_unavailable": None},
    {"id": "etcd-guard", "title": "etcd + guard", "available": True, "why_unavailable": None},
    {"id": "zk-guard", "title": "ZooKeeper + guard", "available": False,
     "why_unavailable": "ZooKeeper is not installed: /usr/share/java/zookeeper.jar not found"},
]

KLEPPMANN = "Kleppmann 2016, How to do distributed locking"
ANTIREZ = "antirez 2016, Is Redlock safe?"
REDLOCK_PAGE = "Redis docs, Distributed Locks with Redis"
JEPSEN_ETCD = "Jepsen 2020, etcd 3.4.3"

SCENARIOS: list[dict[str, Any]] = [
    {"id": "pause-past-ttl", "number": 1, "title": "Holder paused past its TTL, then writes",
     "fault": "SIGSTOP on the holder for 1.5 x TTL (a GC pause)", "source": f"{KLEPPMANN} (the GC-pause figure)"},
    {"id": "pause-check-write", "number": 2, "title": "Pause between the validity check and the write",
     "fault": "SIGSTOP right after lease.remaining() > 0", "source": f"{KLEPPMANN}; {ANTIREZ}"},
    {"id": "delayed-write", "number": 3, "title": "Write delayed in the network past the TTL",
     "fault": "a TCP proxy in front of the resource holds the write for 1.5 s", "source": KLEPPMANN},
    {"id": "failover", "number": 4, "title": "Failover before the lock reached the replica",
     "fault": "primary killed before replication; the replica is promoted", "source": f"{REDLOCK_PAGE} (replication)"},
    {"id": "restart-no-fsync", "number": 5, "title": "Redlock node restarts without fsync",
     "fault": "kill -9 one node holding the lock, restart it at once with no AOF",
     "source": f"{REDLOCK_PAGE}; {KLEPPMANN}"},
    {"id": "clock-jump", "number": 6, "title": "A lock server's clock jumps forward",
     "fault": "faketime +20 s on one server: its keys expire early", "source": f"{KLEPPMANN}; {ANTIREZ}"},
    {"id": "cut-off", "number": 7, "title": "Holder cut off from the lock service, not from the resource",
     "fault": "a stalling proxy between the holder and the lock service", "source": JEPSEN_ETCD},
    {"id": "stale-release", "number": 8, "title": "A stale holder releases or extends",
     "fault": "naive DEL / PEXPIRE after the lease expired", "source": f"{REDLOCK_PAGE} (safe release)"},
    {"id": "blocked-loop", "number": 9, "title": "asyncio event loop blocked past the renewals",
     "fault": "time.sleep(1.5) inside the event loop", "source": f"{JEPSEN_ETCD}; {KLEPPMANN}"},
]

GUARDED = {"redis-guard", "redlock-guard", "etcd-guard", "zk-guard"}


class _Cell:
    """Builds one cell's events; times are seconds since the cell started."""

    def __init__(self, fences: bool) -> None:
        self.fences = fences
        self.events: list[dict[str, Any]] = []

    def _add(self, t: float, worker: str, kind: str, fence: int | None = None, ok: bool | None = None,
             lease_end: float | None = None, detail: str = "") -> None:
        self.events.append({"t": round(t, 4), "worker": worker, "kind": kind,
                            "fence": fence if self.fences else None, "ok": ok,
                            "lease_end": None if lease_end is None else round(lease_end, 4), "detail": detail})

    def acquire(self, t: float, worker: str, fence: int, ttl: float = 1.0, detail: str = "") -> None:
        self._add(t, worker, "acquire", fence, True, t + ttl, detail)

    def refused(self, t: float, worker: str, detail: str = "busy") -> None:
        self._add(t, worker, "acquire", None, False, None, detail)

    def write(self, t: float, worker: str, fence: int, ok: bool | None, detail: str = "") -> None:
        self._add(t, worker, "write", fence, ok, None, detail)

    def release(self, t: float, worker: str, fence: int, ok: bool, detail: str = "") -> None:
        self._add(t, worker, "release", fence, ok, None, detail)

    def lost(self, t: float, worker: str, fence: int, detail: str = "on_lost: validity ran out") -> None:
        self._add(t, worker, "lost", fence, None, None, detail)

    def expire(self, t: float, worker: str, fence: int, detail: str = "key expired on the server") -> None:
        self._add(t, worker, "expire", fence, None, None, detail)

    def fault(self, t: float, worker: str, detail: str) -> None:
        self._add(t, worker, "fault", None, None, None, detail)


# A story adds one cell's events and returns what the lab's checker counted: (overlaps, stale writes accepted).
Story = Callable[[_Cell, bool], tuple[int, int]]


def _pause_past_ttl(c: _Cell, guarded: bool) -> tuple[int, int]:
    c.acquire(0.05, "w1", 1)
    c.write(0.15, "w1", 1, True, "counter 0 -> 1")
    c.fault(0.30, "w1", "SIGSTOP w1")
    c.refused(0.40, "w2")
    c.expire(1.05, "w1", 1)
    c.acquire(1.10, "w2", 2)
    c.write(1.20, "w2", 2, True, "counter 1 -> 2")
    c.release(1.40, "w2", 2, True)
    c.fault(1.80, "w1", "SIGCONT w1 (paused 1.5 s)")
    c.write(1.85, "w1", 1, not guarded, "counter 1 -> 2 (read before the pause)")
    c.release(1.90, "w1", 1, False, "LockLost: the lease had expired")
    return 1, 0 if guarded else 1


def _pause_check_write(c: _Cell, guarded: bool) -> tuple[int, int]:
    # As the lab really records it: a long pause, then everything within a few milliseconds.
    c.acquire(0.05, "w1", 4)
    c.fault(0.90, "w1", "SIGSTOP w1 after remaining() = 0.14 s")
    c.expire(1.05, "w1", 4)
    c.acquire(1.580, "w2", 5)
    c.write(1.590, "w2", 5, True)
    c.fault(1.600, "w1", "SIGCONT w1")
    c.write(1.605, "w1", 4, not guarded, "checked valid 0.7 s earlier")
    c.release(1.610, "w2", 5, True)
    c.release(1.615, "w1", 4, False, "LockLost")
    return 1, 0 if guarded else 1


def _delayed_write(c: _Cell, guarded: bool) -> tuple[int, int]:
    c.acquire(0.05, "w1", 7)
    c.fault(0.40, "w1", "proxy holds w1's writes for 1.5 s")
    c.release(0.45, "w1", 7, True, "released after sending the write")
    c.acquire(0.50, "w2", 8)
    c.write(0.60, "w2", 8, True)
    c.release(0.70, "w2", 8, True)
    c.write(1.90, "w1", 7, not guarded, "sent at 0.40 s, arrived 1.50 s later")
    return 0, 0 if guarded else 1


def _failover(c: _Cell, guarded: bool) -> tuple[int, int]:
    # The fence counter lives on the same primary: after the promotion it hands out the same number again,
    # so a guard that accepts equal fences cannot tell the holders apart.
    c.acquire(0.05, "w1", 3)
    c.fault(0.10, "redis-primary", "kill -9 the primary before it replicated; replica promoted")
    c.expire(0.10, "w1", 3, "the promoted replica never had w1's key")
    c.acquire(0.60, "w2", 3, detail="granted by the promoted replica")
    c.write(0.70, "w2", 3, True)
    c.write(0.75, "w1", 3, True)
    c.release(0.90, "w1", 3, False, "LockLost: the key holds w2's token")
    c.release(0.95, "w2", 3, True)
    return 1, 1


def _failover_raft(c: _Cell, guarded: bool) -> tuple[int, int]:
    c.acquire(0.05, "w1", 12)
    c.fault(0.10, "etcd-leader", "kill -9 the leader; a follower is elected")
    c.refused(0.60, "w2", "busy: the lease survived the election")
    c.write(0.70, "w1", 12, True)
    c.release(0.90, "w1", 12, True)
    c.acquire(0.95, "w2", 13)
    c.write(1.00, "w2", 13, True)
    c.release(1.05, "w2", 13, True)
    return 0, 0


def _restart_no_fsync(c: _Cell, guarded: bool) -> tuple[int, int]:
    c.acquire(0.05, "w1", 21, ttl=2.0)
    c.fault(0.30, "node-3", "kill -9 node 3 and restart it at once without AOF")
    c.expire(0.30, "w1", 21, "node 3 came back empty: w1 keeps 2 of 5 nodes")
    c.acquire(0.50, "w2", 22, ttl=2.0, detail="quorum of 3: nodes 3, 4, 5")
    c.write(0.60, "w2", 22, True)
    c.write(0.70, "w1", 21, not guarded, "w1 still believes it holds the lock")
    c.release(0.90, "w2", 22, True)
    c.release(1.00, "w1", 21, False, "LockLost")
    return 1, 0 if guarded else 1


def _clock_jump(c: _Cell, guarded: bool) -> tuple[int, int]:
    c.acquire(0.05, "w1", 30, ttl=2.0)
    c.fault(0.20, "server", "faketime +20 s on the lock server")
    c.expire(0.21, "w1", 30, "key expired 1.84 s early")
    c.acquire(0.30, "w2", 31, ttl=2.0)
    c.write(0.40, "w2", 31, True)
    c.write(0.50, "w1", 30, not guarded, "w1's own clock says 1.55 s remain")
    c.release(0.60, "w2", 31, True)
    c.release(0.70, "w1", 30, False, "LockLost")
    return 1, 0 if guarded else 1


def _clock_jump_one_of_five(c: _Cell, guarded: bool) -> tuple[int, int]:
    c.acquire(0.05, "w1", 30, ttl=2.0)
    c.fault(0.20, "node-2", "faketime +20 s on node 2 of 5")
    c.refused(0.30, "w2", "1 of 5 nodes granted: no quorum")
    c.write(0.50, "w1", 30, True)
    c.release(0.60, "w1", 30, True)
    c.acquire(0.65, "w2", 31, ttl=2.0)
    c.write(0.70, "w2", 31, True)
    c.release(0.80, "w2", 31, True)
    return 0, 0


def _cut_off(c: _Cell, guarded: bool) -> tuple[int, int]:
    c.acquire(0.05, "w1", 40)
    c.fault(0.20, "w1", "stall w1 <-> lock service")
    c.lost(1.04, "w1", 40, "on_lost: no renewal confirmed")
    c.acquire(1.10, "w2", 41)
    c.write(1.20, "w2", 41, True)
    c.write(1.30, "w1", 40, not guarded, "w1 wrote before it read lease.lost")
    c.write(1.45, "w2", 41, None, "no answer: the resource timed out")
    c.release(1.50, "w2", 41, True)
    return 0, 0 if guarded else 1


def _stale_release(c: _Cell, guarded: bool) -> tuple[int, int]:
    c.acquire(0.05, "w1", 50, ttl=0.5)
    c.fault(0.10, "w1", "SIGSTOP w1 for 0.8 s")
    c.expire(0.55, "w1", 50)
    c.acquire(0.60, "w2", 51)
    c.fault(0.90, "w1", "SIGCONT w1")
    if guarded:
        c.refused(0.92, "w1", "extend refused: not the owner")
        c.release(0.95, "w1", 50, False, "compare-and-delete: not the owner, w2's key kept")
        c.refused(1.00, "w3", "busy")
        c.write(1.10, "w2", 51, True)
        c.release(1.20, "w2", 51, True)
        c.acquire(1.25, "w3", 52)
        c.write(1.30, "w3", 52, True)
        c.release(1.40, "w3", 52, True)
        return 1, 0
    c.acquire(0.92, "w1", 50, detail="extend: naive PEXPIRE extended w2's key")
    c.release(0.95, "w1", 50, True, "naive DEL removed w2's key")
    c.expire(0.95, "w2", 51, "w1's naive DEL removed w2's key")
    c.acquire(1.00, "w3", 52)
    c.write(1.05, "w3", 52, True)
    c.write(1.10, "w2", 51, True)
    c.write(1.20, "w2", 51, True, "lower fence after a higher one")
    c.release(1.30, "w3", 52, True)
    c.release(1.40, "w2", 51, False)
    c.acquire(1.50, "w1", 53, detail="the same worker takes the lock again")
    c.write(1.60, "w1", 53, True)
    c.release(1.70, "w1", 53, True)
    return 2, 2


def _blocked_loop(c: _Cell, guarded: bool) -> tuple[int, int]:
    c.acquire(0.05, "w1 <async>", 60, detail="renewed every ttl/3")
    c.acquire(0.38, "w1 <async>", 60, detail="extend")
    c.fault(0.40, "w1 <async>", "time.sleep(1.5) in the event loop")
    c.expire(1.38, "w1 <async>", 60)
    c.acquire(1.45, "w2", 61)
    c.write(1.55, "w2", 61, True)
    c.write(1.91, "w1 <async>", 60, not guarded, "the loop woke up & wrote at once")
    c.lost(1.92, "w1 <async>", 60, "watchdog: renewal refused")
    c.release(2.00, "w2", 61, True)
    return 1, 0 if guarded else 1


STORIES: dict[str, Story] = {
    "pause-past-ttl": _pause_past_ttl, "pause-check-write": _pause_check_write, "delayed-write": _delayed_write,
    "failover": _failover, "restart-no-fsync": _restart_no_fsync, "clock-jump": _clock_jump,
    "cut-off": _cut_off, "stale-release": _stale_release, "blocked-loop": _blocked_loop,
}


def _counts(events: list[dict[str, Any]], overlaps: int, stale_accepted: int) -> dict[str, int]:
    writes = [e for e in events if e["kind"] == "write"]
    return {"overlaps": overlaps, "stale_accepted": stale_accepted,
            "stale_rejected": sum(1 for e in writes if e["ok"] is False), "lost_updates": stale_accepted,
            "writes": len(writes), "faults": sum(1 for e in events if e["kind"] == "fault")}


def _cell(scenario: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    sid, cid = scenario["id"], config["id"]
    guarded = cid in GUARDED
    # The literature: fencing saves a guarded write, except when the counter fails over with the lock
    # (Kleppmann: the fence must come from a linearizable counter).
    expected = "UNSAFE" if not guarded or (sid == "failover" and cid.startswith("redis")) else "SAFE"
    base: dict[str, Any] = {"scenario": sid, "config": cid, "runs": 3, "expected": expected, "note": ""}
    if not config["available"]:
        return {**base, "runs": 0, "verdict": "SKIPPED", "matches_expectation": False,
                "note": config["why_unavailable"], "counts": _counts([], 0, 0), "events": []}
    if sid == "failover" and cid.startswith("redlock"):
        return {**base, "runs": 1, "verdict": "ERROR", "matches_expectation": False,
                "note": f"worker w2 crashed: ValueError({SCRIPT_NOTE!r})", "counts": _counts([], 0, 0),
                "events": [
                    {"t": 0.05, "worker": "w1", "kind": "acquire", "fence": 3, "ok": True, "lease_end": 1.05,
                     "detail": "<b>bold?</b> & friends"},
                    {"t": 0.2, "worker": "w2", "kind": "fault", "fence": None, "ok": None, "lease_end": None,
                     "detail": "worker crashed"}]}
    story = STORIES[sid]
    if sid == "failover" and cid == "etcd-guard":
        story = _failover_raft
    if sid == "clock-jump" and cid.startswith("redlock"):
        story = _clock_jump_one_of_five
    c = _Cell(fences=cid != "redlock")
    overlaps, stale = story(c, guarded)
    verdict = "UNSAFE" if stale else "SAFE"
    cell = {**base, "verdict": verdict, "matches_expectation": verdict == expected,
            "counts": _counts(c.events, overlaps, stale), "events": c.events}
    if story is _clock_jump_one_of_five and cid == "redlock":
        cell["note"] = "one of five nodes jumped; the other four kept the quorum, so nothing overlapped"
    if sid == "delayed-write" and cid == "redlock-guard":
        events = [e for e in c.events if e["kind"] != "fault"]
        cell.update(verdict="FAULT-MISSED", matches_expectation=False, events=events, counts=_counts(events, 0, 0),
                    note="the proxy delayed nothing: every write arrived within 5 ms")
    return cell


def sample_results() -> dict[str, Any]:
    """A fresh copy every call, so a test may mutate it."""
    cells = [_cell(s, c) for s in SCENARIOS for c in CONFIGS]
    return copy.deepcopy({
        "version": 1, "seed": 20261201, "quick": True, "started": "2026-12-01T06:31:07Z", "duration_s": 97.4,
        "configs": CONFIGS, "scenarios": SCENARIOS, "cells": cells,
    })
