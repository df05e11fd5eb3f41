"""Redlock's round, tally, heal and repair decisions, driven with no server.

The backend (`_async/redlock.py`, `_async/redlock_nodes.py`) sends what these functions say and feeds the replies
back; each test states one branch of a decision. The last tests run whole attempts and heals against `NodeModel`
nodes on a fake clock, the way the backend strings the functions together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from fencelock._redis.redlock import (
    FALLBACK_PAUSE,
    GATE_TIMEOUT,
    MAX_ROUNDS,
    NEW_DEPLOYMENT,
    NO_ANSWER,
    Answer,
    Gate,
    GateView,
    Heal,
    Next,
    NodeModel,
    Outcome,
    Repair,
    Reply,
    Step,
    attempt_states,
    deployment_id,
    deployment_step,
    extend_outcome,
    fallback_pause,
    learned,
    look_timeout,
    mark_args,
    marked,
    marker_floor,
    next_proposal,
    next_step,
    node_answer,
    plan_heal,
    repair_marks,
    repair_progress,
    repaired,
    settled,
    tally,
    unavailable,
)

FLOOR = 10**9  # the model nodes' clock in microseconds, for a clock floor
G, F, U = Answer(Reply.GRANTED, 5), Answer(Reply.FAILED), Answer(Reply.UNREADY)


def held(hwm: int, pttl: float = 9.0) -> Answer:
    return Answer(Reply.HELD, hwm, pttl)


def stale(hwm: int) -> Answer:
    return Answer(Reply.STALE, hwm)


# -- one round's tally ---------------------------------------------------------------------------------------

def test_a_reply_that_did_not_come_or_failed_is_a_failed_answer() -> None:
    assert node_answer(None).reply is Reply.FAILED
    assert node_answer(ConnectionError()).reply is Reply.FAILED
    assert node_answer([1, 7]) == Answer(Reply.GRANTED, 7)


def test_a_granted_round_gives_nothing_back_and_heals_only_in_the_background() -> None:
    counted = tally([G, G, G, F, stale(9)], 5)
    assert (counted.outcome, counted.give_back, counted.heal) == (Outcome.GRANTED, (), Heal.NO)
    assert tally([G, G, G, U, U], 5).heal is Heal.BACKGROUND
    assert tally([G, G, G, U, U], 5, healing=True).heal is Heal.NO  # one heal at a time


def test_a_refused_round_gives_its_t_back_where_it_was_granted_or_may_still_be() -> None:
    counted = tally([G, held(3), F, held(3), G], 5)
    assert counted.outcome is Outcome.REFUSED
    assert counted.give_back == (0, 2, 4)
    assert (counted.reachable, counted.usable, counted.heal) == (4, 4, Heal.NO)


def test_a_refused_round_heals_now_only_if_the_nodes_out_could_make_up_a_quorum() -> None:
    assert tally([G, U, U, held(3), held(3)], 5).heal is Heal.NOW
    counted = tally([G, U, F, F, F], 5)  # two answered: even ready again, no quorum
    assert (counted.outcome, counted.heal, counted.reachable) == (Outcome.UNAVAILABLE, Heal.NO, 2)


def test_a_tally_needs_every_nodes_answer() -> None:
    with pytest.raises(ValueError, match=r"answers: .* one answer per node \(5\), got 3"):
        tally([G, G, F], 5)


# -- what the attempt does next --------------------------------------------------------------------------------

def _step(answers: list[Answer], t: int = 5, rounds: int = 1, healed: bool = False, released: int = 0,
          timeout: float = 0.0) -> Step:
    return next_step(answers, tally(answers, len(answers)), t, len(answers), rounds=rounds, healed=healed,
                     released=released, timeout=timeout)


def test_a_granted_round_grants_its_t() -> None:
    assert _step([G, G, G, F, F], t=5) == Step(Next.GRANT, 5)


def test_too_few_answers_is_unavailable_saying_how_many_answered_within_the_timeout() -> None:
    step = _step([G, F, F, F, stale(2)], timeout=0.25)
    assert step == Step(Next.UNAVAILABLE, why="only 2 of 5 nodes answered within 0.250 s; 3 are needed")


def test_too_few_ready_nodes_is_unavailable_never_busy_unless_a_heal_brought_one_back() -> None:
    answers = [stale(4), stale(4), U, U, U]
    assert _step(answers) == Step(Next.UNAVAILABLE, why="only 2 of 5 nodes are ready; 3 are needed")
    assert _step(answers, t=5, healed=True) == Step(Next.PROPOSE, 6)


def test_a_held_lock_refuses_with_the_time_until_a_quorum_could_be_free() -> None:
    # Two nodes are free (or silent): one more key's expiry makes a quorum.
    assert _step([G, held(4, 3.0), held(4, 1.0), held(4, 2.0), F]) == Step(Next.REFUSE, retry_in=1.0)
    assert _step([held(4, 3.0), held(4, 1.0), held(4, 2.0), held(4, 5.0), G]) == Step(Next.REFUSE, retry_in=2.0)


def test_a_stale_t_proposes_again_above_what_the_answers_taught() -> None:
    assert _step([G, stale(8), stale(9), stale(9), G]) == Step(Next.PROPOSE, 10)


def test_keys_of_the_release_that_woke_the_waiter_do_not_count_as_held() -> None:
    answers = [G, G, held(7), held(7), held(7)]
    assert _step(answers).next is Next.REFUSE
    assert _step(answers, released=7) == Step(Next.PROPOSE, 8)


def test_the_last_round_refuses_instead_of_proposing_again() -> None:
    answers = [G, stale(8), stale(9), stale(9), G]
    assert _step(answers, rounds=MAX_ROUNDS - 1).next is Next.PROPOSE
    assert _step(answers, rounds=MAX_ROUNDS) == Step(Next.REFUSE, retry_in=None)


def test_the_next_proposal_starts_above_the_hwm_seen_and_above_the_t_just_proposed() -> None:
    assert learned(3, [stale(9), G], 5) == 9
    assert learned(3, [F, F], 5) == 5    # its give-backs may be on their way: never win with 5 again
    assert learned(12, [stale(9)], 5) == 12


def test_a_waiter_whose_home_node_failed_pauses_briefly() -> None:
    assert fallback_pause(10.0) == FALLBACK_PAUSE
    assert fallback_pause(0.01) == 0.01


# -- releases and extends --------------------------------------------------------------------------------------

def test_a_release_or_extend_is_settled_by_a_quorum_or_every_answer() -> None:
    assert settled([1, 1, 1], 5)
    assert not settled([1, 1, 0, NO_ANSWER], 5)
    assert settled([1, 0, 0, -1, NO_ANSWER], 5)


def test_an_extend_holds_on_a_quorum_and_is_unknown_while_silent_nodes_could_make_one() -> None:
    assert extend_outcome([1, 1, 1, 0, 0], 5) is True
    assert extend_outcome([1, 1, NO_ANSWER, 0, 0], 5) is None
    assert extend_outcome([1, 1, 0, 0, NO_ANSWER], 5) is None
    assert extend_outcome([1, 0, 0, -1, NO_ANSWER], 5) is False


# -- heal: the plan, a new deployment, marks -------------------------------------------------------------------

def _view(gate: Gate, nonce: str = "x") -> GateView:
    return GateView(gate, nonce)


def test_a_node_this_client_is_repairing_already_is_left_out_of_the_plan() -> None:
    R, P = Gate.READY, Gate.REPAIRABLE
    views = [_view(R), _view(R), _view(P), _view(P)]
    assert [r.node for r in plan_heal(views, 4).repairs] == [2, 3]
    assert [r.node for r in plan_heal(views, 4, busy={2}).repairs] == [3]
    assert not plan_heal(views, 4, busy={2, 3})


def test_a_new_deployment_claims_every_node_then_marks_them_all() -> None:
    assert NEW_DEPLOYMENT == ("claim", "fresh")
    assert deployment_step("claim", [True, True, True]) is None      # every claim held: go on and mark
    assert deployment_step("claim", [True, False, True]) is False    # another look's digest: stop
    assert deployment_step("fresh", [True, True, True]) is True
    assert deployment_step("fresh", [True, False, False]) is True    # a marked node counts
    assert deployment_step("fresh", [False, False, False]) is False
    with pytest.raises(ValueError, match=r"mode: .* got 'plain'"):
        deployment_step("plain", [True])


def test_a_mark_names_the_incarnation_looked_at_and_only_a_plain_one_takes_the_clock() -> None:
    assert mark_args(_view(Gate.FRESH, "n1"), "claim", "d") == ["n1", "claim", "d", 0]
    assert mark_args(_view(Gate.QUARANTINED, "n2"), "plain") == ["n2", "plain", "0", 1]
    assert mark_args(None, "fresh", "d") == ["", "fresh", "d", 0]
    assert marked(1)
    assert marked(0)
    assert not marked(-1)
    assert not marked(-2)


def test_a_look_is_given_at_least_the_gate_timeout() -> None:
    assert look_timeout(0.05) == GATE_TIMEOUT
    assert look_timeout(GATE_TIMEOUT * 3) == GATE_TIMEOUT * 3


# -- repair ----------------------------------------------------------------------------------------------------

def test_a_repair_raises_in_sorted_batches_and_marks_with_the_last() -> None:
    repair = Repair(2, "inc", (0, 1), clock=False)
    hwm = {f"k{i:03}": i for i in range(5)}
    calls = repair_marks(repair, 7, hwm, batch=2)
    assert [keys for keys, _ in calls] == [["k000", "k001"], ["k002", "k003"], ["k004"]]
    assert [args[:4] for _, args in calls] == [["inc", "raise", 7, 0], ["inc", "raise", 7, 0],
                                               ["inc", "repair", 7, 0]]
    assert calls[0][1][4:] == [0, 1]


def test_a_repair_with_nothing_to_raise_still_marks_and_a_clock_repair_says_so() -> None:
    assert repair_marks(Repair(0, "inc", (), clock=True), 3, {}) == [([], ["inc", "repair", 3, 1])]


def test_a_repair_stops_when_the_node_changed_or_another_client_marked_it() -> None:
    assert repair_progress(1) is None      # done: the next batch
    assert repair_progress(0) is True      # marked meanwhile
    assert repair_progress(-1) is False    # another data set
    assert repair_progress(-2) is False    # still quarantined


def test_only_a_floor_marker_carries_a_floor() -> None:
    assert marker_floor("floor:1700000000000000") == 1700000000000000
    assert marker_floor("1") == 0
    assert marker_floor("floor:x") == 0


# -- the error an attempt raises -------------------------------------------------------------------------------

def test_without_a_look_the_nodes_states_come_from_the_attempts_answers() -> None:
    states = attempt_states(["a", "b", "c"], [G, F, U], None, 0.0)
    assert [(s.reachable, s.ready, s.state) for s in states] == [(True, True, "ready"), (False, False, "unreachable"),
                                                                 (True, False, "not ready")]


def test_a_node_that_answered_the_look_but_not_the_attempt_is_unreachable() -> None:
    views = [_view(Gate.READY), _view(Gate.READY), GateView(Gate.QUARANTINED, "x", 4.0)]
    states = attempt_states(["a", "b", "c"], [G, F, U], views, 1000.0)
    assert [s.state for s in states] == ["ready", "unreachable", "quarantined"]
    text, _, found = unavailable("only 1 of 3 nodes are ready; 2 are needed", ["a", "b", "c"], [G, F, U], views,
                                 1000.0)
    assert text.startswith("only 1 of 3 nodes are ready; 2 are needed: a: ready; b: unreachable; c: quarantined, "
                           "repairable in 4.0 s")
    assert text.endswith(found.text)
    assert found.eta == 4.0


# -- whole attempts and heals on model nodes, on a fake clock --------------------------------------------------

@dataclass
class Cluster:
    """Model nodes and one client's `known`, strung together as the backend strings the functions."""

    nodes: list[NodeModel]
    now: float = 0.0
    known: int = 0
    sent: list[tuple[str, int]] = field(default_factory=list)   # (what, t) in the order the client sent it
    repairing: set[int] = field(default_factory=set)

    def attempt(self, token: str, ttl: float = 10.0, down: frozenset[int] = frozenset()) -> Step:
        n = len(self.nodes)
        t = next_proposal(self.known, ())
        for rounds in range(1, MAX_ROUNDS + 1):
            self.sent.append(("acquire", t))
            answers = [F if i in down else node.acquire("n", token, t, ttl, self.now)
                       for i, node in enumerate(self.nodes)]
            self.known = learned(self.known, answers, t)
            counted = tally(answers, n)
            for i in counted.give_back:
                self.sent.append((f"give back {i}", t))
                if i not in down:
                    self.nodes[i].release("n", token, t)
            healed = self.heal() if counted.heal is Heal.NOW else False
            step = next_step(answers, counted, t, n, rounds=rounds, healed=healed)
            if step.next is not Next.PROPOSE:
                return step
            t = step.t
        raise AssertionError("next_step proposes no round past MAX_ROUNDS")

    def heal(self) -> bool:
        n = len(self.nodes)
        views = [node.gate(self.now, 10.0, 2.0, f"nonce{i}-{self.now}") for i, node in enumerate(self.nodes)]
        plan = plan_heal(views, n, busy=self.repairing)
        if plan.fresh:
            deployment = deployment_id(views)
            for mode in NEW_DEPLOYMENT:
                done = [marked(node.mark(views[i].nonce, mode, 0, False, {}, self.now, 0, deployment))
                        for i, node in enumerate(self.nodes)]
                result = deployment_step(mode, done)
                if result is not None:
                    return result
        healed = False
        for repair in plan.repairs:
            reads = [(j, fences) for j in repair.sources if (fences := self.nodes[j].fences()) is not None]
            merged = repaired([(floor, hwm) for _, (floor, hwm) in reads], n, repair.clock)
            if merged is None:
                continue
            for keys, args in repair_marks(repair, *merged):
                nonce, how, floor, clock = args[:4]
                values = {key: int(str(value)) for key, value in zip(keys, args[4:], strict=True)}
                code = self.nodes[repair.node].mark(str(nonce), str(how), int(str(floor)), bool(clock),
                                                    values, self.now, FLOOR)
                progress = repair_progress(code)
                if progress is not None:
                    healed = healed or progress
                    break
            else:
                healed = True
        return healed


