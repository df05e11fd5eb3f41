"""The fault matrix's tables: every fault, every request fencelock sends, which request of a cell the fault hits,
and the cell itself (front end, fault, request). Pure data: `scenario.py` runs a cell, `steps.py` has its steps."""

from __future__ import annotations

import random
from dataclasses import dataclass

from fencelock.testing.faults import LATE, LOSE, PAUSE, RESET_AFTER, RESET_BEFORE

TTL = 0.8
RENEW = 0.25         # renewed leases: every this many seconds
HELD_BACK = 0.4      # a late reply or a paused server: longer than the clients' socket timeout
OBSERVE = 0.1        # seconds of claims and rival attempts after the request
FIRE_TIMEOUT = 3.0   # the fault must have fired by then
SHORT_TTL = 0.06     # past_ttl cells: the TTL the faulted request asks for...
PAST_TTL = 0.12      # ...and how late its reply comes: after that TTL, within the socket and node timeouts

FAULTS = ["lose", "late", "reset_before", "reset_after", "idle", "handshake", "pause"]
"""Every fault of the matrix; `cancel` (asyncio only) is its own table. `handshake`: the idle connections are
closed, and the server then closes the next new connection during its set-up (its first CLIENT command)."""
PAST_TTL_FAULT = "past_ttl"
PAST_TTL_REQUESTS = ["acquire", "acquire_fair", "extend_shorter", "wait"]
"""The `past_ttl` row: the reply to a grant or an extend comes late but still in time for the client's timeouts,
after the TTL it asked for has run out on the server. Only requests that ask for a TTL are in it."""
_HEALTHY = ("idle", "handshake")
"""Faults after which the server is healthy: no call may fail."""

REQUESTS = ["acquire", "acquire_fair", "extend_same", "extend_longer", "extend_shorter", "release", "exit", "renewal",
            "wait", "status", "force_release", "race_extend", "race_release"]
"""Every request fencelock sends; `exit` is the release at the end of a renewed `with locks.lock()` block; the
race_* cells are a renewal racing extend() / release() on one lease."""

_MATCH = {
    "acquire": {"acquire", "redlock_acquire"},
    "acquire_fair": {"fair_acquire"},
    "extend": {"extend", "redlock_extend"},
    "release": {"release", "redlock_release"},
    "renewal": {"extend_many", "redlock_extend_many"},
    "wait": {"blpop"},
    "status": {"status"},
    "force_release": {"force_release"},
}

ZOOKEEPER_FAULTS = ["late", "reset_before", "reset_after", "idle", "handshake", "pause"]
"""ZooKeeper's row: no `lose`. Its replies come in order on a connection (kazoo checks each one's xid), so a reply
that goes missing while later ones arrive is not a fault a network makes; one held back until the client gives
up is `late` (the client drops the connection after its `timeout`)."""
ZOOKEEPER_REQUESTS = ["acquire", "extend_same", "extend_shorter", "release", "exit", "renewal", "wait", "status",
                      "force_release", "race_extend", "race_release"]
"""ZooKeeper's requests: every one of `REQUESTS` but `acquire_fair` (every ZooKeeper waiter is served in order, one
request) and `extend_longer` (a move of the node to a longer session: decision 2026-12-04-zookeeper-extend)."""
_ZOOKEEPER_MATCH = {
    "acquire": {"create2"},         # the queue's node (kazoo's create with its stat)
    "extend": {"setData"},          # an extend or a renewal rewrites the node's TTL
    "renewal": {"setData"},
    "release": {"multi"},           # delete, and the fence on the lock's node, in one transaction
    "force_release": {"multi"},
    "wait": {"exists"},             # the watch a waiter sets on the node before it
    "status": {"getChildren"},
}

ETCD_FAULTS = ["lose", "late", "reset_before", "reset_after", "idle", "handshake", "pause"]
"""etcd's row: every fault. `handshake`: plain HTTP has no set-up exchange, so the server closes the first request
of the next new connection, unrun."""
ETCD_REQUESTS = ["acquire", "extend_same", "extend_longer", "extend_shorter", "release", "exit", "renewal", "wait",
                 "status", "force_release", "race_extend", "race_release"]
