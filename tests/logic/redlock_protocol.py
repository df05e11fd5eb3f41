"""The Redlock start-up and repair protocol as an in-memory world, searched by `test_redlock_protocol_model.py`:
fencelock's protocol and three variants (no floor, no claim, the old one), nodes that lose their data or come up
late, clients that crash at any step, time, attempts, and a depth-first search over every interleaving."""

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
    deployment_id,
    next_proposal,
    plan_heal,
    quorum,
    repaired,
    repaired_hwm,
)

from .test_redlock_model import NAME

# -- the start-up and repair protocol: liveness as well as safety ------------------------------------------------
# Nodes start never seen. Clients look at every node's gate one request at a time, plan (`plan_heal`), and carry
# the plan out one request at a time (marks, reads of the ready nodes, the final raise+mark); any client may
# crash between any two requests, any node may lose its data between any two requests (never all nodes at once
# once something was granted: that is a new deployment, by definition), nodes may be down at first contact and
# come up later, time passes the fresh window and the quarantine, and attempts are made (atomically, from a
# client that knows nothing, learning over rounds as the real one does).
#
# Safety: every grant's fence is above every earlier one's, and no grant overlaps a valid earlier one.
# Liveness: from every state with a quorum of nodes up, one client alone, with the clock moving on by at most
# the repair delay (plus the TTL for holders' keys to expire), gets a grant.

DELAY, WINDOW = 10.0, 2.0    # the repair delay (>= TTL) and the fresh window (<= the delay)
PTTL = 5.0                   # the TTL of the protocol model's grants
EPS = 0.5


def clock_us(now: float) -> int:
    """The nodes' clock in microseconds since a start far in the past: above every counter fence."""
    return 10**9 + int(now * 1_000_000)


def _copy(node: NodeModel) -> NodeModel:
    """A copy of every field, with its own `hwm` and `locks` (`dataclasses.replace` is most of a search's time)."""
    fresh = object.__new__(NodeModel)
    fresh.__dict__.update(node.__dict__)
    fresh.hwm, fresh.locks = dict(node.hwm), dict(node.locks)
    return fresh


def _node_key(node: NodeModel) -> tuple[object, ...]:
    return (node.ready, tuple(sorted(node.hwm.items())), tuple(sorted(node.locks.items())), node.floor,
            node.nonce, node.born, node.until, node.fresh, node.legacy, node.claim)


class Protocol:
    """The protocol under test: fencelock's (gate, plan_heal, mark) ..."""

    name = "new"

    def gate(self, node: NodeModel, now: float, nonce: str) -> GateView:
        return node.gate(now, DELAY, WINDOW, nonce)

    def plan(self, views: list[GateView | None], n: int) -> HealPlan:
        return plan_heal(views, n)

    def mark(self, node: NodeModel, nonce: str, mode: str, floor: int, clock: bool, values: dict[str, int],
             now: float, deployment: str = "") -> int:
        return node.mark(nonce, mode, floor, clock, values, now, clock_us(now), deployment)

    def repaired(self, reads: list[tuple[int, dict[str, int]]], n: int,
                 clock: bool) -> tuple[int, dict[str, int]] | None:
        return repaired(reads, n, clock)


class NoFloor(Protocol):
    """fencelock's, but a node marked without a quorum of ready others gets no floor from its clock."""

    name = "no floor"

    def mark(self, node: NodeModel, nonce: str, mode: str, floor: int, clock: bool, values: dict[str, int],
             now: float, deployment: str = "") -> int:
        return node.mark(nonce, mode, floor, False, values, now, 0, deployment)


class NoClaim(Protocol):
    """fencelock's, but a new deployment is marked without claiming its nodes first."""

    name = "no claim"

    def mark(self, node: NodeModel, nonce: str, mode: str, floor: int, clock: bool, values: dict[str, int],
             now: float, deployment: str = "") -> int:
        if mode == "claim":
            return 1
        if mode == "fresh" and node.nonce == nonce and not node.ready:
            node.ready = True
            return 1
        return node.mark(nonce, mode, floor, clock, values, now, clock_us(now), deployment)


class OldProtocol(Protocol):
    """... and the one before it: 'fresh' only to the first look, marks only after an all-fresh look, repair
    only from a quorum of ready others, no incarnation, no floor."""

    name = "old"

    def gate(self, node: NodeModel, now: float, nonce: str) -> GateView:
        if node.ready:
            return GateView(Gate.READY)
        if node.nonce is None:
            node.nonce, node.until = "seen", now + DELAY
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
             now: float, deployment: str = "") -> int:
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
# deployment) or ("repair", node, nonce, clock, sources still to read, reads so far).
ClientState = tuple[Any, ...]