def test_an_attempt_with_a_stale_hint_proposes_again_and_is_granted_above_the_nodes_hwm() -> None:
    nodes = [NodeModel(hwm={"n": 2}), NodeModel(hwm={"n": 9}), NodeModel(hwm={"n": 9})]
    cluster = Cluster(nodes, known=2)
    assert cluster.attempt("A") == Step(Next.GRANT, 10)
    assert [what for what, _ in cluster.sent] == ["acquire", "give back 0", "acquire"]
    assert cluster.sent[0] == ("acquire", 3)


def test_an_attempt_against_a_held_lock_gives_back_its_one_grant_and_waits_for_the_holder() -> None:
    cluster = Cluster([NodeModel() for _ in range(3)])
    assert cluster.attempt("A").next is Next.GRANT
    cluster.now = 1.0
    cluster.nodes[0].release("n", "A", 1)  # A's release reached one node only
    step = cluster.attempt("B")
    assert step.next is Next.REFUSE
    assert step.retry_in == pytest.approx(9.0)
    assert ("give back 0", 2) in cluster.sent
    assert "n" not in cluster.nodes[0].locks   # B's minority grant was given back


def test_an_attempt_with_a_node_down_still_gives_back_where_it_may_have_landed() -> None:
    cluster = Cluster([NodeModel() for _ in range(3)])
    cluster.nodes[1].locks["n"] = ("Z", 50.0)
    cluster.nodes[1].hwm["n"] = 1
    step = cluster.attempt("A", down=frozenset({2}))
    assert cluster.sent[:3] == [("acquire", 1), ("give back 0", 1), ("give back 2", 1)]
    # One key held, one node silent: each round is worth another, until the rounds are used up.
    assert [what for what, _ in cluster.sent].count("acquire") == MAX_ROUNDS
    assert step == Step(Next.REFUSE, retry_in=None)


