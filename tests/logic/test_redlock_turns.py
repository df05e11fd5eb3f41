"""A burst of rounds through one Redlock client (issue 14), decided without I/O: which rounds may start (`Admission`), a
wait for replies that the client overslept (`overslept`), and a lease's validity counted from the start of the round
that was granted, not from the time it waited before it (`Attempt.valid_from`), on a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencelock._logic.acquiring import Acquiring, GiveBack, Grant, Try
from fencelock._logic.admission import Admission, Urgency
from fencelock._logic.outcomes import Attempt
from fencelock._logic.timing import OVERSLEPT_SHARE, overslept, validity_end
from fencelock._redis.redlock_turns import ROUNDS_AT_ONCE, TURN_LIMIT, turn_error


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _plan(clock: FakeClock, ttl: float = 10.0) -> Acquiring:
    return Acquiring("job", ttl, 5.0, fair=False, always_queues=False, block_cap=1.0,
                     retry_after=lambda exc, failures: None, behind=lambda: False, clock=clock)


# -- turns: Redlock's rounds in `Admission` ------------------------------------------------------------------------


def test_rounds_start_at_once_up_to_the_limit_and_the_others_wait_in_arrival_order() -> None:
    turns: Admission[str] = Admission(2)
    assert turns.enter("a", Urgency.NEW)
    assert turns.enter("b", Urgency.NEW)
    assert not turns.enter("c", Urgency.NEW)
    assert not turns.enter("d", Urgency.NEW)
    assert turns.waiting == 2
    assert turns.done() == "c"  # a's turn goes to c: still two running
    assert turns.out == 2
    assert turns.done() == "d"
    assert turns.done() is None
    assert turns.done() is None
    assert turns.out == 0
    assert turns.enter("e", Urgency.NEW)


def test_a_held_leases_round_goes_before_every_acquire_waiting() -> None:
    """An extend, an attempt's next round and a release are handed the next turn, before acquires that asked
    earlier: a burst of acquires never starves the leases already held, nor an acquire under way."""
    turns: Admission[str] = Admission(1)
    assert turns.enter("running", Urgency.NEW)
    assert not turns.enter("acquire-1", Urgency.NEW)
    assert not turns.enter("release", Urgency.RELEASE)
    assert not turns.enter("acquire-2", Urgency.NEW)
    assert not turns.enter("next round", Urgency.ONGOING)
    assert not turns.enter("extend", Urgency.RENEWAL)
    assert [turns.done() for _ in range(6)] == ["extend", "next round", "release", "acquire-1", "acquire-2", None]


def test_a_new_round_never_overtakes_those_waiting() -> None:
    """While rounds wait, a new one waits behind them even if a turn is free at that instant (it goes to them)."""
    turns: Admission[str] = Admission(1)
    turns.enter("a", Urgency.NEW)
    turns.enter("b", Urgency.NEW)
    assert turns.done() == "b"
    assert not turns.enter("c", Urgency.NEW)


def test_a_round_that_stops_waiting_leaves_the_queue_and_one_handed_a_turn_must_pass_it_on() -> None:
    turns: Admission[str] = Admission(1)
    turns.enter("a", Urgency.NEW)
    turns.enter("b", Urgency.NEW)
    turns.enter("c", Urgency.NEW)
    assert turns.withdraw("b")  # (cancelled, or its turn did not come within TURN_LIMIT)
    assert turns.done() == "c"
    assert not turns.withdraw("c")  # it was handed a turn: it runs, or hands it on with `done`
    assert turns.done() is None
    assert turns.out == 0


@given(st.lists(st.tuples(st.sampled_from(["ask", "urgent", "done", "withdraw"]), st.integers(0, 20)),
                max_size=200), st.integers(1, 5))
def test_never_more_rounds_run_than_the_limit_and_no_turn_is_lost(ops: list[tuple[str, int]], limit: int) -> None:
    """Whatever the order of asks, ends and withdrawals: at most `limit` rounds run, a round waits only while
    `limit` run, and every turn ends up with someone or back in the count."""
    turns: Admission[int] = Admission(limit)
    running: set[int] = set()
    waiting: set[int] = set()
    for op, k in ops:
        if op in ("ask", "urgent") and k not in running and k not in waiting:
            urgency = Urgency.RELEASE if op == "urgent" else Urgency.NEW
            (running if turns.enter(k, urgency) else waiting).add(k)
        elif op == "done" and running:
            running.pop()
            handed = turns.done()
            if handed is not None:
                waiting.remove(handed)
                running.add(handed)
        elif op == "withdraw" and k in waiting:
            assert turns.withdraw(k)
            waiting.remove(k)
        assert turns.out == len(running) <= limit
        assert turns.waiting == len(waiting)
        assert not waiting or len(running) == limit


def test_at_most_half_a_nodes_connections_carry_rounds_and_an_overloaded_client_says_so() -> None:
    from fencelock._async._transport import MAX_OPEN

    assert ROUNDS_AT_ONCE * 2 <= MAX_OPEN
    with pytest.raises(ValueError, match="at least 1"):
        Admission(0)
    text = turn_error("acquire", TURN_LIMIT, 4321)
    assert "overloaded" in text
    assert "4321 more were waiting" in text
    assert "nothing was sent" in text
    assert f"{ROUNDS_AT_ONCE} rounds run at once" in text


# -- overslept ----------------------------------------------------------------------------------------------------


def test_a_wait_woken_on_time_gets_no_more() -> None:
    assert overslept(10.0, 10.0, 0.35) == 0.0
    assert overslept(10.0, 10.0 + 0.35 * OVERSLEPT_SHARE * 0.99, 0.35) == 0.0
    assert overslept(10.0, 10.009, 0.05) == 0.0  # (10 ms of scheduling is never oversleeping)


def test_a_wait_the_client_overslept_gets_as_long_again_at_most_its_timeout() -> None:
    assert overslept(10.0, 10.2, 0.35) == pytest.approx(0.2)
    assert overslept(10.0, 12.0, 0.35) == 0.35  # a stall of 2 s: one more node timeout, never 2 s more


@given(st.floats(0.0, 100.0), st.floats(0.0, 10.0), st.floats(0.001, 5.0))
def test_oversleeping_never_more_than_doubles_a_wait(deadline: float, late: float, timeout: float) -> None:
    grace = overslept(deadline, deadline + late, timeout)
    assert 0.0 <= grace <= min(late, timeout) + 1e-9


# -- a lease's validity: from the start of the round that was granted ----------------------------------------------


def test_time_held_back_before_the_granted_round_does_not_count_against_the_lease() -> None:
    """The acquire waited 3 s for its round's turn (or a wake-up, or earlier rounds), then the round took 0.2 s: the
    lease is valid for its TTL from the round's start, not from the attempt's."""
    clock = FakeClock()
    p = _plan(clock)
    assert p.start() == Try(0.0, None)
    began = clock.now
    clock.now += 3.2
    assert p.answered(Attempt(True, 7, None, valid_from=began + 3.0)) == Grant(7, validity_end(10.0, began + 3.0))


def test_a_round_granted_after_waiting_longer_than_the_ttl_is_still_a_grant() -> None:
    """Before issue 14 a grant whose acquire had queued longer than its TTL counted as too late and was given back."""
    clock = FakeClock()
    p = _plan(clock, ttl=2.0)
    p.start()
    began = clock.now
    clock.now += 5.05
    step = p.answered(Attempt(True, 7, None, valid_from=began + 5.0))
    assert isinstance(step, Grant)
    assert step.valid_until == validity_end(2.0, clock.now - 0.05)
    clock2 = FakeClock()
    q = _plan(clock2, ttl=2.0)
    q.start()
    clock2.now += 5.05
    assert q.answered(Attempt(True, 7, None)) == GiveBack()  # (the same grant, if it had counted from the start)


@given(st.floats(0.0, 50.0), st.floats(-5.0, 60.0))
def test_validity_never_counts_from_after_now(took: float, sent_after: float) -> None:
    """Whatever a backend reports, the validity never counts from later than now (a start in the future is no
    sending at all: the attempt's start is used); a start before the attempt's (a TTL started earlier) is kept."""
    clock = FakeClock()
    p = _plan(clock, ttl=100.0)
    p.start()
    began = clock.now
    clock.now += took
    step = p.answered(Attempt(True, 7, None, valid_from=began + sent_after))
    assert isinstance(step, Grant)
    start = began if began + sent_after > clock.now else began + sent_after
    assert step.valid_until == validity_end(100.0, start)
    assert step.valid_until <= validity_end(100.0, clock.now)
