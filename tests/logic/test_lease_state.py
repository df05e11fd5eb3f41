"""A lease's life (`_logic.lease.LeaseState`) shared by the lease and the watchdog, driven by a fake clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencelock._logic.lease import LeaseState, Renewal, Tick
from fencelock._logic.outcomes import Released, State
from fencelock._logic.timing import renewal_retry, validity_end

TTL = 3.0
EVERY = 1.0
T0 = 1000.0  # when the grant's request was sent


def renewed_lease(ttl: float = TTL, every: float | None = EVERY) -> LeaseState[str]:
    return LeaseState(ttl, validity_end(ttl, T0), every)


def test_a_renewed_lease_is_first_due_one_interval_after_its_grant_was_asked_for() -> None:
    life = renewed_lease()
    assert life.due == pytest.approx(T0 + EVERY - (TTL - (validity_end(TTL, T0) - T0)))
    assert life.due < life.valid_until
    assert LeaseState(TTL, validity_end(TTL, T0), None).due == validity_end(TTL, T0)  # watched for its end only


def test_a_due_lease_is_renewed_once_and_looked_at_again_when_its_validity_ends() -> None:
    life = renewed_lease()
    assert life.tick(T0 + EVERY) is Tick.RENEW
    assert life.due == life.valid_until
    life.sending("flight-1", TTL, T0 + EVERY)
    assert life.renewal == "flight-1"
    assert life.tick(T0 + EVERY + 0.1) is Tick.WATCH  # one renewal in flight at a time


def test_a_renewal_answered_late_counts_its_validity_from_the_requests_start() -> None:
    life = renewed_lease()
    life.tick(T0 + EVERY)
    sent_at = T0 + EVERY
    life.sending("flight", TTL, sent_at)
    answered_at = sent_at + 1.5  # a slow network
    assert life.renewed(True, TTL, sent_at, answered_at) is Renewal.EXTENDED
    assert life.valid_until == validity_end(TTL, sent_at)  # not from `answered_at`
    assert life.due == sent_at + EVERY
    assert life.renewal is None


def test_a_renewal_without_an_answer_is_retried_soon_and_never_after_the_validity_ends() -> None:
    life = renewed_lease()
    life.tick(T0 + EVERY)
    before = life.valid_until
    now = T0 + EVERY + 0.2
    assert life.renewed(None, TTL, T0 + EVERY, now) is Renewal.RETRY
    assert life.valid_until == before  # an unanswered renewal extends nothing
    assert life.due == renewal_retry(now, before, EVERY)
    assert now < life.due <= before
    assert life.renewed(None, TTL, before - 0.01, before - 0.001) is Renewal.RETRY
    assert life.due == before


def test_validity_that_runs_out_unrenewed_is_a_loss_by_the_local_clock() -> None:
    life = renewed_lease()
    end = life.valid_until
    assert not life.is_lost(end - 1e-6)
    assert life.remaining(end - 0.5) == pytest.approx(0.5)
    assert life.is_lost(end)
    assert life.remaining(end + 1.0) == 0.0
    assert life.tick(end) is Tick.EXPIRE


def test_the_server_saying_the_key_is_gone_loses_the_lease() -> None:
    life = renewed_lease()
    life.tick(T0 + EVERY)
    assert life.renewed(False, TTL, T0 + EVERY, T0 + EVERY + 0.01) is Renewal.GONE


def test_loss_is_final_and_a_late_renewal_that_got_through_is_given_back() -> None:
    life = renewed_lease()
    life.tick(T0 + EVERY)
    life.sending("flight", TTL, T0 + EVERY)
    assert life.lose("its validity ran out before a renewal was confirmed")
    assert not life.lose("again")  # reported once
    assert life.lost_reason == "its validity ran out before a renewal was confirmed"
    assert life.renewed(True, TTL, T0 + EVERY, T0 + TTL) is Renewal.GIVE_BACK
    assert life.state is State.LOST
    assert life.is_lost(T0)  # whatever the clock says
    assert life.remaining(T0) == 0.0
    assert life.tick(T0 + 10 * TTL) is Tick.DROP


def test_a_release_stops_renewal_at_once_and_a_released_lease_ignores_late_answers() -> None:
    life = renewed_lease()
    assert life.remaining(T0) > 0.0
    life.release_asked()
    assert life.remaining(T0) == 0.0  # from the ask: the server may free the lock as soon as the release lands
    assert life.tick(T0 + EVERY) is Tick.WATCH
    assert life.early(0.1) == 0.0
    assert life.release_answered(Released.RELEASED, T0 + EVERY)
    assert life.state is State.RELEASED
    assert not life.is_lost(T0 + 100.0)
    assert life.remaining(T0) == 0.0
    assert life.renewed(True, TTL, T0, T0 + 0.1) is Renewal.IGNORE
    assert life.tick(T0 + 2.0) is Tick.DROP
    assert not life.lose("late")


@pytest.mark.parametrize(("sent", "answer", "released"), [
    (T0 + 1.0, Released.EXPIRED, True),    # our unanswered release, sent in time, may have deleted it
    (T0 + 5.0, Released.EXPIRED, False),   # sent after the validity ended: it expired on its own
    (T0 + 1.0, Released.TAKEN, True),      # another holds it: a waiter, after our release deleted our key
    (T0 + 5.0, Released.TAKEN, False),     # sent after the validity ended: it may have expired and been taken
])
def test_an_unanswered_release_then_an_answer(sent: float, answer: Released, released: bool) -> None:
    life = renewed_lease()
    life.release_unknown(sent)
    life.release_unknown(sent + 10.0)  # the first unanswered release is the one that counts
    assert life.uncertain_at == sent
    assert life.remaining(sent) == 0.0  # in doubt: it claims nothing until an answer settles it
    assert not life.is_lost(T0 + 0.5)  # (nor is it known lost)
    assert life.release_answered(answer, sent + 10.0) is released
    assert life.state is (State.RELEASED if released else State.HELD)  # (the lease then reports the loss)


@pytest.mark.parametrize(("sent", "released"), [
    (T0 + 1.0, True),    # sent again after its connection closed under it, in time: our first sending deleted it
    (T0 + 5.0, False),   # sent after the validity ended: it may have expired on its own
])
def test_a_release_sent_twice_that_finds_the_key_gone(sent: float, released: bool) -> None:
    life = renewed_lease()
    assert life.release_answered(Released.UNSURE, sent) is released
    assert life.uncertain_at == sent
    assert life.state is (State.RELEASED if released else State.HELD)


def test_an_extend_without_an_answer_may_shorten_but_never_lengthen_the_validity() -> None:
    life = renewed_lease()
    before = life.valid_until
    life.extend_unknown(10.0, T0 + 0.5)
    assert life.valid_until == before
    life.extend_unknown(0.5, T0 + 0.5)
    assert life.valid_until == validity_end(0.5, T0 + 0.5)
    assert life.extended(10.0, T0 + 0.6, T0 + 0.7)
    # The unanswered extend to 0.5 s may still land after this one: 0.5 s is all this one may count (before, it
    # counted 10 s while the server could keep 0.5).
    assert life.valid_until == validity_end(0.5, T0 + 0.6)


def test_a_renewal_and_an_extend_of_one_lease_are_never_in_flight_at_once() -> None:
    life = renewed_lease()
    assert life.tick(T0 + EVERY) is Tick.RENEW
    life.sending("renewal", TTL, T0 + EVERY)
    assert life.take("extend") == "renewal"  # the extend waits for the renewal's answer
    assert life.renewed(True, TTL, T0 + EVERY, T0 + EVERY + 0.5) is Renewal.EXTENDED
    assert life.take("extend") is None  # now it goes
    assert life.take("another extend") == "extend"
    assert life.tick(life.due) is Tick.WATCH  # the watchdog does not renew it meanwhile
    assert life.extended(60.0, T0 + EVERY + 0.6, T0 + EVERY + 0.7)
    life.done("extend")
    assert life.renewal is None
    assert life.valid_until == validity_end(60.0, T0 + EVERY + 0.6)
    assert life.due == T0 + EVERY + 0.6 + EVERY  # renewed again one interval after the extend
    life.done("not the one in flight")  # (only the request in flight frees the turn)
    assert life.take("next") is None


def test_a_renewal_without_an_answer_bounds_every_later_count_by_its_ttl() -> None:
    """The reported race: a renewal with the lease's 3 s TTL got no answer; an extend to 60 s sent after it
    lands first, then the renewal lands and sets the key back to 3 s. The extend counts 3 s, and so does every
    later renewal (each carries 60 s now)."""
    life = renewed_lease()
    life.tick(T0 + EVERY)
    life.sending("renewal", TTL, T0 + EVERY)
    assert life.renewed(None, TTL, T0 + EVERY, T0 + EVERY + 2.0) is Renewal.RETRY
    assert life.unsettled == TTL
    assert life.extended(60.0, T0 + EVERY + 2.1, T0 + EVERY + 2.2)
    assert life.valid_until == validity_end(TTL, T0 + EVERY + 2.1)
    assert life.renewed(True, 60.0, T0 + 4.0, T0 + 4.1) is Renewal.EXTENDED
    assert life.valid_until == validity_end(TTL, T0 + 4.0)


def test_an_extend_without_an_answer_makes_a_renewed_lease_due_soon_and_any_other_at_its_end() -> None:
    life = renewed_lease()
    life.extend_unknown(60.0, T0 + 0.5, T0 + 2.5)
    assert life.due == renewal_retry(T0 + 2.5, life.valid_until, EVERY)
    watched = renewed_lease(every=None)
    watched.extend_unknown(0.5, T0 + 0.5, T0 + 0.6)
    assert watched.due == watched.valid_until == validity_end(0.5, T0 + 0.5)


# A model of the server: each request that sets the key's expiry lands at some moment after it was sent (while it is
# in flight, before its answer; an unanswered one at any later step, or never) and sets expiry = landing + TTL.
ORDER_STEPS = st.lists(st.tuples(st.sampled_from(["send", "early", "answer", "silence", "land", "gone"]),
                                 st.floats(0.0, 1.0), st.sampled_from([0.5, 3.0, 60.0]), st.integers(0, 3)),
                       max_size=40)


@settings(max_examples=1000)
@given(steps=ORDER_STEPS)
def test_remaining_never_exceeds_what_the_server_keeps_whatever_order_requests_land_in(
        steps: list[tuple[str, float, float, int]]) -> None:
    life = renewed_lease()
    now = T0
    expiry = T0 + TTL  # the grant landed as it was sent
    flight: tuple[float, float, bool] | None = None  # (sent at, ttl, an extend?)
    landed = False  # the request in flight already landed (its answer is still to come)
    pending: list[tuple[float, float]] = []  # unanswered, may land later: (sent at, ttl)
    for step, elapsed, ttl, pick in steps:
        now += elapsed
        if step == "send" and flight is None:
            if pick % 2 == 0 and life.take("flight") is None:
                life.extending(ttl, now)
                flight, landed = (now, ttl, True), False
            elif pick % 2 == 1 and life.renewal is None:
                life.sending("flight", ttl, now)
                flight, landed = (now, ttl, False), False
        elif step == "early" and flight is not None and not landed:
            expiry, landed = now + flight[1], True  # applied now; its answer comes later, or never
        elif step == "answer" and flight is not None:
            sent_at, sent_ttl, is_extend = flight
            if not landed:
                expiry = now + sent_ttl  # it landed just now, and was answered
            if is_extend:
                life.extended(sent_ttl, sent_at, now)
                life.done("flight")
            else:
                life.renewed(True, sent_ttl, sent_at, now)
            flight = None
        elif step == "silence" and flight is not None:
            sent_at, sent_ttl, is_extend = flight
            if is_extend:
                life.extend_unknown(sent_ttl, sent_at, now)
                life.done("flight")
            else:
                life.renewed(None, sent_ttl, sent_at, now)
            if not landed:
                pending.append((sent_at, sent_ttl))
            flight = None
        elif step == "land" and pending:
            _, late_ttl = pending.pop(pick % len(pending))
            expiry = now + late_ttl  # an unanswered one lands now, after whatever was counted
        elif step == "gone" and flight is None:
            life.release_asked()
        if life.remaining(now) > 0.0:
            assert now + life.remaining(now) <= expiry, (now + life.remaining(now), expiry)
            assert not life.is_lost(now)


def test_an_extend_to_a_shorter_ttl_caps_the_claim_from_its_sending_until_its_answer() -> None:
    """The server may apply an extend before its answer comes: from its sending, a shorter TTL caps remaining()
    and ends the validity (is_lost, the watchdog's tick) when it runs out; its answer settles the count."""
    life: LeaseState[str] = LeaseState(30.0, validity_end(30.0, T0), None)
    sent = T0 + 1.0
    assert life.take("extend") is None
    life.extending(0.5, sent)
    end = validity_end(0.5, sent)
    assert life.remaining(sent + 0.1) == pytest.approx(end - sent - 0.1)
    assert life.due == end  # (the watchdog looks at a watched lease then)
    assert not life.is_lost(end - 1e-6)
    assert life.is_lost(end)
    assert life.tick(end) is Tick.EXPIRE
    assert life.valid_until == validity_end(30.0, T0)  # what was confirmed is unchanged until the answer
    # Answered in time: counted from its sending, with its TTL; nothing in flight caps it any more.
    assert life.extended(0.5, sent, sent + 0.2)
    life.done("extend")
    assert life.remaining(sent + 0.2) == pytest.approx(end - sent - 0.2)
    assert life.bound == math.inf


def test_an_extend_to_a_longer_ttl_in_flight_claims_what_was_confirmed_and_silence_keeps_the_shorter_cap() -> None:
    life = renewed_lease(ttl=30.0, every=10.0)
    before = life.valid_until
    assert life.take("longer") is None
    life.extending(60.0, T0 + 1.0)
    assert life.remaining(T0 + 1.1) == pytest.approx(before - T0 - 1.1)  # not counted until confirmed
    life.extend_unknown(60.0, T0 + 1.0, T0 + 1.5)
    life.done("longer")
    assert life.valid_until == before
    assert life.take("shorter") is None
    life.extending(2.0, T0 + 2.0)
    life.extend_unknown(2.0, T0 + 2.0, T0 + 3.0)  # no answer: it may have landed, or land later
    life.done("shorter")
    assert life.bound == math.inf
    assert life.valid_until == validity_end(2.0, T0 + 2.0)
    assert life.remaining(T0 + 3.0) == pytest.approx(validity_end(2.0, T0 + 2.0) - T0 - 3.0)


def test_an_extend_confirmed_after_its_ttl_ran_out_grants_nothing() -> None:
    life = renewed_lease()
    assert life.extended(0.1, T0 + 0.5, T0 + 0.59)  # in time: the drift (1 % + 2 ms) leaves 0.097 s
    assert not life.extended(0.1, T0 + 0.5, T0 + 0.5 + 0.1)
    assert life.remaining(T0 + 0.6) == 0.0


def test_a_renewal_may_go_a_share_of_its_interval_early_but_the_end_of_validity_check_never_does() -> None:
    life = renewed_lease()
    assert life.early(0.1) == pytest.approx(0.1 * EVERY)
    life.tick(T0 + EVERY)
    assert life.early(0.1) == 0.0  # now due when the validity ends
    assert LeaseState(TTL, validity_end(TTL, T0), None).early(0.1) == 0.0


STEPS = st.lists(st.tuples(st.sampled_from(["tick", "ok", "gone", "silent", "lose", "release"]),
                           st.floats(0.0, 2.0)), max_size=30)


@given(steps=STEPS)
def test_validity_grows_only_by_a_confirmed_renewal_and_a_lease_never_comes_back(
        steps: list[tuple[str, float]]) -> None:
    life = renewed_lease()
    now = T0
    gone = False
    for step, elapsed in steps:
        now += elapsed
        before = life.valid_until
        if step == "tick":
            tick = life.tick(now)
            if tick is Tick.EXPIRE:
                assert life.lose("expired")
            if tick is Tick.RENEW:
                life.sending("flight", TTL, now)
        elif step in ("ok", "gone", "silent"):
            sent_at = now - elapsed
            answer = {"ok": True, "gone": False, "silent": None}[step]
            outcome = life.renewed(answer, TTL, sent_at, now)
            if outcome is Renewal.GONE:
                assert life.lose("gone")
            if outcome is Renewal.EXTENDED:
                assert life.valid_until == validity_end(TTL, sent_at)
                continue
        elif step == "lose":
            life.lose("told")
        elif life.state is State.HELD:
            life.release_answered(Released.RELEASED, now)
        assert life.valid_until <= before
        if gone:
            assert life.state is not State.HELD
            assert life.remaining(now) == 0.0
        gone = life.state is not State.HELD


def test_an_extend_to_a_shorter_ttl_renews_at_the_new_ttls_pace() -> None:
    life = renewed_lease(ttl=30.0, every=10.0)  # renew=True: a third of the TTL
    sent = T0 + 1.0
    assert life.extended(3.0, sent, sent + 0.01)
    assert life.renew_every == pytest.approx(1.0)
    assert life.due == pytest.approx(sent + 1.0)
    assert life.due < life.valid_until
    life.tick(life.due)
    life.sending("flight", 3.0, sent + 1.0)
    assert life.renewed(True, 3.0, sent + 1.0, sent + 1.01) is Renewal.EXTENDED
    assert life.due == pytest.approx(sent + 2.0)  # and so on: never a renewal after the validity ends


def test_an_explicit_interval_is_kept_while_it_fits_the_new_ttl_and_shortened_when_it_does_not() -> None:
    life = renewed_lease(ttl=30.0, every=5.0)
    assert life.extended(60.0, T0 + 1.0, T0 + 1.01)
    assert life.renew_every == 5.0
    assert life.extended(4.0, T0 + 2.0, T0 + 2.01)  # 5 s no longer fits below half of 4 s
    assert life.renew_every == pytest.approx(4.0 / 3)
    assert life.due <= life.valid_until


def test_a_renewal_interval_follows_the_shorter_ttl_an_unanswered_request_may_still_set() -> None:
    life = renewed_lease(ttl=30.0, every=10.0)
    life.extend_unknown(3.0, T0 + 1.0, T0 + 2.0)  # may land later: every later count is at most 3 s
    life.tick(life.due)
    life.sending("flight", 30.0, T0 + 2.5)
    assert life.renewed(True, 30.0, T0 + 2.5, T0 + 2.6) is Renewal.EXTENDED
    assert life.valid_until <= validity_end(3.0, T0 + 2.5)
    assert life.due == pytest.approx(T0 + 2.5 + 1.0)  # renewed within the 3 s that is counted, not after 10 s


def test_a_release_never_sent_leaves_no_doubt_and_a_later_gone_or_taken_is_a_loss() -> None:
    """A release that failed before it left the client (no connection) changed nothing on the server: a later
    release that finds the key gone or taken reports the loss, not a release (before, a connection refused made
    it "unsure", and a retry after the server restarted empty reported released while another held the lock)."""
    for answer in (Released.EXPIRED, Released.TAKEN):
        life: LeaseState[str] = LeaseState(TTL, validity_end(TTL, T0), None)
        life.release_asked()  # the first release: refused a connection, never sent (no `release_unknown`)
        assert not life.release_answered(answer, T0 + 1.0)
    life = LeaseState(TTL, validity_end(TTL, T0), None)
    life.release_asked()
    life.release_unknown(T0 + 0.5)  # sent, its answer never came: a later "taken" may be its own doing
    assert life.release_answered(Released.TAKEN, T0 + 1.0)
    assert life.state is State.RELEASED
