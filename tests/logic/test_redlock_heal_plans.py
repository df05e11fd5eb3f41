"""Redlock's pure start-up and repair rules on hand-made gate views: `plan_heal` names the way out for every
unmarked node, `repaired` merges floors and fences and needs a quorum unless the clock helps, and the verdict says
when a quorum can be ready at the latest."""

from __future__ import annotations

from fencelock._redis.redlock import Gate, GateView, node_states, plan_heal, repaired, verdict


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
