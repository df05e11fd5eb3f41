"""The acquire loop's decisions (`_logic.acquiring`), driven by a fake clock with no server."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencelock import AcquireTimeout, BackendError, NotAcquired, QuorumUnavailable
from fencelock._logic.acquiring import Acquiring, Block, GiveBack, Grant, Raise, RetryAfter, Sleep, Step, Try
from fencelock._logic.outcomes import Attempt
from fencelock._logic.timing import MAX_BLOCK_SHARE, backoff, validity_end

NAME = "job"
GRANTED = Attempt(True, 7, None)
REFUSED = Attempt(False, 0, None)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def no_retry(exc: BackendError, failures: int) -> float | None:
    return None


def quorum_backoff(exc: BackendError, failures: int) -> float | None:
    """Redlock's policy: only a missing quorum is worth another try."""
    return backoff(failures - 1, random.Random(1), base=0.01, cap=0.25) if isinstance(exc, QuorumUnavailable) else None


def plan(clock: FakeClock, *, ttl: float = 10.0, wait: float | None = 5.0, fair: bool = False,
         always_queues: bool = False, cap: float = 1.0, retry_after: RetryAfter = no_retry,
         behind: bool = False) -> Acquiring:
    return Acquiring(NAME, ttl, wait, fair=fair, always_queues=always_queues, block_cap=cap,
                     retry_after=retry_after, behind=lambda: behind, clock=clock)


# -- grants -------------------------------------------------------------------------------------------------------


def test_a_first_attempt_is_a_short_request_and_a_grant_counts_validity_from_before_it_was_sent() -> None:
    clock = FakeClock()
    p = plan(clock)
    assert p.start() == Try(0.0, None)
    sent_at = clock.now
    clock.now += 0.3  # the reply took this long
    assert p.answered(GRANTED) == Grant(7, validity_end(10.0, sent_at))


def test_a_grant_after_a_wait_counts_from_the_attempt_that_won_not_from_the_start() -> None:
    clock = FakeClock()
    p = plan(clock)
    p.start()
    clock.now += 0.5
    step = p.answered(REFUSED)
    assert isinstance(step, Try)
    sent_at = clock.now
    clock.now += 0.8  # blocked on the server, then woken and granted
    assert p.answered(GRANTED) == Grant(7, validity_end(10.0, sent_at))


def test_a_grant_that_arrives_with_no_validity_left_is_given_back_and_tried_again_at_once() -> None:
    """Nobody held the lock: a late grant is never "busy". Even with wait=0 the first is tried again."""
    clock = FakeClock()
    p = plan(clock, ttl=1.0, wait=0)
    p.start()
    clock.now += 1.0  # a slow network ate the whole TTL
    assert p.answered(GRANTED) == GiveBack()
    assert p.given_back() == Try(0.0, None)
    sent_at = clock.now
    clock.now += 0.1
    assert p.answered(GRANTED) == Grant(7, validity_end(1.0, sent_at))


@pytest.mark.parametrize("wait", [0, None])
def test_a_second_late_grant_in_a_row_raises_backend_error_saying_it_was_too_slow(wait: float | None) -> None:
    clock = FakeClock()
    p = plan(clock, ttl=1.0, wait=wait)
    p.start()
    for _ in range(2):
        clock.now += 1.25
        assert p.answered(GRANTED) == GiveBack()
        step = p.given_back()
    assert isinstance(step, Raise)
    assert type(step.error) is BackendError
    assert not isinstance(step.error, NotAcquired)
    assert step.event == "failed"
    assert not step.forget
    assert step.error.name == NAME
    assert "granted too late" in str(step.error)
    assert "1.250 s" in str(step.error)


def test_late_grants_are_tried_again_while_a_finite_wait_lasts_and_a_refusal_resets_the_count() -> None:
    clock = FakeClock()
    p = plan(clock, ttl=1.0, wait=5.0)
    p.start()
    for _ in range(3):  # within the wait
        clock.now += 1.0
        assert p.answered(GRANTED) == GiveBack()
        assert p.given_back() == Try(0.0, None)
    clock.now += 1.0
    assert isinstance(p.answered(REFUSED), Try)  # a real refusal: the lock is busy now
    clock.now += 1.5  # past the wait's deadline
    assert p.answered(GRANTED) == GiveBack()
    assert p.given_back() == Try(0.0, None)  # the first late grant since the refusal: tried once more
    clock.now += 1.0
    assert p.answered(GRANTED) == GiveBack()
    step = p.given_back()
    assert isinstance(step, Raise)
    assert type(step.error) is BackendError


