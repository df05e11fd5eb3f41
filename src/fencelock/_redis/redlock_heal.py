"""Redlock's heal, repair and node-state rules: how a node that lost its data counts again, without I/O.

The fencing rule (`redlock_acquire`) holds while no node's `hwm` goes backwards. A node counts only while it has
its marker key and its data set belongs to the server process running now (its run_id): a node that lost its data
comes back without the marker, or under another process (restarted, perhaps from an older snapshot, and taken
over only if it fsyncs every write). Every unmarked data set is brought back by one of three exits (`plan_heal`;
the reasons are in docs/design/redlock.md):

1. fresh: a data set first seen less than `FRESH_WINDOW` ago, never marked, answers "fresh" to every client. A
   client that hears "fresh" from *every* node in one look claims each for the deployment it saw (the digest
   of all nonces), and once every claim held marks them all, with one floor (`deployment_floor`): a new
   deployment, or one wiped out entirely, whose fences start above every earlier one. Concurrent clients see
   the same nonces, so their claims agree and they all mark (idempotent); a look that straddled another
   client's marks and a node's loss has another digest, and its claim fails;
2. repair: any other unmarked data set is quarantined for `repair_delay` (no TTL may exceed it) from when it was
   first seen, and for the longest TTL still live on the others (`required_delay`), so every lease from before
   the loss has expired. Then its `hwm` for every name becomes the
   maximum over a quorum of the *other*, ready nodes (any earlier grant's quorum shares a node with it);
3. floor: with fewer than a quorum of ready others (a minority down at first contact, a crashed initialisation, a
   majority restarted empty), it gets the maximum of what the ready others answered and a *floor* taken from its
   own clock in microseconds, far above any counter: fences keep increasing as long as no node's clock is behind
   an earlier floor by more than the proposals made since.

Each data set has a random nonce (its incarnation), and the mark lands only on the incarnation the client looked
at, after its quarantine: a node that loses its data again mid-repair is never marked with what it lost.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from .redlock_acquire import Answer, Reply, quorum


def repaired_hwm(others: Sequence[Mapping[str, int]], n: int) -> dict[str, int] | None:
    """The hwm to give a repaired node: per key, the maximum over the other nodes' answers.

    `others` are the fence keys and values read from other, healthy nodes. Fewer than a quorum of them: None,
    because only a quorum of others is sure to share a node with every earlier grant.
    """
    if len(others) < quorum(n):
        return None
    merged: dict[str, int] = {}
    for values in others:
        for key, value in values.items():
            if value > merged.get(key, 0):
                merged[key] = value
    return merged


class Gate(enum.Enum):
    """Where a node's data set stands, as `_scripts/redlock_gate.lua` answers."""

    READY = "ready"               # it has its marker: it counts
    FRESH = "fresh"               # first seen less than the fresh window ago, never marked
    QUARANTINED = "quarantined"   # unmarked; waiting out the repair delay
    REPAIRABLE = "repairable"     # unmarked, and the delay is over: repair it now
    RESTARTED = "restarted"       # its server restarted since: look again, saying whether it is durable
    UNKNOWN = "unknown"           # the node did not answer


@dataclass(frozen=True)
class GateView:
    """One node's gate answer: its state, its incarnation, seconds until its quarantine ends (None: none started
    yet, as a look that writes nothing sees a data set nobody looked at), and its floor."""

    gate: Gate
    nonce: str = ""
    left: float | None = 0.0
    floor: int = 0

    @classmethod
    def decode(cls, raw: Sequence[object]) -> GateView:
        state, nonce, left, floor = (x.decode() if isinstance(x, bytes) else x for x in raw)
        ms = int(str(left))
        return cls(Gate(str(state)), str(nonce), None if ms == -1 else ms / 1000.0, int(str(floor)))


@dataclass(frozen=True)
class Repair:
    """Raise node `node` (incarnation `nonce`) from the ready nodes `sources`, then mark it.

    `clock`: fewer than a quorum of ready others, so its floor is also taken from its own clock."""

    node: int
    nonce: str
    sources: tuple[int, ...]
    clock: bool


@dataclass(frozen=True)
class HealPlan:
    fresh: tuple[int, ...] = ()         # a new deployment: mark these at once
    repairs: tuple[Repair, ...] = ()
    plain: tuple[int, ...] = ()         # repair=False: mark every unmarked node at once, with a clock floor

    def __bool__(self) -> bool:
        return bool(self.fresh or self.repairs or self.plain)


