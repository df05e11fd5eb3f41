"""The Redlock fencing rule, checked on an in-memory model of N nodes before any server is involved.

A Hypothesis state machine interleaves attempts whose requests reach the nodes in any order and at any time
(or never), lock expiry, releases, crashes that lose a minority's data, and repairs. The invariant, after every step:

- fences of successful grants are unique, and
- a grant that began after another one was complete has a larger fence (a holder that paused past its TTL
  always holds a smaller fence than the holder after it).

A crash may also restart a node from an older snapshot (its marker back, its hwm and keys as they were then).
The nodes are `NodeModel`, the specification of the Lua script; the client side uses the same `decide`,
`next_proposal` and `repaired_hwm` as the real backend. The start-up and repair protocol is checked in
`test_redlock_protocol_model.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fencelock._logic.timing import drift
from fencelock._redis.redlock import (
    Answer,
    NodeModel,
    Outcome,
    Reply,
    decide,
    decode,
    next_proposal,
    quorum,
    repaired_hwm,
    worth_another_round,
)

TTL = 10.0
QUARANTINE = TTL  # the repair delay must be at least the longest TTL
NAME = "n"


@dataclass
class AttemptModel:
    token: str
    t: int
    started: float
    step: int
    in_flight: list[int]                          # nodes whose request has not been processed yet
    answers: dict[int, Answer] = field(default_factory=dict)
    done: bool = False


@dataclass
class Grant:
    fence: int
    started: int      # logical time: the step at which the attempt began
    completed: int    # ... and the step at which its quorum was complete
    token: str


class RedlockModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.n = 3
        self.nodes: list[NodeModel] = []
        self.now = 0.0
        self.crashed_at: dict[int, float] = {}
        self.snapshots: dict[int, dict[str, object]] = {}  # node -> its data set when it last saved
        self.attempts: list[AttemptModel] = []
        self.grants: list[Grant] = []
        self.known = 0  # what clients have learnt of the nodes' hwm
        self.counter = 0
        self.step = 0  # every event gets its own step, so "before" is never a tie

    @initialize(n=st.sampled_from([3, 5]))
    def start(self, n: int) -> None:
        self.n = n
        self.nodes = [NodeModel() for _ in range(n)]

    # -- clients -------------------------------------------------------------------------------------------

    @precondition(lambda self: sum(not a.done for a in self.attempts) < 3)
    @rule(stale=st.integers(0, 3), reach=st.lists(st.booleans(), min_size=5, max_size=5))
    def start_attempt(self, stale: int, reach: list[bool]) -> None:
        """A client proposes 1 + the highest hwm it knows; `stale` models a client that knows less, and
        `reach` which nodes its requests will ever arrive at (the others are lost on the way)."""
        self.counter += 1
        t = next_proposal(max(0, self.known - stale), ())
        self.step += 1
        targets = [i for i in range(self.n) if reach[i]]
        self.attempts.append(AttemptModel(f"token{self.counter}", t, self.now, self.step, targets))

    @precondition(lambda self: any(a.in_flight for a in self.attempts))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """One request reaches its node, in any order, possibly long after its attempt was decided."""
        attempt = data.draw(st.sampled_from([a for a in self.attempts if a.in_flight]))
        self._deliver(attempt, data.draw(st.sampled_from(attempt.in_flight)))

    @precondition(lambda self: any(a.in_flight for a in self.attempts))
    @rule(data=st.data())
    def deliver_some(self, data: st.DataObject) -> None:
        """Several requests of one attempt arrive back to back (the common case: a quick attempt)."""
        attempt = data.draw(st.sampled_from([a for a in self.attempts if a.in_flight]))
        for i in data.draw(st.permutations(attempt.in_flight)):
            if data.draw(st.booleans()):
                self._deliver(attempt, i)

    def _deliver(self, attempt: AttemptModel, i: int) -> None:
        attempt.in_flight.remove(i)
        self.step += 1
        answer = self.nodes[i].acquire(NAME, attempt.token, attempt.t, TTL, self.now)
        self.known = max(self.known, answer.hwm)
        if attempt.done:
            return
        attempt.answers[i] = answer
        outcome = decide(attempt.answers.values(), self.n)
        if outcome is Outcome.GRANTED:
            attempt.done = True
            # The client's validity check: a grant that took the whole TTL is no grant.
            if self.now - attempt.started < TTL - drift(TTL):
                self.grants.append(Grant(attempt.t, attempt.step, self.step, attempt.token))
        elif outcome is not None:
            attempt.done = True
            self.known = max(self.known, next_proposal(attempt.t, attempt.answers.values()) - 1)

    @precondition(lambda self: any(a.in_flight for a in self.attempts))
    @rule(data=st.data())
    def lose_request(self, data: st.DataObject) -> None:
        """A request never arrives (the network lost it, or the client gave up on a slow node)."""
        attempt = data.draw(st.sampled_from([a for a in self.attempts if a.in_flight]))
        attempt.in_flight.remove(data.draw(st.sampled_from(attempt.in_flight)))

    @precondition(lambda self: bool(self.grants))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        grant = data.draw(st.sampled_from(self.grants))
        for i in data.draw(st.lists(st.sampled_from(range(self.n)), unique=True)):
            self.nodes[i].release(NAME, grant.token, grant.fence)

    @rule(dt=st.sampled_from([0.1, 1.0, 4.0, 11.0]))
    def advance_time(self, dt: float) -> None:
        self.now += dt

    # -- nodes ---------------------------------------------------------------------------------------------

    # Only after a grant: a crash before any grant has nothing of interest to lose, and the search is better
    # spent where a lost hwm could matter.
    @rule(data=st.data())
    def save(self, data: st.DataObject) -> None:
        """A node writes a snapshot of its data set (RDB)."""
        i = data.draw(st.sampled_from(range(self.n)))
        if i not in self.crashed_at:
            self.snapshots[i] = self.nodes[i].snapshot()

    @precondition(lambda self: len(self.crashed_at) < self.n - quorum(self.n) and bool(self.grants))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """A node restarts without its data (no fsync), or from its last snapshot (rolled back): either way it
        does not count until repaired (the restart is told apart). At most a minority is out at once."""
        i = data.draw(st.sampled_from([j for j in range(self.n) if j not in self.crashed_at]))
        snapshot = self.snapshots.pop(i, None)
        if snapshot is not None and data.draw(st.booleans()):
            self.nodes[i].restore(snapshot)
        else:
            self.nodes[i].lose_data()
        self.nodes[i].ready = False
        self.crashed_at[i] = self.now

    @precondition(lambda self: any(self.now >= at + QUARANTINE for at in self.crashed_at.values()))
    @rule(data=st.data())
    def repair(self, data: st.DataObject) -> None:
        """After the quarantine, the hwm becomes the max over a quorum of the other (ready) nodes."""
        i = data.draw(st.sampled_from([j for j, at in self.crashed_at.items() if self.now >= at + QUARANTINE]))
        ready = [j for j in range(self.n) if j != i and self.nodes[j].ready]
        chosen = data.draw(st.lists(st.sampled_from(ready), min_size=quorum(self.n), unique=True)
                           if len(ready) >= quorum(self.n) else st.just([]))
        merged = repaired_hwm([self.nodes[j].hwm for j in chosen], self.n)
        if merged is None:
            return
        for key, value in merged.items():  # raised, never lowered (a node restarted from a snapshot keeps some)
            self.nodes[i].hwm[key] = max(self.nodes[i].hwm.get(key, 0), value)
        self.nodes[i].ready, self.nodes[i].inc_run = True, self.nodes[i].run  # marked by this server process
        del self.crashed_at[i]

    # -- the invariant -------------------------------------------------------------------------------------

    @invariant()
    def fences_are_unique_and_follow_real_time(self) -> None:
        fences = [g.fence for g in self.grants]
        assert len(fences) == len(set(fences)), f"two grants with one fence: {self.grants}"
        for earlier in self.grants:
            for later in self.grants:
                if earlier.completed < later.started:
                    assert earlier.fence < later.fence, f"fence went backwards: {earlier} then {later}"


TestRedlockModel = RedlockModel.TestCase
TestRedlockModel.settings = settings(max_examples=500, stateful_step_count=50, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


def test_without_repair_a_restarted_node_lets_a_fence_go_backwards() -> None:
    """The hazard the repair exists for, step by step: 3 nodes, one restarts empty and counts at once."""
    nodes = [NodeModel() for _ in range(3)]
    first = [nodes[i].acquire(NAME, "a", 5, TTL, 0.0) for i in (0, 1)]   # A is granted fence 5 on {0, 1}
    assert decide(first, 3) is Outcome.GRANTED
    nodes[1].lose_data()
    nodes[1].ready, nodes[1].inc_run = True, nodes[1].run               # no quarantine, no repair
    later = [nodes[i].acquire(NAME, "b", 1, TTL, 20.0) for i in (1, 2)]  # B, after A expired, proposes 1
    assert decide(later, 3) is Outcome.GRANTED                          # ... and is granted fence 1 < 5


def test_with_repair_the_restarted_node_refuses_the_stale_proposal() -> None:
    nodes = [NodeModel() for _ in range(3)]
    assert decide([nodes[i].acquire(NAME, "a", 5, TTL, 0.0) for i in (0, 1)], 3) is Outcome.GRANTED
    nodes[1].lose_data()
    merged = repaired_hwm([nodes[0].hwm, nodes[2].hwm], 3)
    assert merged == {NAME: 5}
    nodes[1].hwm, nodes[1].ready, nodes[1].inc_run = merged, True, nodes[1].run
    later = [nodes[i].acquire(NAME, "b", 1, TTL, 20.0) for i in (0, 1, 2)]
    assert decide(later, 3) is Outcome.REFUSED
    assert next_proposal(1, later) == 6


def test_without_repair_the_plain_mark_s_clock_floor_keeps_the_next_fence_above_the_lost_ones() -> None:
    """repair=False marks a restarted node at once (no quarantine), with a floor from its clock: the node refuses
    a proposal below the floor, the client learns it, and the next grant is above every fence the node lost."""
    nodes = [NodeModel() for _ in range(3)]
    assert decide([nodes[i].acquire(NAME, "a", 5, TTL, 0.0) for i in (0, 1)], 3) is Outcome.GRANTED
    nodes[1].lose_data()
    clock = 1_800_000_000_000_000                                       # the node's clock, in µs since 1970
    assert nodes[1].mark("", "plain", 0, True, {}, 20.0, clock) == 1
    # B cannot reach node 0, and proposes 1 from what node 2 knows
    first = [Answer(Reply.FAILED), *(nodes[i].acquire(NAME, "b", 1, TTL, 20.0) for i in (1, 2))]
    assert decide(first, 3) is Outcome.REFUSED
    t = next_proposal(1, first)
    assert t == clock + 1
    second = [Answer(Reply.FAILED), *(nodes[i].acquire(NAME, "b", t, TTL, 20.0) for i in (1, 2))]
    assert decide(second, 3) is Outcome.GRANTED
    assert t > 5


@pytest.mark.parametrize(("raw", "expected"), [
    ([1, 7], Answer(Reply.GRANTED, 7)), ([-1, 0, 0], Answer(Reply.UNREADY)),
    ([0, 4, 1500], Answer(Reply.HELD, 4, 1.5)), ([0, 4, -1], Answer(Reply.STALE, 4)),
])
def test_decode(raw: list[int], expected: Answer) -> None:
    assert decode(raw) == expected


def test_decide_returns_as_soon_as_the_outcome_is_known() -> None:
    granted, failed, held = Answer(Reply.GRANTED, 1), Answer(Reply.FAILED), Answer(Reply.HELD, 1, 1.0)
    assert decide([granted, granted], 5) is None
    assert decide([granted, granted, granted], 5) is Outcome.GRANTED
    assert decide([held, held, held], 5) is Outcome.REFUSED
    assert decide([failed, failed, failed], 5) is Outcome.UNAVAILABLE
    assert decide([failed, failed, held], 5) is Outcome.REFUSED


# -- exhaustive check of a small scope -------------------------------------------------------------------------
# Random search can miss a narrow interleaving, so the same rules are also explored exhaustively for 3 nodes:
# every order of two attempts (each reaching any subset of nodes, proposing from full or stale knowledge), one
# crash of one node at any moment, its repair from any quorum of the others, and the clock moving past TTLs.
# With `rollback`, a node may also save a snapshot at any moment, and the crash may restart it from that
# snapshot: its keys and hwm as they were then, keys expiring at their old times (a repair raises, never lowers).

TICK = TTL + 1.0

# An attempt in flight: proposal, token, nodes its request will still reach, (granted, refused) so far, decided,
# start time, and the highest fence granted before it started.
Flight = tuple[int, str, frozenset[int], tuple[int, int], bool, float, int]
# The world: nodes, now, ticks so far, crash (None, (node, when) or "done"), attempts, fences granted, known hwm,
# and the snapshot (None, or (node, its state then)).
World = tuple[tuple[NodeModel, ...], float, int, Any, tuple[Flight, ...], frozenset[int], int, Any]


def _explore(quarantine: float, repair: bool, limit: int = 3_000_000, clock_floor: int = 0,
             rollback: bool = False, detected: bool = True, max_ticks: int = 2,
             stales: tuple[int, ...] = (0, 1)) -> tuple[int, str | None]:
    """Depth-first search over all interleavings; returns (states seen, first violation or None). `clock_floor`: the
    fence floor a node that lost its data takes from its clock when it counts again (0: none). `rollback`: the
    crash may also restart a node from a snapshot it saved earlier; `detected` False: such a node counts at once,
    as if nothing were lost (its marker came back with the snapshot), and is never repaired."""
    n, q = 3, quorum(3)
    seen: set[object] = set()

    # A node in a state is never changed once the state is made (a step copies the one node it changes), so
    # each node's part of the key is computed once, and kept on it.
    def node_key(nd: NodeModel) -> object:
        found = nd.__dict__.get("_key")
        if found is None:
            found = nd.__dict__["_key"] = (nd.ready, tuple(sorted(nd.hwm.items())), tuple(sorted(nd.locks.items())),
                                           nd.floor)
        return found

    def key(state: World) -> object:
        snap = state[7]
        saved = None if snap is None else (snap[0], node_key(snap[1]))
        return (tuple(node_key(nd) for nd in state[0]), *state[1:7], saved)

    def copy_node(nodes: tuple[NodeModel, ...], i: int) -> tuple[tuple[NodeModel, ...], NodeModel]:
        """The nodes with node i copied (the others shared), and that copy."""
        nd = nodes[i]
        fresh = NodeModel(nd.ready, dict(nd.hwm), dict(nd.locks), nd.floor)
        return (*nodes[:i], fresh, *nodes[i + 1:]), fresh

    # state: nodes, now, ticks, crash (None | (node, at) | "done"), attempts, granted fences, known
    # attempt: (t, token, in_flight, answers, done, started, floor)
    start: World = (tuple(NodeModel() for _ in range(n)), 0.0, 0, None, (), frozenset(), 0, None)
    stack = [start]
    while stack:
        state = stack.pop()
        k = key(state)
        if k in seen:
            continue
        seen.add(k)
        if len(seen) > limit:
            raise AssertionError(f"the scope grew past {limit} states")
        nodes, now, ticks, crash, attempts, granted, known, snap = state
        if len(attempts) < 2:
            for stale in stales:
                t = next_proposal(max(0, known - stale), ())
                floor = max(granted, default=0)  # every grant so far completed before this attempt starts
                for mask in range(1, 2 ** n):
                    reach = frozenset(i for i in range(n) if mask >> i & 1)
                    attempt: Flight = (t, f"token{len(attempts)}", reach, (0, 0), False, now, floor)
                    stack.append((nodes, now, ticks, crash, (*attempts, attempt), granted, known, snap))
        for a, (t, token, in_flight, answers, done, started, floor) in enumerate(attempts):
            for i in in_flight:
                new_nodes, node = copy_node(nodes, i)
                answer = node.acquire(NAME, token, t, TTL, now)
                new_known = max(known, answer.hwm)
                new_answers, new_done, new_granted = answers, done, granted
                if not done:
                    # Only how many granted and how many refused matters to `decide`: keep counts, not answers.
                    granted_here = answers[0] + (answer.reply is Reply.GRANTED)
                    new_answers = (granted_here, answers[1] + (answer.reply is not Reply.GRANTED))
                    outcome = decide([Answer(Reply.GRANTED)] * granted_here
                                     + [Answer(Reply.STALE)] * new_answers[1], n)
                    if outcome is not None:
                        new_done = True
                    if outcome is Outcome.GRANTED and now - started < TTL - drift(TTL):
                        if t in granted:
                            return len(seen), f"two grants with fence {t}"
                        if t <= floor:
                            return len(seen), f"fence {t} granted after fence {floor} was complete"
                        new_granted = granted | {t}
                new_attempt: Flight = (t, token, in_flight - {i}, new_answers, new_done, started, floor)
                new_attempts = (*attempts[:a], new_attempt, *attempts[a + 1:])
                stack.append((new_nodes, now, ticks, crash, new_attempts, new_granted, new_known, snap))
        if ticks < max_ticks:
            stack.append((nodes, now + TICK, ticks + 1, crash, attempts, granted, known, snap))
        if crash is None:
            for i in range(n):
                new_nodes, node = copy_node(nodes, i)
                node.lose_data()
                stack.append((new_nodes, now, ticks, (i, now), attempts, granted, known, snap))
            if rollback and snap is None:  # node 0 saves (the nodes are alike: attempts reach any subset)
                stack.append((nodes, now, ticks, crash, attempts, granted, known, (0, copy_node(nodes, 0)[1])))
            if snap is not None:  # the crash restarts the node that saved it from its snapshot
                i, saved = snap
                new_nodes, node = copy_node(nodes, i)
                node.hwm, node.locks = dict(saved.hwm), dict(saved.locks)
                node.ready = not detected
                stack.append((new_nodes, now, ticks, (i, now) if detected else "done", attempts, granted, known,
                              snap))
        if isinstance(crash, tuple) and now >= crash[1] + quarantine:
            i = crash[0]
            others = [j for j in range(n) if j != i]
            for chosen in ([others] if len(others) == q else [others[:q], others[-q:]]):
                new_nodes, node = copy_node(nodes, i)
                merged = repaired_hwm([nodes[j].hwm for j in chosen], n) if repair else {}
                for key_, value in (merged or {}).items():  # raised, never lowered (a rolled-back node has some)
                    node.hwm[key_] = max(node.hwm.get(key_, 0), value)
                node.floor = clock_floor
                node.ready = True
                stack.append((new_nodes, now, ticks, "done", attempts, granted, known, snap))
    return len(seen), None


@pytest.mark.timeout(600)  # a search of most of a million states: about a minute
def test_exhaustively_for_three_nodes_fences_never_repeat_or_go_backwards() -> None:
    states, violation = _explore(quarantine=TTL, repair=True)
    assert violation is None, violation
    assert states > 500_000  # the scope really was explored (722,890 states when this was written)


def test_exhaustively_without_repair_a_fence_repeats_or_goes_backwards() -> None:
    _, violation = _explore(quarantine=TTL, repair=False)
    assert violation is not None


@pytest.mark.timeout(600)  # a search of most of a million states: about a minute
def test_exhaustively_without_repair_or_quarantine_a_clock_floor_keeps_fences_ordered() -> None:
    """repair=False (docs/decisions/2026-12-01-redlock-plain-floor.md): the node counts again at once, with a
    floor from its clock, above every fence of the scope (the clock assumption). Fences never repeat or go
    backwards, although the lock itself may be granted twice at once (the search checks fences only)."""
    states, violation = _explore(quarantine=0.0, repair=False, clock_floor=1_000)
    assert violation is None, violation
    assert states > 500_000  # the scope really was explored (818,367 states when this was written)


@pytest.mark.timeout(600)
def test_exhaustively_a_node_restarted_from_a_snapshot_is_repaired_before_it_counts_and_fences_hold() -> None:
    """A node may save a snapshot at any moment and restart from it instead of empty: detected (it does not count
    until its quarantine and repair), no fence repeats or goes backwards. (One clock tick: enough for the
    quarantine to pass once, and a scope that stays within seconds.)"""
    states, violation = _explore(quarantine=TTL, repair=True, rollback=True, max_ticks=1)
    assert violation is None, violation
    assert states > 300_000, states  # the scope really was explored (399,492 states when this was written)


def test_exhaustively_a_node_restarted_from_a_snapshot_that_counts_at_once_repeats_a_fence() -> None:
    """The hazard of a snapshot: its marker is back, its hwm is older than the grants after it; counted at once
    (nothing tells the restart apart), the next grant reuses a fence."""
    _, violation = _explore(quarantine=TTL, repair=True, rollback=True, detected=False, max_ticks=1)
    assert violation is not None


def test_exhaustively_repairing_without_the_quarantine_lets_a_fence_repeat() -> None:
    """An attempt in flight when the node crashed can finish after an immediate repair: why the delay exists."""
    _, violation = _explore(quarantine=0.0, repair=True)
    assert violation is not None


def test_a_woken_waiter_proposes_again_when_the_keys_it_met_are_the_releasers() -> None:
    """Woken by the release of fence 7, a waiter still met that key on three of five nodes (the release had not
    reached them yet): worth another round at once. A key above the released fence is a new holder's: not."""
    granted, stale = Answer(Reply.GRANTED, 8), Answer(Reply.STALE, 7)
    releasers = [Answer(Reply.HELD, 7, 29.9)] * 3
    assert not worth_another_round([granted, stale, *releasers], 5)  # not woken: three keys held, wait
    assert worth_another_round([granted, stale, *releasers], 5, released=7)
    newer = [Answer(Reply.HELD, 8, 29.9)] * 3
    assert not worth_another_round([granted, stale, *newer], 5, released=7)
    assert not worth_another_round([granted, stale, *[Answer(Reply.UNREADY)] * 3], 5, released=7)