@dataclass
class ProtoWorld:
    protocol: Protocol
    nodes: list[NodeModel]
    up: set[int]
    now: float = 0.0
    gen: list[int] = field(default_factory=list)      # incarnations per node: its nonce is f"{i}.{gen[i]}"
    clients: list[ClientState] = field(default_factory=list)
    grants: list[tuple[int, float]] = field(default_factory=list)  # (fence, when granted), in grant order
    started: int = 0                                  # clients started so far
    ticks: int = 0                                    # times the clock moved on

    @classmethod
    def new(cls, protocol: Protocol, n: int, down: tuple[int, ...] = ()) -> ProtoWorld:
        return cls(protocol, [NodeModel(ready=False) for _ in range(n)], set(range(n)) - set(down), gen=[0] * n)

    def copy(self) -> ProtoWorld:
        return ProtoWorld(self.protocol, [_copy(nd) for nd in self.nodes], set(self.up), self.now,
                          list(self.gen), list(self.clients), list(self.grants), self.started, self.ticks)

    def key(self) -> tuple[object, ...]:
        return (tuple(_node_key(nd) for nd in self.nodes), frozenset(self.up), self.now, tuple(self.gen),
                tuple(sorted(self.clients, key=repr)), tuple(self.grants), self.started, self.ticks)

    @property
    def n(self) -> int:
        return len(self.nodes)

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
            view = self.protocol.gate(self.nodes[i], self.now, f"{i}.{self.gen[i]}") if i in self.up else None
            views = (*views, view)
            if len(views) < self.n:
                self.clients[c] = ("look", views)
                return
            plan = self.protocol.plan(list(views), self.n)
            nonces = [view.nonce if view is not None else "" for view in views]
            deployment = deployment_id(list(views))
            actions: list[tuple[Any, ...]] = [("claim", i, nonces[i], deployment) for i in plan.fresh]
            actions += [("mark", i, nonces[i], deployment) for i in plan.fresh]
            actions += [("repair", r.node, r.nonce, r.clock, r.sources, ()) for r in plan.repairs]
            self.clients[c] = ("act", tuple(actions))
            if not actions:
                del self.clients[c]
            return
        actions = list(state[1])
        action = actions[0]
        if action[0] in ("claim", "mark"):
            _, i, nonce, deployment = action
            mode = "claim" if action[0] == "claim" else "fresh"
            code = self.protocol.mark(self.nodes[i], nonce, mode, 0, False, {}, self.now, deployment) \
                if i in self.up else -1
            actions.pop(0)
            if mode == "claim" and code < 0:
                actions = []  # a claim failed: another deployment's, or gone; the client marks nothing
        else:
            _, i, nonce, clock, sources, reads = action
            if sources:
                j = sources[0]
                read = self.nodes[j].fences() if j in self.up else None
                if read is not None:
                    reads = (*reads, (read[0], tuple(sorted(read[1].items()))))
                actions[0] = ("repair", i, nonce, clock, sources[1:], reads)
            else:
                merged = self.protocol.repaired([(f, dict(v)) for f, v in reads], self.n, clock)
                if merged is not None and i in self.up:
                    self.protocol.mark(self.nodes[i], nonce, "repair", merged[0], clock, merged[1], self.now)
                actions.pop(0)
        if actions:
            self.clients[c] = ("act", tuple(actions))
        else:
            del self.clients[c]

    def crash_client(self, c: int) -> None:
        del self.clients[c]

    # -- nodes, time, attempts -------------------------------------------------------------------------------

    def may_lose(self, i: int) -> bool:
        """A node may lose its data unless, something having been granted, no node would keep its marker."""
        return not self.grants or any(nd.ready for j, nd in enumerate(self.nodes) if j != i)

    def lose(self, i: int) -> None:
        self.nodes[i].lose_data()
        self.gen[i] += 1

    def attempt(self) -> bool:
        """One acquisition by a client that knows nothing: up to MAX_ROUNDS proposals, each reaching every node
        that is up. Records a grant; True if granted."""
        t = 1
        for _ in range(MAX_ROUNDS):
            answers = [self.nodes[i].acquire(NAME, f"a{len(self.grants)}", t, PTTL, self.now) if i in self.up
                       else Answer(Reply.FAILED) for i in range(self.n)]
            if decide(answers, self.n) is Outcome.GRANTED:
                self.grants.append((t, self.now))
                return True
            for i, answer in enumerate(answers):  # the give-backs of a failed round
                if answer.reply is Reply.GRANTED:
                    self.nodes[i].release(NAME, f"a{len(self.grants)}", t)
            t = next_proposal(t, answers)
        return False

    def violation(self) -> str | None:
        """Safety: fences increase from grant to grant, and no grant comes while an earlier one is valid (the
        model's grants are never released: each lasts its TTL)."""
        for (fence, at), (later, later_at) in itertools.pairwise(self.grants):
            if later <= fence:
                return f"fence {later} granted after fence {fence}: {self.grants}"
            if later_at < at + PTTL:
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
            if sum(world.nodes[i].ready for i in world.up) >= quorum(world.n):
                break
            world.now += DELAY + EPS
        world.now += PTTL
        return world.attempt()


def moves(world: ProtoWorld, *, clients: int, crashes: int, ticks: int, attempts: int) -> list[ProtoWorld]:
    """Every world one event away: a client's next request or its crash, a new client, a node losing its data
    or coming up, the clock passing the fresh window or the quarantine, an attempt."""
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
            if world.may_lose(i):
                nxt = world.copy()
                nxt.lose(i)
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


def explore(start: ProtoWorld, limit: int = 400_000, **scope: int) -> tuple[int, str | None]:
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