def test_a_queued_waiter_whose_late_grants_end_the_acquire_leaves_the_queue() -> None:
    clock = FakeClock()
    p = plan(clock, ttl=1.0, wait=0, fair=True)
    p.start()
    for _ in range(2):
        clock.now += 1.0
        p.answered(GRANTED)
        step = p.given_back()
    assert isinstance(step, Raise)
    assert step.leave


# -- refusals and the one deadline ---------------------------------------------------------------------------------


def test_wait_zero_makes_one_attempt_and_raises_not_acquired_naming_the_lock() -> None:
    clock = FakeClock()
    p = plan(clock, wait=0)
    p.start()
    step = p.answered(REFUSED)
    assert isinstance(step, Raise)
    assert step.event == "busy"
    assert type(step.error) is NotAcquired
    assert step.error.name == NAME
    assert not step.forget


def test_a_finite_wait_raises_acquire_timeout_once_its_one_deadline_passes_whatever_happened_meanwhile() -> None:
    clock = FakeClock()
    p = plan(clock, wait=2.0, cap=0.5)
    p.start()
    steps: list[Step] = []
    while True:
        clock.now += 0.3
        step = p.answered(REFUSED)
        steps.append(step)
        if isinstance(step, Raise):
            break
    assert type(step.error) is AcquireTimeout
    assert step.event == "timeout"
    assert step.error.name == NAME
    assert clock.now - p.started >= 2.0
    assert clock.now - p.started < 2.0 + 0.3 + 1e-9  # the first refusal after the deadline, not one later
    # the "wait" event is told once, on the first refusal
    tries = [s for s in steps[:-1] if isinstance(s, Try)]
    assert len(tries) == len(steps) - 1
    assert [s.waited for s in tries] == [pytest.approx(0.3)] + [None] * (len(tries) - 1)


def test_a_waiter_blocks_no_longer_than_the_deadline_the_holders_ttl_the_cap_or_a_share_of_its_ttl() -> None:
    clock = FakeClock()
    p = plan(clock, ttl=10.0, wait=5.0, cap=3.0)
    p.start()
    assert p.answered(Attempt(False, 0, 0.7)) == Try(0.7, 0.0)       # the holder's key expires first
    assert p.answered(REFUSED) == Try(10.0 * MAX_BLOCK_SHARE)         # a share of its own TTL
    clock.now += 4.5
    step = p.answered(REFUSED)
    assert isinstance(step, Try)
    assert step.block == pytest.approx(0.5)                           # what is left of the wait
    p2 = plan(FakeClock(), ttl=100.0, wait=None, cap=3.0)
    p2.start()
    assert p2.answered(REFUSED) == Try(3.0, 0.0)                      # the cap, when waiting for ever


def test_wait_none_never_times_out() -> None:
    clock = FakeClock()
    p = plan(clock, wait=None)
    p.start()
    for _ in range(100):
        clock.now += 1e6
        assert isinstance(p.answered(REFUSED), Try)


@pytest.mark.parametrize(("fair", "always_queues"), [(True, False), (False, True)])
def test_a_queued_waiter_that_times_out_leaves_its_queue(fair: bool, always_queues: bool) -> None:
    p = plan(FakeClock(), wait=0, fair=fair, always_queues=always_queues)
    p.start()
    step = p.answered(REFUSED)
    assert isinstance(step, Raise)
    assert step.leave
    assert p.queued


def test_a_waiter_that_does_not_queue_leaves_nothing() -> None:
    p = plan(FakeClock(), wait=0)
    p.start()
    step = p.answered(REFUSED)
    assert isinstance(step, Raise)
    assert not step.leave
    assert not p.queued


# -- the waiting room ----------------------------------------------------------------------------------------------


def test_a_waiter_behind_another_of_this_client_waits_for_its_turn_then_makes_a_short_request() -> None:
    clock = FakeClock()
    p = plan(clock, wait=5.0, cap=1.0, behind=True)
    p.start()
    clock.now += 1.0
    step = p.answered(REFUSED)
    assert isinstance(step, Block)
    assert step.timeout == pytest.approx(4.0)  # non-fair: the whole wait that is left
    assert step.waited == pytest.approx(1.0)
    assert not step.forget_if_interrupted
    assert p.turned() == Try(0.0)