def test_a_new_deployment_is_marked_by_the_first_attempt_and_granted_in_its_next_round() -> None:
    cluster = Cluster([NodeModel(ready=False) for _ in range(3)])
    assert cluster.attempt("A") == Step(Next.GRANT, 2)  # the heal counts as another round: above t=1
    assert all(node.ready for node in cluster.nodes)
    assert [what for what, _ in cluster.sent] == ["acquire", "acquire"]


def test_a_node_that_lost_its_data_is_repaired_after_its_quarantine_from_the_ready_others() -> None:
    cluster = Cluster([NodeModel() for _ in range(3)])
    assert cluster.attempt("A") == Step(Next.GRANT, 1)
    cluster.nodes[0].release("n", "A", 1)
    cluster.nodes[1].release("n", "A", 1)
    cluster.nodes[2].release("n", "A", 1)
    cluster.nodes[2].lose_data()
    cluster.nodes[1].lose_data()
    cluster.now = 1.0
    step = cluster.attempt("B")  # the first look starts both quarantines: too few nodes count
    assert step == Step(Next.UNAVAILABLE, why="only 1 of 3 nodes are ready; 2 are needed")
    cluster.now = 12.0
    cluster.known = 0
    # Repaired from node 0 alone plus their clock: the next grant's fence is above the clock floor.
    assert cluster.attempt("C") == Step(Next.GRANT, FLOOR + 1)
    assert cluster.nodes[1].ready
    assert cluster.nodes[2].ready
    assert cluster.nodes[1].floor == cluster.nodes[2].floor == FLOOR


def test_a_node_being_repaired_by_this_client_is_not_repaired_twice() -> None:
    cluster = Cluster([NodeModel(), NodeModel(), NodeModel(ready=False)])
    cluster.nodes[2].gate(0.0, 10.0, 2.0, "old")
    cluster.now = 12.0
    cluster.repairing.add(2)
    assert cluster.heal() is False
    assert not cluster.nodes[2].ready
    cluster.repairing.clear()
    assert cluster.heal() is True
    assert cluster.nodes[2].ready
