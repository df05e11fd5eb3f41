"""The Redlock start-up and repair protocol, checked on an in-memory model before any server is involved.

It models the protocol (gate, claims, marks, repairs, floors) with concurrent clients that crash at any step, and
checks liveness (no dead end while a quorum is up) as well as safety; the older protocol, kept as a tiny model,
fails the liveness check. The fencing rule itself is checked in `test_redlock_model.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

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
    node_states,
    plan_heal,
    quorum,
    repaired,
    repaired_hwm,
    verdict,
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
    return replace(node, hwm=dict(node.hwm), locks=dict(node.locks))


def _node_key(node: NodeModel) -> tuple[object, ...]:
    return (node.ready, tuple(sorted(node.hwm.items())), tuple(sorted(node.locks.items())), node.floor,
            node.nonce, node.born, node.until, node.fresh, node.legacy)


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

    def key(self) -> object:
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
        if len(world.up) >= quorum(world.n) and not world.recovers():
            return len(seen), f"dead end ({world.protocol.name} protocol): {world.key()}"
        stack.extend(moves(world, **scope))
    return len(seen), None


SCOPE = {"clients": 2, "crashes": 1, "ticks": 2, "attempts": 2}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("down", [(), (2,)])
def test_exhaustively_for_three_nodes_startup_and_repair_have_no_dead_end_and_stay_safe(down: tuple[int, ...]) -> None:
    """Liveness and safety of start-up and repair, over every interleaving of a small scope: 3 nodes (one of
    them down at first contact, or none), two concurrent clients crashing at any step, one node losing its
    data at any step, the clock passing the window and the quarantine, two attempts anywhere."""
    states, violation = explore(ProtoWorld.new(Protocol(), 3, down), **SCOPE)
    assert violation is None, violation
    assert states > 100_000, states  # the scope really was explored (155,470 and 161,537 when written)


def test_exhaustively_marking_a_new_deployment_without_claims_lets_two_grants_share_a_fence() -> None:
    """Why claims: a look that straddles another client's marks and grant and a node's loss sees every node
    fresh; marking from it hands the emptied node fence 1 again while the first grant is valid."""
    _, violation = explore(ProtoWorld.new(NoClaim(), 3), **SCOPE)
    assert violation is not None
    assert violation.startswith("fence 1 granted after fence 1"), violation


@pytest.mark.parametrize("down", [(), (2,)])
def test_exhaustively_the_old_protocol_has_a_dead_end(down: tuple[int, ...]) -> None:
    """The bug of issue 13, found by the same search: two clients starting at once (or one node down at first
    contact) leave nodes seen, unmarked and unrepairable for ever."""
    _, violation = explore(ProtoWorld.new(OldProtocol(), 3, down), **SCOPE)
    assert violation is not None
    assert violation.startswith("dead end (old protocol)"), violation


def test_the_old_protocol_dead_ends_when_two_clients_look_at_once() -> None:
    """The counterexample step by step: A looks at node 0, B at nodes 0-2 (0 is no longer fresh to B), A at
    1-2 (no longer fresh to A): neither saw all fresh, none is ready, so no repair can ever start."""
    for protocol, dead in ((OldProtocol(), True), (Protocol(), False)):
        world = ProtoWorld.new(protocol, 3)
        world.start_client()
        world.start_client()
        world.step(0)
        for _ in range(3):
            world.step(1)
        world.step(0)
        world.step(0)
        while world.clients:  # both looked: the old protocol found nothing to do, the new one marks
            world.step(0)
        assert all(node.ready for node in world.nodes) is not dead, protocol.name
        assert world.recovers() is not dead, protocol.name


def _floor_scenario(protocol: Protocol) -> ProtoWorld:
    """3 nodes in use; fence 5 is granted on {0, 1} while node 2 is down; then 0 and 1 both lose their data and
    node 2 (which never saw fence 5) comes back: no quorum of ready nodes remembers fence 5."""
    world = ProtoWorld.new(protocol, 3)
    for node in world.nodes:
        node.ready = True
    world.up = {0, 1}
    world.nodes[0].hwm[NAME] = world.nodes[1].hwm[NAME] = 4
    assert world.attempt()
    assert world.grants[-1][0] == 5
    world.lose(0)
    world.lose(1)
    world.up = {0, 1, 2}
    return world


@pytest.mark.parametrize(("protocol", "safe"), [(Protocol(), True), (NoFloor(), False)])
def test_a_majority_that_lost_its_data_gets_a_floor_above_every_earlier_fence(protocol: Protocol,
                                                                              safe: bool) -> None:
    """Why the floor exists: repaired from the one ready node (which never saw fence 5), the majority would give
    fence 1 next; the floor from the clock puts it above. Without the floor, liveness holds but the fence goes
    backwards."""
    world = _floor_scenario(protocol)
    assert world.recovers()
    world.clients = []
    world.start_client()
    while world.clients:
        world.step(0)
    world.now += DELAY + EPS
    world.start_client()
    while world.clients:
        world.step(0)
    world.now += PTTL
    assert world.attempt()
    assert (world.violation() is None) is safe, world.grants


class ProtocolModel(RuleBasedStateMachine):
    """The same events at random, on 3 or 5 nodes and longer runs than the exhaustive scope."""

    def __init__(self) -> None:
        super().__init__()
        self.world = ProtoWorld.new(Protocol(), 3)

    @initialize(n=st.sampled_from([3, 5]), down=st.integers(0, 2))
    def start(self, n: int, down: int) -> None:
        self.world = ProtoWorld.new(Protocol(), n, tuple(range(n - down, n)))

    @rule(data=st.data())
    def event(self, data: st.DataObject) -> None:
        options = moves(self.world, clients=3, crashes=3, ticks=4, attempts=6)
        if options:
            self.world = data.draw(st.sampled_from(options))

    @invariant()
    def safe(self) -> None:
        assert self.world.violation() is None, self.world.violation()

    @invariant()
    def live(self) -> None:
        if len(self.world.up) >= quorum(self.world.n):
            assert self.world.recovers(), self.world.key()


TestProtocolModel = ProtocolModel.TestCase
TestProtocolModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])


def _views(*gates: Gate | None, left: float = 0.0) -> list[GateView | None]:
    return [None if g is None else GateView(g, f"n{i}", left) for i, g in enumerate(gates)]


def test_plan_heal_names_the_exit_of_every_unmarked_node() -> None:
    R, F, Q, P = Gate.READY, Gate.FRESH, Gate.QUARANTINED, Gate.REPAIRABLE
    assert plan_heal(_views(F, F, F), 3).fresh == (0, 1, 2)        # a new deployment
    assert not plan_heal(_views(F, F, None), 3)                    # one silent: it may be a lost majority
    assert not plan_heal(_views(R, F, Q), 3)                       # waiting: nothing to do yet
    (repair,) = plan_heal(_views(R, R, P), 3).repairs              # from a quorum of ready others
    assert (repair.node, repair.sources, repair.clock) == (2, (0, 1), False)
    (floor,) = plan_heal(_views(R, None, P), 3).repairs            # too few ready: the clock floor
    assert (floor.node, floor.sources, floor.clock) == (2, (0,), True)
    assert plan_heal(_views(R, Q, P), 3, repair=False).plain == (1, 2)


def test_repaired_merges_floors_and_hwm_and_needs_a_quorum_unless_the_clock_helps() -> None:
    reads = [(7, {"a": 3}), (9, {"a": 5, "b": 1})]
    assert repaired(reads[:1], 3, clock=False) is None
    assert repaired(reads, 3, clock=False) == (9, {"a": 5, "b": 1})
    assert repaired([], 3, clock=True) == (0, {})


def test_the_verdict_says_when_a_quorum_can_be_ready_at_the_latest() -> None:
    views = _views(Gate.READY, Gate.QUARANTINED, Gate.QUARANTINED, None, Gate.REPAIRABLE, left=4.0)
    states = node_states(["a", "b", "c", "d", "e"], views, now=1000.0)
    found = verdict(states, 5)
    assert not found.available
    assert found.eta == 4.0  # e is repairable now, then one of b and c in 4 s makes three
    assert states[1].quarantined_until == 1004.0
    assert "b: quarantined, repairable in 4.0 s" in states[1].describe()
    assert verdict(node_states(["a"] * 5, _views(*[Gate.READY] * 3, None, None), 0.0), 5).available
    assert verdict(node_states(["a"] * 5, _views(*[Gate.READY] * 2, None, None, None), 0.0), 5).eta is None
