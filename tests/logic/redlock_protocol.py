"""The Redlock start-up and repair protocol as an in-memory world, searched by `test_redlock_protocol_model.py`:
fencelock's protocol and its variants (no floor, no claim, no restart check, no floor for a new deployment, the
old one), nodes that lose their data, restart from a snapshot or come up late, clients that crash at any step,
time, attempts, and a depth-first search over every interleaving."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from fencelock._redis.redlock import (
    MAX_ROUNDS,
    Answer,
    Gate,
    GateView,
    HealPlan,
    NodeModel,
    Outcome,
    Repair,
    Reply,
    decide,
    deployment_floor,
    deployment_id,
    next_proposal,
    plan_heal,
    quorum,
    repaired,
    repaired_hwm,
    required_delay,
)

from .test_redlock_model import NAME

# -- the start-up and repair protocol: liveness as well as safety ------------------------------------------------
# Nodes start never seen. Clients look at every node's gate one request at a time, plan (`plan_heal`), and carry
# the plan out one request at a time (marks, reads of the ready nodes, the final raise+mark); any client may
# crash between any two requests. Between any two requests a node may lose its data (restart empty: the losses
# of several nodes may come one at a time, with no look between, as in a rolling restart), save a snapshot, or
# restart from its last snapshot (rolled back: its marker and incarnation come back, without what came after).
# Nodes may be down at first contact and come up later, time passes the fresh window and the quarantine, and
# attempts are made (atomically, from a client that knows nothing, learning over rounds as the real one does).
#
# Safety: every grant's fence is above every earlier one's, and no grant overlaps a valid earlier one, unless
# every node was blank at once since that one (unmarked, no hwm, no key: a new deployment by definition, nothing
# is left anywhere to say the earlier lease exists; its fences still stay above).
# Liveness: from every state with a quorum of nodes up, one client alone, with the clock moving on by at most
# the repair delay (plus the TTL for holders' keys to expire), gets a grant.

DELAY, WINDOW = 10.0, 2.0    # the repair delay (>= TTL) and the fresh window (<= the delay)
PTTL = 5.0                   # the TTL of the protocol model's grants
EPS = 0.5


def clock_us(now: float, proposals: int = 0) -> int:
    """The nodes' clock in microseconds since a start far in the past: above every counter fence, and at least
    one microsecond on per proposal made before (each takes a script call: the clock assumption of the floors)."""
    return 10**9 + int(now * 1_000_000) + proposals


def _copy(node: NodeModel) -> NodeModel:
    """A copy of every field, with its own `hwm`, `locks` and `ttls` (`dataclasses.replace` is most of a search's
    time), and no cached key."""
    fresh = object.__new__(NodeModel)
    fresh.__dict__.update(node.__dict__)
    fresh.__dict__.pop("_key", None)
    fresh.hwm, fresh.locks, fresh.ttls = dict(node.hwm), dict(node.locks), dict(node.ttls)
    return fresh


def _node_key(node: NodeModel) -> object:
    """A node's part of a state's key, computed once: a world changes only nodes it copied (`ProtoWorld.node`).
    Its `ttls` are left out: they lengthen a repair's quarantine only past a live TTL above the repair delay, and
    every grant here has PTTL < DELAY, so they never change what happens next."""
    found = node.__dict__.get("_key")
    if found is None:
        found = node.__dict__["_key"] = (
            node.ready, tuple(sorted(node.hwm.items())), tuple(sorted(node.locks.items())), node.floor, node.nonce,
            node.born, node.born_us, node.until, node.fresh, node.legacy, node.claim, node.run, node.inc_run)
    return found


def _snapshot_key(snapshot: dict[str, object] | None) -> object:
    if snapshot is None:
        return None
    return tuple((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in snapshot.items())


class Protocol:
    """The protocol under test: fencelock's (gate, plan_heal, mark) ..."""

    name = "new"

    def gate(self, node: NodeModel, now: float, nonce: str, delay: float = DELAY, us: int = 0) -> GateView:
        return node.gate(now, delay, WINDOW, nonce, durable=node.durable, us=us)

    def plan(self, views: list[GateView | None], n: int) -> HealPlan:
        return plan_heal(views, n)

    def mark(self, node: NodeModel, nonce: str, mode: str, floor: int, clock: bool, values: dict[str, int],
             now: float, us: int, deployment: str = "") -> int:
        return node.mark(nonce, mode, floor, clock, values, now, us, deployment)

    def repaired(self, reads: list[tuple[int, dict[str, int]]], n: int,
                 clock: bool) -> tuple[int, dict[str, int]] | None:
        return repaired(reads, n, clock)

    def restart(self, node: NodeModel) -> None:
        node.restart()