def deployment_id(views: Sequence[GateView | None]) -> str:
    """A new deployment as one look saw it: the digest of every node's nonce, in sorted order. Every client that
    looked at the same data sets computes the same one, whatever order it lists the nodes in, and a node is
    claimed for one only (`redlock_mark.lua`, claim)."""
    joined = "|".join(sorted("" if view is None else view.nonce for view in views))
    return hashlib.sha256(joined.encode()).hexdigest()[:32]


def plan_heal(views: Sequence[GateView | None], n: int, repair: bool = True,
              busy: Collection[int] = ()) -> HealPlan:
    """What a client does after one look at every node's gate (None: no answer); `busy`: nodes this client is
    repairing already, left out of the repairs."""
    if all(v is not None and v.gate is Gate.FRESH for v in views):
        return HealPlan(fresh=tuple(range(n)))  # every node answered, none was ever used: a new deployment
    answered = [(i, v) for i, v in enumerate(views) if v is not None and v.gate is not Gate.UNKNOWN]
    if not repair:
        return HealPlan(plain=tuple(i for i, v in answered if v.gate is not Gate.READY))
    ready = tuple(i for i, v in answered if v.gate is Gate.READY)
    return HealPlan(repairs=tuple(Repair(i, v.nonce, ready, len(ready) < quorum(n))
                                  for i, v in answered if v.gate is Gate.REPAIRABLE and i not in busy))


def required_delay(own: float, live: Sequence[float]) -> float:
    """The quarantine a repair must see over (seconds from the data set's first look): this client's repair
    delay, or the longest TTL of a lease the ready others granted or extended that may still be valid
    (`live_ttl`): any lease that needed the lost node is on one of them."""
    return max([own, *live])


def live_ttl(entries: Sequence[tuple[object, float]], now_ms: float) -> float:
    """The longest TTL (seconds) among a node's `fencelock:redlock:ttls` entries (TTL in ms, expiry in server ms)
    whose lease may still be valid at the node's `now_ms`; 0 if none."""
    return max((int(str(ttl.decode() if isinstance(ttl, bytes) else ttl)) / 1000.0
                for ttl, at in entries if at > now_ms), default=0.0)


def ready_in(views: Sequence[GateView | None]) -> list[float | None]:
    """Seconds until each node could count again, from one look: 0 ready or repairable, the quarantine's end
    while quarantined (or fresh), None unknown (no answer)."""
    out: list[float | None] = []
    for view in views:
        if view is None or view.gate in (Gate.UNKNOWN, Gate.RESTARTED):
            out.append(None)
        elif view.gate in (Gate.READY, Gate.REPAIRABLE):
            out.append(0.0)
        else:
            out.append(view.left)
    return out


def durable_run(appendonly: object, appendfsync: object, info: Mapping[str, object]) -> str:
    """The server process (its run_id) whose every acknowledged write survives a restart: it runs AOF with
    `appendfsync always`, as read from that process (`CONFIG GET`, `INFO server`); '' if not, or not known."""
    if str(appendonly).lower() == "yes" and str(appendfsync).lower() == "always":
        return str(info.get("run_id", ""))
    return ""


def repaired(others: Sequence[tuple[int, Mapping[str, int]]], n: int, clock: bool) -> tuple[int, dict[str, int]] | None:
    """The floor and hwm to give a repaired node: the maximum over the others' (floor, hwm) answers.

    Without `clock`, fewer than a quorum of others is None: only a quorum of others is sure to share a node with
    every earlier grant. With it, whatever answered is merged, and the node's clock supplies the rest.
    """
    if not clock and len(others) < quorum(n):
        return None
    merged = repaired_hwm([values for _, values in others], 0) or {}
    return max((floor for floor, _ in others), default=0), merged


GATE_TIMEOUT = 1.0
"""Seconds: the least time a look at every node's gate (or a mark) is given; it must hear every node, over cold
connections too, to call a deployment new."""


def look_timeout(timeout: float) -> float:
    """How long a look at the gates, a claim or a fresh mark may take, given the attempt's per-node timeout."""
    return max(timeout, GATE_TIMEOUT)


NEW_DEPLOYMENT = ("claim", "fresh")
"""The marks a new deployment takes, in order, each on every node: claim each for its digest, then mark all."""