def test_a_fair_waiter_behind_another_looks_again_every_blocking_period_and_forgets_its_entry_if_interrupted() -> None:
    clock = FakeClock()
    p = plan(clock, wait=5.0, cap=1.0, fair=True, behind=True)
    p.start()
    step = p.answered(REFUSED)
    assert step == Block(1.0, True, 0.0)  # its queue entry must be renewed, and must not outlive the waiter


def test_a_waiter_behind_another_with_no_deadline_waits_for_its_turn_without_a_limit() -> None:
    p = plan(FakeClock(), wait=None, behind=True, always_queues=False)
    p.start()
    assert p.answered(REFUSED) == Block(None, False, 0.0)


# -- errors ----------------------------------------------------------------------------------------------------------


def test_an_error_the_backend_does_not_retry_is_raised_at_once_and_the_attempt_forgotten() -> None:
    p = plan(FakeClock())
    p.start()
    exc = BackendError("connection refused", name=NAME)
    assert p.failed(exc) == Raise(exc, "failed", leave=False, forget=True)


def test_the_first_failure_is_retried_even_with_wait_zero_but_not_a_second() -> None:
    clock = FakeClock()
    p = plan(clock, wait=0, retry_after=lambda exc, n: 0.0)
    p.start()
    exc = BackendError("reset", name=NAME)
    assert p.failed(exc) == Sleep(0.0)
    assert p.slept() == Try(0.0)
    assert isinstance(p.failed(exc), Raise)


def test_with_no_deadline_only_the_first_failure_is_retried_a_server_that_is_down_is_an_error() -> None:
    clock = FakeClock()
    p = plan(clock, wait=None, retry_after=lambda exc, n: 0.01)
    p.start()
    exc = BackendError("reset", name=NAME)
    assert p.failed(exc) == Sleep(0.01)
    p.slept()
    assert p.failed(exc) == Raise(exc, "failed", forget=True)


def test_retries_stay_within_one_deadline_and_the_error_is_the_servers_not_a_timeout() -> None:
    clock = FakeClock()
    p = plan(clock, wait=1.0, retry_after=quorum_backoff)
    p.start()
    exc = QuorumUnavailable("reached 1 of 3 nodes; 2 are needed", name=NAME)
    sleeps = []
    while True:
        step = p.failed(exc)
        if isinstance(step, Raise):
            break
        assert isinstance(step, Sleep)
        sleeps.append(step.seconds)
        clock.now += step.seconds + 0.05  # the sleep, and the next request's round trip
        assert p.slept() == Try(0.0)
    assert len(sleeps) > 1
    assert all(0.0 <= s <= 0.25 for s in sleeps)  # jittered, capped back-off
    assert clock.now - p.started < 1.0 + 0.25 + 0.05  # never a sleep that ends past the deadline
    assert step.error is exc
    assert step.event == "failed"
    assert step.forget


def test_only_the_errors_the_backends_policy_names_are_retried() -> None:
    p = plan(FakeClock(), retry_after=quorum_backoff)
    p.start()
    assert isinstance(p.failed(QuorumUnavailable("no quorum", name=NAME)), Sleep)
    p.slept()
    other = BackendError("NOPERM", name=NAME)
    assert p.failed(other) == Raise(other, "failed", forget=True)


def test_an_answer_resets_the_failure_count() -> None:
    clock = FakeClock()
    seen: list[int] = []

    def policy(exc: BackendError, failures: int) -> float | None:
        seen.append(failures)
        return 0.0 if failures == 1 else None

    p = plan(clock, wait=None, retry_after=policy)
    p.start()
    exc = BackendError("reset", name=NAME)
    assert isinstance(p.failed(exc), Sleep)
    p.slept()
    p.answered(REFUSED)
    assert isinstance(p.failed(exc), Sleep)  # a first failure again
    assert seen == [1, 1]


# -- properties ----------------------------------------------------------------------------------------------------

EVENTS = st.lists(st.tuples(st.sampled_from(["refused", "failed", "holder"]), st.floats(0.0, 2.0)), max_size=40)