class NoFloor(Protocol):
    """fencelock's, but a node marked without a quorum of ready others gets no floor from its clock."""

    name = "no floor"

    def mark(self, node: NodeModel, nonce: str, mode: str, floor: int, clock: bool, values: dict[str, int],
             now: float, us: int, deployment: str = "") -> int:
        return node.mark(nonce, mode, floor, False, values, now, us, deployment)


class NoFreshFloor(Protocol):
    """fencelock's, but a new deployment's nodes are marked with floor 0 (fences counted from 1), as before."""

    name = "no fresh floor"

    def mark(self, node: NodeModel, nonce: str, mode: str, floor: int, clock: bool, values: dict[str, int],
             now: float, us: int, deployment: str = "") -> int:
        return node.mark(nonce, mode, 0 if mode == "fresh" else floor, clock, values, now, us, deployment)


class NoRestartCheck(Protocol):
    """fencelock's, but a restarted node is not told apart: its data set counts whatever a snapshot brought back
    (as if every process kept the run of the one before)."""

    name = "no restart check"

    def restart(self, node: NodeModel) -> None:
        node.restart()
        if node.inc_run is not None:
            node.inc_run = node.run


class NoClaim(Protocol):
    """fencelock's, but a new deployment is marked without claiming its nodes first (with floor 0, as when claims
    came in; `fresh_floor`: with a floor from the clock, as a new deployment's marks take now)."""

    name = "no claim"

    def __init__(self, fresh_floor: bool = False) -> None:
        self.fresh_floor = fresh_floor

    def mark(self, node: NodeModel, nonce: str, mode: str, floor: int, clock: bool, values: dict[str, int],
             now: float, us: int, deployment: str = "") -> int:
        if mode == "claim":
            return 1
        if mode == "fresh" and node.nonce == nonce and not node.ready:
            node.ready, node.floor = True, floor if self.fresh_floor else 0
            return 1
        return node.mark(nonce, mode, floor, clock, values, now, us, deployment)


class OldProtocol(Protocol):
    """... and the one before it: 'fresh' only to the first look, marks only after an all-fresh look, repair
    only from a quorum of ready others, no incarnation, no floor."""

    name = "old"

    def gate(self, node: NodeModel, now: float, nonce: str, delay: float = DELAY, us: int = 0) -> GateView:
        if node.ready:
            return GateView(Gate.READY)
        if node.nonce is None:
            node.nonce, node.until, node.inc_run = "seen", now + delay, node.run
            return GateView(Gate.FRESH)
        return GateView(Gate.QUARANTINED if now < node.until else Gate.REPAIRABLE)

    def plan(self, views: list[GateView | None], n: int) -> HealPlan:
        if all(v is not None and v.gate is Gate.FRESH for v in views):
            return HealPlan(fresh=tuple(range(n)))
        ready = tuple(i for i, v in enumerate(views) if v is not None and v.gate is Gate.READY)
        if len(ready) < quorum(n):
            return HealPlan()
        return HealPlan(repairs=tuple(Repair(i, "", ready, False) for i, v in enumerate(views)
                                      if v is not None and v.gate is Gate.REPAIRABLE))

    def mark(self, node: NodeModel, nonce: str, mode: str, floor: int, clock: bool, values: dict[str, int],
             now: float, us: int, deployment: str = "") -> int:
        if mode == "claim":
            return 1  # (no claims then)
        for key, value in values.items():
            node.hwm[key] = max(node.hwm.get(key, 0), value)
        if mode != "raise":
            node.ready = True
        return 1

    def repaired(self, reads: list[tuple[int, dict[str, int]]], n: int,
                 clock: bool) -> tuple[int, dict[str, int]] | None:
        merged = repaired_hwm([values for _, values in reads], n)
        return None if merged is None else (0, merged)