def deployment_step(mode: str, held: Sequence[bool]) -> bool | None:
    """After `mode` ran on every node (`held`: it held there): None to go on, or whether some node counts now.

    A claim that failed anywhere ends it (another look has another digest); a fresh mark counts where it held."""
    if mode not in NEW_DEPLOYMENT:
        raise ValueError(f"mode: a new deployment's marks are {NEW_DEPLOYMENT}, got {mode!r}")
    if all(held):
        return True if mode == NEW_DEPLOYMENT[-1] else None
    return mode == "fresh" and any(held)


def mark_args(view: GateView | None, mode: str, deployment: str = "0", floor: int = 0) -> list[object]:
    """`redlock_mark.lua`'s ARGV for a claim, a fresh mark or a plain one: on the incarnation looked at; a fresh
    mark takes the new deployment's `floor` (`deployment_floor`), a plain one (repair=False) a fence floor from
    the node's own clock."""
    fourth = floor if mode == "fresh" else 1 if mode == "plain" else 0
    return ["" if view is None else view.nonce, mode, deployment, fourth]


def deployment_floor(views: Sequence[GateView | None]) -> int:
    """A new deployment's floor, the same on every node and for every client that saw the same data sets: the
    latest of their first looks, in µs (each fresh view's floor). Every earlier grant came before it: it needed a
    quorum of marked nodes, and every node's data set has been emptied and looked at anew since."""
    return max((view.floor for view in views if view is not None), default=0)


def marked(code: int) -> bool:
    """A claim or mark held (1 done, 0 already marked), or not (another data set, or still quarantined)."""
    return code >= 0


REPAIR_BATCH = 200
"""Fence keys per request when a repair reads or raises them."""


def repair_marks(repair: Repair, floor: int, hwm: Mapping[str, int],
                 batch: int = REPAIR_BATCH) -> list[tuple[list[str], list[object]]]:
    """A repair's `redlock_mark.lua` calls, in order, as (fence keys, ARGV): every batch raises the hwm, and the
    last one also marks the node ("repair"), so that it counts only once every value landed."""
    items = sorted(hwm.items())
    calls: list[tuple[list[str], list[object]]] = []
    for start in range(0, max(1, len(items)), batch):
        chunk = items[start:start + batch]
        mode = "repair" if start + batch >= len(items) else "raise"
        calls.append(([key for key, _ in chunk],
                      [repair.nonce, mode, floor, 1 if repair.clock else 0, *(value for _, value in chunk)]))
    return calls


def repair_progress(code: int) -> bool | None:
    """After one of a repair's marks: None to go on; False when the node lost its data again or is still
    quarantined (a later look starts over); True when another client marked it meanwhile."""
    if code < 0:
        return False
    return True if code == 0 else None


def marker_floor(marker: str) -> int:
    """The fence floor a node's marker carries (`floor:<n>`; any other marker has none)."""
    return int(marker[6:]) if marker.startswith("floor:") and marker[6:].isdigit() else 0


@dataclass(frozen=True)
class NodeState:
    """One Redlock node as an operator sees it (`fencelock nodes`, `Locks.nodes()`). Never shows a password."""

    node: str                        # the node as shown (URL without its password)
    reachable: bool
    ready: bool
    state: str                       # ready, fresh, quarantined, repairable or unreachable
    quarantine_left: float | None    # seconds until its quarantine ends (fresh, quarantined)
    quarantined_until: float | None  # ... as a Unix time, by this machine's clock
    repairable: bool
    floor: int = 0
    error: str | None = None         # state "error": what the server answered (it refuses, it is not down)
    delay: float | None = None       # a quarantine not started yet: how long it will last (the asking client's)

    def as_dict(self) -> dict[str, object]:
        return {"node": self.node, "reachable": self.reachable, "ready": self.ready, "state": self.state,
                "quarantine_left": self.quarantine_left, "quarantined_until": self.quarantined_until,
                "repairable": self.repairable, "floor": self.floor, "error": self.error,
                "counts_in": self.counts_in, "eta": self.eta}

    @property
    def counts_in(self) -> float | None:
        """Seconds until a node that is not trusted (after a loss or a restart) counts again at the latest, if a
        client acquires then (0: now, or at the next acquire); None: not known (unreachable, an error)."""
        if self.ready or self.repairable:
            return 0.0
        if self.state in ("fresh", "quarantined"):
            return self.quarantine_left if self.quarantine_left is not None else self.delay
        return None

    @property
    def eta(self) -> str:
        """`counts_in` as an operator reads it: "counts again in 4.2 s"."""
        if self.ready:
            return "counts now"
        if self.repairable:
            return "counts again at the next acquire (repairable now)"
        if self.state in ("fresh", "quarantined"):
            if self.quarantine_left is not None:
                return f"counts again in {self.quarantine_left:.1f} s"
            if self.delay is not None:
                return f"counts again {self.delay:.1f} s after the next acquire (its quarantine starts then)"
            return "counts again after its quarantine, which starts at the next acquire"
        return ""

    def describe(self) -> str:
        if self.state == "unreachable":
            return f"{self.node}: unreachable"
        if self.state == "error":
            return f"{self.node}: server error: {self.error}"
        if self.state == "slow":
            return f"{self.node}: slow (no answer within the node timeout)"
        if self.quarantine_left is not None and self.quarantined_until is not None:
            until = time.strftime("%H:%M:%S UTC", time.gmtime(self.quarantined_until))
            waits = "fresh (new or emptied; counts at once only if every node is)" if self.state == "fresh" \
                else "quarantined"
            return f"{self.node}: {waits}, repairable in {self.quarantine_left:.1f} s (at {until})"
        return f"{self.node}: {self.state}"