"""etcd's requests: every one of `REQUESTS` but `acquire_fair` (every etcd waiter queues: fair=True sends the same
requests)."""
_ETCD_MATCH = {
    "acquire": {"acquire"},          # the transaction that puts our key if it is absent (after the lease's grant)
    "extend_same": {"keepalive"},    # an extend within the lease's TTL refreshes the lease...
    "extend_shorter": {"keepalive"},  # ...and one to half of it too (a move only below a quarter)
    "extend_longer": {"move"},       # the key onto a new, longer lease
    "renewal": {"keepalive"},        # the watchdog's keep-alive
    "release": {"release"},          # compare-and-delete, recording the fence
    "wait": {"watch"},               # the waiter's watch on its predecessor's key
    "status": {"range"},             # the holder's key and the queue's length
    "force_release": {"force_release"},
}

DURABLE_TARGETS = {"acquire", "acquire_fair", "extend_same", "extend_longer", "extend_shorter", "renewal",
                   "race_extend", "race_release"}
"""The requests that carry a WAIT with `durability=`."""

_RULES = {"lose": LOSE, "late": LATE, PAST_TTL_FAULT: LATE, "reset_before": RESET_BEFORE, "reset_after": RESET_AFTER,
          "pause": PAUSE}


def target_of(request: str, kind: str, fault: str = "") -> tuple[set[str], int]:
    """The request names a cell faults, and which of them (the nth). With `durability=`, a grant's or an extend's
    fault hits the WAIT written after its script: the script ran and answered, its confirmation is what fails."""
    if kind == "etcd":
        if request.startswith("race"):
            return _ETCD_MATCH["renewal"], 1
        return _ETCD_MATCH["release" if request == "exit" else request], 1
    if kind == "zookeeper":
        if request.startswith(("extend", "race")):
            return _ZOOKEEPER_MATCH["extend"], 1  # the race cells: the renewal
        return _ZOOKEEPER_MATCH["release" if request == "exit" else request], 1
    if fault == PAST_TTL_FAULT and request == "wait":
        return _MATCH["acquire"], 2  # the grant after the wait, not the wake-up
    if kind == "durable" and request in DURABLE_TARGETS:
        return {"wait"}, 1
    if request.startswith("extend"):
        return _MATCH["extend"], 1
    if request == "exit":
        return _MATCH["release"], 1
    if request.startswith("race") or request == "renewal":
        return _MATCH["renewal"], 1
    if request == "wait" and kind == "redlock":
        return _MATCH["acquire"], 2  # Redlock waits by trying again: the second attempt is the one after a wait
    return _MATCH[request], 1


@dataclass(frozen=True)
class Cell:
    front: str
    fault: str
    request: str
    nth: int = 1
    held_back: float = HELD_BACK

    def __str__(self) -> str:
        return f"{self.front}-{self.fault}-{self.request}"

    @property
    def ttl(self) -> float:
        """The TTL the request under test asks for."""
        return SHORT_TTL if self.fault == PAST_TTL_FAULT else TTL


def random_cell(rng: random.Random, kinds: list[str]) -> tuple[str, Cell]:
    """A soak cell: any backend, front end, fault and request, the k-th matching request, a random hold-back."""
    kind = rng.choice(kinds)
    faults = {"zookeeper": ZOOKEEPER_FAULTS, "etcd": ETCD_FAULTS}.get(kind, FAULTS)
    requests = {"zookeeper": ZOOKEEPER_REQUESTS, "etcd": ETCD_REQUESTS}.get(
        kind, [r for r in REQUESTS if not (kind == "redlock" and r == "acquire_fair")])
    cell = Cell(rng.choice(["sync", "async"]), rng.choice(faults), rng.choice(requests), nth=1,
                held_back=rng.uniform(0.3, 0.8))
    return kind, cell