# A client: ("look", views so far) or ("act", actions); an action is ("claim" or "mark", node, nonce,
# deployment, floor) or ("repair", node, nonce, clock, sources still to read, reads so far).
ClientState = tuple[Any, ...]

# A grant: (fence, when granted, whether every node was blank at once since).
Granted = tuple[int, float, bool]


@dataclass
class ProtoWorld:
    protocol: Protocol
    nodes: list[NodeModel]
    up: set[int]
    now: float = 0.0
    gen: list[int] = field(default_factory=list)      # incarnations per node: its nonce is f"{i}.{gen[i]}"
    clients: list[ClientState] = field(default_factory=list)
    grants: list[Granted] = field(default_factory=list)  # in grant order
    started: int = 0                                  # clients started so far
    ticks: int = 0                                    # times the clock moved on
    snapshots: list[dict[str, object] | None] = field(default_factory=list)  # each node's last saved data set
    saves: int = 0                                    # snapshots taken so far
    owned: set[int] = field(default_factory=set)      # nodes this world copied (the others are shared)

    @classmethod
    def new(cls, protocol: Protocol, n: int, down: tuple[int, ...] = ()) -> ProtoWorld:
        return cls(protocol, [NodeModel(ready=False, inc_run=None) for _ in range(n)], set(range(n)) - set(down),
                   gen=[0] * n, snapshots=[None] * n)

    def copy(self) -> ProtoWorld:
        """Another world from here on; nodes are shared until one of the two changes them (`node`)."""
        self.owned = set()
        return ProtoWorld(self.protocol, list(self.nodes), set(self.up), self.now, list(self.gen),
                          list(self.clients), list(self.grants), self.started, self.ticks, list(self.snapshots),
                          self.saves)

    def node(self, i: int) -> NodeModel:
        """Node i, to change: copied first unless this world copied it already."""
        if i not in self.owned:
            self.nodes[i] = _copy(self.nodes[i])
            self.owned.add(i)
        return self.nodes[i]

    def key(self) -> tuple[object, ...]:
        return (tuple(_node_key(nd) for nd in self.nodes), frozenset(self.up), self.now, tuple(self.gen),
                tuple(sorted(self.clients, key=hash)), tuple(self.grants), self.started, self.ticks,
                tuple(_snapshot_key(s) for s in self.snapshots), self.saves)

    @property
    def n(self) -> int:
        return len(self.nodes)

    def clock(self) -> int:
        """The nodes' clock: on by a microsecond for every proposal a grant so far may have taken (an attempt that
        was not granted left nothing behind here)."""
        return clock_us(self.now, MAX_ROUNDS * len(self.grants))

    # -- one client request at a time ----------------------------------------------------------------------------

    def start_client(self) -> None:
        self.clients.append(("look", ()))
        self.started += 1

    def step(self, c: int) -> None:
        """Client c sends its next request (and, after its last look, makes its plan)."""
        state = self.clients[c]
        if state[0] == "look":
            views: tuple[GateView | None, ...] = state[1]
            i = len(views)
            view = self.protocol.gate(self.node(i), self.now, f"{i}.{self.gen[i]}", us=self.clock()) \
                if i in self.up else None
            views = (*views, view)
            if len(views) < self.n:
                self.clients[c] = ("look", views)
                return
            plan = self.protocol.plan(list(views), self.n)
            nonces = [view.nonce if view is not None else "" for view in views]
            deployment, floor = deployment_id(list(views)), deployment_floor(list(views))
            actions: list[tuple[Any, ...]] = [("claim", i, nonces[i], deployment, floor) for i in plan.fresh]
            actions += [("mark", i, nonces[i], deployment, floor) for i in plan.fresh]
            actions += [("repair", r.node, r.nonce, r.clock, r.sources, ()) for r in plan.repairs]
            self.clients[c] = ("act", tuple(actions))
            if not actions:
                del self.clients[c]
            return
        actions = list(state[1])
        action = actions[0]
        if action[0] in ("claim", "mark"):
            _, i, nonce, deployment, floor = action
            mode = "claim" if action[0] == "claim" else "fresh"
            code = self.protocol.mark(self.node(i), nonce, mode, floor, False, {}, self.now, self.clock(),
                                      deployment) if i in self.up else -1
            actions.pop(0)
            if mode == "claim" and code < 0:
                actions = []  # a claim failed: another deployment's, or gone; the client marks nothing
        else:
            _, i, nonce, clock, sources, reads = action
            if sources:
                j = sources[0]
                read = self.nodes[j].fences() if j in self.up else None
                if read is not None:
                    reads = (*reads, (read[0], tuple(sorted(read[1].items())), self.nodes[j].live_ttl(self.now)))
                actions[0] = ("repair", i, nonce, clock, sources[1:], reads)
            else:
                merged = self.protocol.repaired([(f, dict(v)) for f, v, _ in reads], self.n, clock)
                if merged is not None and i in self.up:
                    node = self.node(i)
                    delay = required_delay(DELAY, [live for _, _, live in reads])
                    if delay > DELAY:  # a longer TTL is live on the others: the gate keeps the longer quarantine
                        self.protocol.gate(node, self.now, f"{i}.{self.gen[i]}", delay, self.clock())
                    self.protocol.mark(node, nonce, "repair", merged[0], clock, merged[1], self.now, self.clock())
                actions.pop(0)
        if actions:
            self.clients[c] = ("act", tuple(actions))
        else:
            del self.clients[c]

    def crash_client(self, c: int) -> None:
        del self.clients[c]

    # -- nodes, time, attempts -------------------------------------------------------------------------------

    def _lost(self, i: int) -> None:
        """Node i lost data: a new incarnation's nonce; if no node has anything left, every grant so far was
        wiped out (see `violation`)."""
        self.gen[i] += 1
        if all(not nd.ready and not nd.hwm and not nd.locks for nd in self.nodes):
            self.grants = [(fence, at, True) for fence, at, _ in self.grants]

    def lose(self, i: int) -> None:
        """Node i restarts without its data."""
        self.node(i).lose_data()
        self.protocol.restart(self.nodes[i])
        self.snapshots[i] = None
        self._lost(i)

    def save(self, i: int) -> None:
        """Node i writes a snapshot of its data set (as `save 60 1000` does now and then)."""
        self.snapshots[i] = self.nodes[i].snapshot()
        self.saves += 1

    def roll_back(self, i: int) -> None:
        """Node i restarts from its last snapshot: what it wrote since is gone, its marker may be back."""
        snapshot = self.snapshots[i]
        assert snapshot is not None
        self.node(i).restore(snapshot)
        self.protocol.restart(self.nodes[i])
        self._lost(i)

    def restart_durable(self, i: int) -> None:
        """Node i, which runs AOF with fsync always, restarts with every write it acknowledged."""
        self.protocol.restart(self.node(i))
        self.gen[i] += 1

    def attempt(self) -> bool:
        """One acquisition by a client that knows nothing: up to MAX_ROUNDS proposals, each reaching every node
        that is up. Records a grant; True if granted."""
        if sum(self.nodes[i].counts for i in self.up) < quorum(self.n):
            return False  # (no grant can come of it: spare the copies)
        t = 1
        for _ in range(MAX_ROUNDS):
            answers = [self.node(i).acquire(NAME, f"a{len(self.grants)}", t, PTTL, self.now) if i in self.up
                       else Answer(Reply.FAILED) for i in range(self.n)]
            if decide(answers, self.n) is Outcome.GRANTED:
                self.grants.append((t, self.now, False))
                return True
            for i, answer in enumerate(answers):  # the give-backs of a failed round
                if answer.reply is Reply.GRANTED:
                    self.node(i).release(NAME, f"a{len(self.grants)}", t)
            t = next_proposal(t, answers)
        return False

    def violation(self) -> str | None:
        """Safety: fences increase from grant to grant, and no grant comes while an earlier one is valid (the
        model's grants are never released: each lasts its TTL), unless every node was blank at once in between."""
        for (fence, at, wiped), (later, later_at, _) in itertools.pairwise(self.grants):
            if later <= fence:
                return f"fence {later} granted after fence {fence}: {self.grants}"
            if later_at < at + PTTL and not wiped:
                return f"grant {later} at {later_at} overlaps grant {fence} valid until {at + PTTL}"
        return None

    def recovers(self) -> bool:
        """Liveness: one client alone, the clock moving on by at most the delay (then the TTL), gets a grant."""
        world = self.copy()
        world.clients = []
        for _ in range(2):
            world.start_client()
            while world.clients:
                world.step(0)
            if sum(world.nodes[i].counts for i in world.up) >= quorum(world.n):
                break
            world.now += DELAY + EPS
        world.now += PTTL
        return world.attempt()