def node_states(shown: Sequence[str], views: Sequence[GateView | None], now: float,
                delay: float | None = None) -> list[NodeState]:
    """The operator's records from one look (`now`: this machine's Unix time; `delay`: the asking client's
    repair delay, what a quarantine not started yet will last at least)."""
    states = []
    for where, view in zip(shown, views, strict=True):
        if view is None or view.gate is Gate.UNKNOWN:
            states.append(NodeState(where, False, False, "unreachable", None, None, False))
            continue
        left = view.left if view.gate in (Gate.FRESH, Gate.QUARANTINED) else None
        states.append(NodeState(where, True, view.gate is Gate.READY, view.gate.value,
                                left, None if left is None else now + left, view.gate is Gate.REPAIRABLE,
                                view.floor, delay=delay if left is None else None))
    return states


@dataclass(frozen=True)
class Verdict:
    available: bool
    ready: int
    needed: int
    eta: float | None    # seconds until a quorum can be ready at the latest (None: not while nodes are out)
    text: str

    def as_dict(self) -> dict[str, object]:
        return {"available": self.available, "ready": self.ready, "needed": self.needed, "eta": self.eta,
                "verdict": self.text}


@dataclass(frozen=True)
class NodesReport:
    """`Locks.nodes()`: every Redlock node's record, and the deployment's verdict."""

    nodes: tuple[NodeState, ...]
    verdict: Verdict

    def as_dict(self) -> dict[str, object]:
        return {**self.verdict.as_dict(), "nodes": [node.as_dict() for node in self.nodes]}


def verdict(states: Sequence[NodeState], n: int) -> Verdict:
    """The deployment as a whole: can a lock be granted now, and if not, when at the latest."""
    q = quorum(n)
    ready = sum(s.ready for s in states)
    reachable = [s for s in states if s.reachable]
    if ready >= q:
        return Verdict(True, ready, q, 0.0, f"available: {ready} of {n} nodes ready, {q} needed")
    errors = sum(s.state == "error" for s in states)
    if errors:
        return Verdict(False, ready, q, None, f"unavailable: {ready} of {n} nodes ready, {q} needed; {errors} "
                                              f"answered with a server error (not a node that is down: fix it)")
    if len(reachable) < q:
        return Verdict(False, ready, q, None, f"unavailable: only {len(reachable)} of {n} nodes reachable, "
                                              f"{q} needed; start or reach the others")
    if len(reachable) == n and all(s.state == "fresh" for s in states):
        return Verdict(True, ready, q, 0.0, "available: a new deployment (every node is fresh); the first acquire "
                                            "marks them all and is granted at once")
    lefts = sorted(0.0 if s.quarantine_left is None else s.quarantine_left for s in reachable if not s.ready)
    eta = lefts[q - ready - 1]
    if any(s.state == "quarantined" and s.quarantine_left is None for s in reachable):
        return Verdict(False, ready, q, None, f"unavailable: {ready} of {n} nodes ready, {q} needed; a quarantine "
                                              "starts at the next acquire, for its client's repair delay")
    return Verdict(False, ready, q, eta, f"unavailable: {ready} of {n} nodes ready, {q} needed; the next acquire "
                                         f"repairs enough of them in {eta:.1f} s at the latest")