@given(wait=st.one_of(st.none(), st.floats(0.0, 10.0)), events=EVENTS, fair=st.booleans(), behind=st.booleans())
def test_no_decision_reaches_past_the_deadline(wait: float | None, events: list[tuple[str, float]], fair: bool,
                                               behind: bool) -> None:
    clock = FakeClock()
    p = plan(clock, ttl=8.0, wait=wait, cap=1.5, fair=fair, behind=behind,
             retry_after=lambda exc, n: 0.1 * n)
    deadline = math.inf if wait is None else p.started + wait
    step: Step = p.start()
    failures_in_a_row = 0
    for kind, elapsed in events:
        clock.now += elapsed
        if kind == "failed":
            failures_in_a_row += 1
            step = p.failed(BackendError("reset", name=NAME))
            if isinstance(step, Sleep) and failures_in_a_row > 1:
                assert clock.now + step.seconds < deadline
        else:
            failures_in_a_row = 0
            step = p.answered(Attempt(False, 0, elapsed if kind == "holder" else None))
            if isinstance(step, Try):
                assert clock.now + step.block <= deadline
                assert step.block <= min(1.5, 8.0 * MAX_BLOCK_SHARE)
            elif isinstance(step, Block):
                assert behind
                assert step.timeout is None or clock.now + step.timeout <= deadline
            else:
                assert isinstance(step, Raise)
                assert clock.now >= deadline
                assert type(step.error) is (NotAcquired if wait == 0 else AcquireTimeout)
        if isinstance(step, Raise):
            return
        if isinstance(step, Sleep):
            step = p.slept()
        elif isinstance(step, Block):
            step = p.turned()


# -- the lease's own sending (decision 2026-12-05-etcd-burst) ------------------------------------------------------


def test_a_grant_counts_validity_from_the_leases_own_sending_when_the_request_first_waited_in_the_client() -> None:
    """etcd: the grant waited its turn in the client's queue; the server's TTL began no earlier than its sending."""
    clock = FakeClock()
    p = plan(clock, ttl=5.0)
    p.start()
    started = clock.now
    clock.now += 6.0  # queued in the client longer than the TTL
    grant_sent = clock.now
    clock.now += 0.1
    assert p.answered(Attempt(True, 7, None, valid_from=grant_sent)) == Grant(7, validity_end(5.0, grant_sent))
    assert validity_end(5.0, grant_sent) > validity_end(5.0, started)


def test_a_grant_whose_lease_ttl_began_before_the_attempt_counts_from_then() -> None:
    clock = FakeClock()
    p = plan(clock, ttl=5.0)
    refreshed = clock.now - 2.0  # (a backend whose last refresh was before this attempt)
    p.start()
    clock.now += 0.1
    assert p.answered(Attempt(True, 7, None, valid_from=refreshed)) == Grant(7, validity_end(5.0, refreshed))


def test_a_grant_whose_sending_is_in_the_future_counts_from_the_attempts_start() -> None:
    clock = FakeClock()
    p = plan(clock, ttl=5.0)
    p.start()
    started = clock.now
    clock.now += 0.1
    assert p.answered(Attempt(True, 7, None, valid_from=clock.now + 1.0)) == Grant(7, validity_end(5.0, started))


def test_a_grant_is_late_only_if_the_ttl_ran_out_after_the_leases_own_sending() -> None:
    clock = FakeClock()
    p = plan(clock, ttl=1.0, wait=0)
    p.start()
    clock.now += 3.0  # queued in the client
    grant_sent = clock.now
    clock.now += 1.25  # and then the server was slow
    assert p.answered(Attempt(True, 7, None, valid_from=grant_sent)) == GiveBack()
    step = p.given_back()
    assert step == Try(0.0, None)
    clock.now += 1.25
    assert p.answered(Attempt(True, 7, None, valid_from=clock.now - 1.25)) == GiveBack()
    step = p.given_back()
    assert isinstance(step, Raise)
    assert "took 1.250 s" in str(step.error)  # the grant's own round trip, not the wait in the client


@given(st.floats(0.0, 100.0), st.floats(0.0, 100.0), st.floats(0.5, 60.0))
def test_validity_never_counts_from_later_than_the_leases_sending(queued: float, answer: float, ttl: float) -> None:
    clock = FakeClock()
    p = plan(clock, ttl=ttl, wait=None)
    p.start()
    clock.now += queued
    grant_sent = clock.now
    clock.now += answer
    step = p.answered(Attempt(True, 7, None, valid_from=grant_sent))
    if isinstance(step, Grant):
        assert step.valid_until <= grant_sent + ttl
        assert step.valid_until > clock.now
    else:
        assert step == GiveBack()
        assert grant_sent + ttl - clock.now < 0.05 * ttl + 0.01  # no validity worth a grant was left