def moves(world: ProtoWorld, *, clients: int, crashes: int, ticks: int, attempts: int,
          saves: int = 0) -> list[ProtoWorld]:
    """Every world one event away: a client's next request or its crash, a new client, a node losing its data,
    saving a snapshot, restarting from it, or coming up, the clock passing the fresh window or the quarantine,
    an attempt. `crashes` bounds the losses and roll-backs, `saves` the snapshots."""
    out = []
    for c in range(len(world.clients)):
        for event in ("step", "crash") if world.clients[c] != ("look", ()) else ("step",):
            nxt = world.copy()
            nxt.step(c) if event == "step" else nxt.crash_client(c)
            out.append(nxt)
    if world.started < clients:
        nxt = world.copy()
        nxt.start_client()
        out.append(nxt)
    if sum(world.gen) < crashes:
        for i in range(world.n):
            nxt = world.copy()
            nxt.lose(i)
            out.append(nxt)
            if world.nodes[i].durable:  # (AOF, fsync always: a restart keeps every write; never a snapshot)
                nxt = world.copy()
                nxt.restart_durable(i)
                out.append(nxt)
            elif world.snapshots[i] is not None:
                nxt = world.copy()
                nxt.roll_back(i)
                out.append(nxt)
    if world.saves < saves:
        for i in range(world.n):
            nxt = world.copy()
            nxt.save(i)
            out.append(nxt)
    for i in set(range(world.n)) - world.up:
        nxt = world.copy()
        nxt.up.add(i)
        out.append(nxt)
    if world.ticks < ticks:
        for dt in (WINDOW + EPS, DELAY + EPS):
            nxt = world.copy()
            nxt.now += dt
            nxt.ticks += 1
            out.append(nxt)
    if len(world.grants) < attempts:
        nxt = world.copy()
        if nxt.attempt():
            out.append(nxt)
    return out


def explore(start: ProtoWorld, limit: int = 600_000, **scope: int) -> tuple[int, str | None]:
    """Depth-first over every interleaving in the scope; returns (states seen, first violation or None)."""
    seen: set[object] = set()
    recovers: dict[object, bool] = {}  # `recovers()` drops the clients: states that differ only there share it
    stack = [start]
    while stack:
        world = stack.pop()
        k = world.key()
        if k in seen:
            continue
        seen.add(k)
        if len(seen) > limit:
            raise AssertionError(f"the scope grew past {limit} states")
        if (why := world.violation()) is not None:
            return len(seen), why
        if len(world.up) >= quorum(world.n):
            nodes, up, now, gen = k[:4]
            live = recovers.get(r := (nodes, up, now, gen, len(world.grants)))
            if live is None:
                live = recovers[r] = world.recovers()
            if not live:
                return len(seen), f"dead end ({world.protocol.name} protocol): {k}"
        stack.extend(moves(world, **scope))
    return len(seen), None