def attempt_states(shown: Sequence[str], answers: Sequence[Answer], views: Sequence[GateView | None] | None,
                   now: float) -> list[NodeState]:
    """Every node's record for an attempt's error: from the look at the gates, or without one (`views` None)
    from the attempt's answers. A node that answered the look but not the attempt is unreachable."""
    if views is None:
        states = [NodeState(where, a.reply is not Reply.FAILED, a.reply not in (Reply.FAILED, Reply.UNREADY),
                            ("slow" if a.slow else "unreachable") if a.reply is Reply.FAILED
                            else "not ready" if a.reply is Reply.UNREADY else "ready",
                            None, None, False) for where, a in zip(shown, answers, strict=True)]
    else:
        states = node_states(shown, views, now)
    for i, answer in enumerate(answers):
        if answer.error:  # it answered, refusing: a server error, whatever the look said
            states[i] = NodeState(shown[i], True, False, "error", None, None, False, error=answer.error)
        elif views is not None and answer.reply is Reply.FAILED and states[i].reachable:
            # It answered the look: one that missed only the attempt's node timeout is slow, not unreachable.
            states[i] = NodeState(shown[i], answer.slow, False, "slow" if answer.slow else "unreachable", None,
                                  None, False)
    return states


def unavailable(why: str, shown: Sequence[str], answers: Sequence[Answer], views: Sequence[GateView | None] | None,
                now: float) -> tuple[str, list[NodeState], Verdict]:
    """An attempt's QuorumUnavailable: its message naming every node, its state and when its quarantine ends,
    the records, and the verdict (whose `eta` is the error's retry_in)."""
    states = attempt_states(shown, answers, views, now)
    found = verdict(states, len(shown))
    parts = "; ".join(state.describe() for state in states)
    return f"{why}: {parts}. {found.text}", states, found



def newly_out(reported: Mapping[int, str], states: Sequence[NodeState]) -> tuple[list[int], dict[int, str]]:
    """The nodes whose state is worth a `node_out` event: out, and in another state than last reported (so a
    waiter that meets the same quarantine at every retry reports it once); and what is reported now."""
    now = dict(reported)
    changed = []
    for i, state in enumerate(states):
        if state.ready:
            now.pop(i, None)
        elif now.get(i) != state.state:
            now[i] = state.state
            changed.append(i)
    return changed, now


@dataclass(frozen=True)
class Identity:
    """Who a listed node is, as it answers `INFO server` and `INFO replication` at first contact."""

    run_id: str
    replica_of: str | None = None   # "host:port" of its master, when it is a replica

    @classmethod
    def from_info(cls, server: Mapping[str, object], replication: Mapping[str, object]) -> Identity:
        replica = str(replication.get("role", "master")) != "master"
        master = f"{replication.get('master_host', '?')}:{replication.get('master_port', '?')}"
        return cls(str(server.get("run_id", "")), master if replica else None)


def not_independent(shown: Sequence[str], found: Sequence[Identity | None],
                    places: Sequence[Collection[str]] = ()) -> str | None:
    """Why the listed nodes are not independent masters, naming the URLs (None: no reason found). `found`: each
    node's identity (None: not known yet); `places`: where each listed node is, to name a replica's master."""
    for i, identity in enumerate(found):
        if identity is None:
            continue
        for j in range(i):
            other = found[j]
            if other is not None and other.run_id and other.run_id == identity.run_id:
                return (f"url: {shown[j]} and {shown[i]} reach one server (run_id {identity.run_id[:12]}...): "
                        "Redlock needs independent nodes; list each server once")
    for i, identity in enumerate(found):
        if identity is not None and identity.replica_of is not None:
            master = next((shown[j] for j, where in enumerate(places) if j != i
                           and _same_place(identity.replica_of, where)), None)
            of = identity.replica_of if master is None else f"{identity.replica_of}, listed as {master}"
            return (f"url: {shown[i]} is a replica (of {of}), not a master: Redlock needs independent masters, "
                    "each its own data; list masters only")
    return None


def _same_place(address: str, places: Collection[str]) -> bool:
    host, _, port = address.rpartition(":")
    candidates = {address, f"loopback:{port}"} if host in ("127.0.0.1", "::1", "localhost") else {address}
    return bool(candidates & set(places))
