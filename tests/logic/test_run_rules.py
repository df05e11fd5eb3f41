"""`fencelock run`'s rules for stopping a command (`_cli.exits`), for fencelock and its guardian, on a fake clock."""

from __future__ import annotations

import math
import signal

from hypothesis import given
from hypothesis import strategies as st

from fencelock._cli.exits import (
    KILL_MARGIN,
    SILENT,
    OnLost,
    Stop,
    Stopping,
    Trouble,
    guard_step,
    heard,
    in_doubt,
    lease_trouble,
    stop_step,
)

TERM, KILL, IGNORE = OnLost.TERM, OnLost.KILL, OnLost.IGNORE
NONE, DOUBT, LOST, ORPHANED = Trouble.NONE, Trouble.DOUBT, Trouble.LOST, Trouble.ORPHANED
TTL, EVERY, GRACE = 30.0, 10.0, 10.0
M = KILL_MARGIN


# -- is the lease in doubt? -------------------------------------------------------------------------------------

def test_a_lease_is_in_doubt_once_its_renewal_is_half_an_interval_late() -> None:
    # renewed every 10 s, a confirmed lease never has less than ~20 s left; the renewal due then is late by 5 s
    assert not in_doubt(29.7, TTL, EVERY)
    assert not in_doubt(20.0, TTL, EVERY)      # due now: not late yet
    assert not in_doubt(15.01, TTL, EVERY)
    assert in_doubt(14.99, TTL, EVERY)         # half the TTL at the default interval
    assert lease_trouble(False, 29.0, TTL, EVERY) is NONE
    assert lease_trouble(False, 14.0, TTL, EVERY) is DOUBT
    assert lease_trouble(True, 14.0, TTL, EVERY) is LOST
    assert lease_trouble(False, 0.0, TTL, EVERY) is LOST   # its validity ran out


# -- fencelock: loss, doubt, confirmation ----------------------------------------------------------------------

def test_a_certain_loss_sends_sigterm_at_once_and_sigkill_after_the_whole_grace() -> None:
    step = stop_step(TERM, Stopping(), LOST, 100.0, 120.0, GRACE)
    assert step == Stop(signal.SIGTERM, Stopping(100.0, 110.0), 110.0)   # validity left does not shorten it
    assert stop_step(TERM, step.state, LOST, 109.9, 120.0, GRACE) == Stop(None, step.state, 110.0)
    assert stop_step(TERM, step.state, LOST, 110.0, 120.0, GRACE) == Stop(signal.SIGKILL,
                                                                          Stopping(100.0, 110.0, True), None)
    assert stop_step(KILL, Stopping(), LOST, 100.0, 120.0, GRACE).signal == signal.SIGKILL
    assert stop_step(IGNORE, Stopping(), LOST, 100.0, 120.0, GRACE) == Stop(None, Stopping(), None)


def test_in_doubt_sigterm_comes_when_grace_is_left_and_sigkill_a_margin_before_the_validity_ends() -> None:
    # validity ends at 130; grace 10: nothing before 120, SIGTERM at 120, SIGKILL at 130 - margin
    assert stop_step(TERM, Stopping(), DOUBT, 110.0, 130.0, GRACE) == Stop(None, Stopping(), 120.0)
    step = stop_step(TERM, Stopping(), DOUBT, 120.0, 130.0, GRACE)
    assert step == Stop(signal.SIGTERM, Stopping(120.0, 130.0 - M), 130.0 - M)
    assert stop_step(TERM, step.state, DOUBT, 130.0 - M - 0.01, 130.0, GRACE).signal is None
    assert stop_step(TERM, step.state, DOUBT, 130.0 - M, 130.0, GRACE).signal == signal.SIGKILL
    # the watchdog calls it lost at the validity's end: the deadline set in doubt holds
    assert stop_step(TERM, step.state, LOST, 130.0, 130.0, GRACE).signal == signal.SIGKILL


def test_with_a_grace_longer_than_the_ttl_doubt_sends_sigterm_as_soon_as_it_begins() -> None:
    # --ttl 3, --grace 10: in doubt (1.4 s left) means at once, SIGKILL a margin before those 1.4 s end
    step = stop_step(TERM, Stopping(), DOUBT, 50.0, 51.4, GRACE)
    assert step == Stop(signal.SIGTERM, Stopping(50.0, 51.4 - M), 51.4 - M)


def test_with_a_grace_shorter_than_the_margin_doubt_kills_before_the_validity_ends() -> None:
    # --grace 0: SIGTERM would be due at the validity's end itself; SIGKILL comes at once a margin before it
    assert stop_step(TERM, Stopping(), DOUBT, 100.0, 130.0, 0.0) == Stop(None, Stopping(), 130.0 - M)
    assert stop_step(TERM, Stopping(), DOUBT, 130.0 - M, 130.0, 0.0).signal == signal.SIGKILL
    step = stop_step(TERM, Stopping(), DOUBT, 130.0 - M, 130.0, M / 2)   # a grace within the margin
    assert step.signal == signal.SIGKILL


def test_a_renewal_confirmed_after_sigterm_gives_back_the_whole_grace() -> None:
    termed = stop_step(TERM, Stopping(), DOUBT, 120.0, 130.0, GRACE).state
    step = stop_step(TERM, termed, NONE, 125.0, 150.0, GRACE)
    assert step == Stop(None, Stopping(120.0, 130.0), 130.0)   # 120 + grace: the SIGTERM is not taken back
    assert stop_step(TERM, step.state, NONE, 130.0, 150.0, GRACE).signal == signal.SIGKILL


def test_on_lost_kill_in_doubt_kills_a_margin_before_the_validity_ends_and_ignore_never_signals() -> None:
    assert stop_step(KILL, Stopping(), DOUBT, 120.0, 130.0, GRACE) == Stop(None, Stopping(), 130.0 - M)
    assert stop_step(KILL, Stopping(), DOUBT, 130.0 - M, 130.0, GRACE).signal == signal.SIGKILL
    assert stop_step(IGNORE, Stopping(), DOUBT, 130.0, 130.0, GRACE).signal is None


def test_after_sigkill_nothing_more_is_sent() -> None:
    killed = Stopping(100.0, 110.0, True)
    for trouble in Trouble:
        assert stop_step(TERM, killed, trouble, 200.0, 130.0, GRACE) == Stop(None, killed, None)


def _run_until_killed(policy: OnLost, start: float, valid_until: float, grace: float, late: float) -> float:
    """Step `stop_step` in doubt as fencelock does: it looks every 50 ms, or at the step's `next_at` if sooner, each
    look `late` seconds late (a busy machine). Returns when SIGKILL went out."""
    state, now = Stopping(), start
    while True:
        step = stop_step(policy, state, DOUBT, now, valid_until, grace)
        if step.state.killed:
            return now
        state = step.state
        wake = now + 0.05 if step.next_at is None else min(now + 0.05, step.next_at)
        now = max(wake, now) + late


@given(st.floats(0.0, 1000.0), st.floats(0.0, 100.0), st.floats(0.0, 200.0), st.sampled_from([TERM, KILL]),
       st.floats(0.0, KILL_MARGIN * 0.9))
def test_in_doubt_sigkill_goes_out_before_the_validity_ends(start: float, grace: float, valid_for: float,
                                                           policy: OnLost, late: float) -> None:
    """However late each look comes within the margin, SIGKILL has gone out before the validity's end (the key's
    expiry on the server comes later still): the command never runs while someone else may hold the lock."""
    valid_until = start + valid_for
    killed_at = _run_until_killed(policy, start, valid_until, grace, late)
    if valid_for <= KILL_MARGIN:
        assert killed_at == start          # no more than the margin left: at the first look
    else:
        assert killed_at < valid_until


@given(st.floats(0.0, 1000.0), st.floats(0.0, 100.0), st.floats(0.0, 200.0), st.sampled_from([TERM, KILL]))
def test_in_doubt_sigkill_goes_out_no_earlier_than_the_margin_asks(start: float, grace: float, valid_for: float,
                                                                  policy: OnLost) -> None:
    valid_until = start + valid_for
    killed_at = _run_until_killed(policy, start, valid_until, grace, 0.0)
    assert killed_at >= min(start, valid_until - KILL_MARGIN) - 1e-9


# -- the guardian ----------------------------------------------------------------------------------------------

def test_the_guardian_does_nothing_while_fencelock_is_heard() -> None:
    step = guard_step(TERM, Stopping(), 100.0, GRACE, heard_at=99.9, valid_until=100.5, eof=False)
    assert step == Stop(None, Stopping(), 99.9 + SILENT)


def test_the_guardian_stops_the_group_at_once_when_fencelock_is_gone() -> None:
    step = guard_step(TERM, Stopping(), 100.0, GRACE, heard_at=100.0, valid_until=125.0, eof=True)
    assert step == Stop(signal.SIGTERM, Stopping(100.0, 110.0), 110.0)
    # ... never killing later than the validity ends, since nobody renews the lock now
    step = guard_step(TERM, Stopping(), 100.0, GRACE, heard_at=100.0, valid_until=103.0, eof=True)
    assert step == Stop(signal.SIGTERM, Stopping(100.0, 103.0 - M), 103.0 - M)
    assert guard_step(KILL, Stopping(), 100.0, GRACE, heard_at=100.0, valid_until=125.0,
                      eof=True).signal == signal.SIGKILL
    assert guard_step(IGNORE, Stopping(), 100.0, GRACE, heard_at=100.0, valid_until=125.0,
                      eof=True).signal is None
    # no validity heard yet (fencelock died at once): SIGKILL after the grace
    step = guard_step(TERM, Stopping(), 100.0, GRACE, heard_at=100.0, valid_until=math.inf, eof=True)
    assert step.state.kill_at == 110.0


def test_a_silent_fencelock_is_treated_as_a_lease_in_doubt() -> None:
    # stopped at 100 with its validity ending at 125: SIGTERM at 115 (grace 10), SIGKILL a margin before 125
    def quiet(policy: OnLost, state: Stopping, now: float) -> Stop:
        return guard_step(policy, state, now, GRACE, heard_at=100.0, valid_until=125.0, eof=False)

    assert quiet(TERM, Stopping(), 100.0 + SILENT) == Stop(None, Stopping(), 115.0)
    step = quiet(TERM, Stopping(), 115.0)
    assert step == Stop(signal.SIGTERM, Stopping(115.0, 125.0 - M), 125.0 - M)
    assert quiet(TERM, step.state, 125.0 - M).signal == signal.SIGKILL
    assert quiet(KILL, Stopping(), 125.0 - M - 0.01).signal is None
    assert quiet(KILL, Stopping(), 125.0 - M).signal == signal.SIGKILL


def test_a_fencelock_silent_for_less_than_silent_still_has_its_command_killed_before_the_validity_ends() -> None:
    # heard at 124.9, validity ends at 125: the guardian does not wait for SILENT (125.15) to pass
    step = guard_step(TERM, Stopping(), 124.9, GRACE, heard_at=124.9, valid_until=125.0, eof=False)
    assert step == Stop(None, Stopping(), 125.0 - M / 2)
    step = guard_step(TERM, Stopping(), 125.0 - M / 2, GRACE, heard_at=124.9, valid_until=125.0, eof=False)
    assert step.signal == signal.SIGKILL
    # fencelock is stopping the group itself (a certain loss: its whole grace): the guardian follows it, heard
    stopping = heard(Stopping(), "stop 135.0", 125.0)
    assert guard_step(TERM, stopping, 125.0, GRACE, heard_at=125.0, valid_until=125.0, eof=False).signal is None


@given(st.floats(0.0, 1000.0), st.floats(0.0, 100.0), st.floats(0.0, 60.0), st.floats(0.0, 60.0),
       st.sampled_from([TERM, KILL]), st.floats(0.0, KILL_MARGIN * 0.45))
def test_whenever_fencelock_falls_silent_the_guardian_kills_before_the_validity_ends(
        start: float, grace: float, heard_for: float, valid_for: float, policy: OnLost, late: float) -> None:
    """fencelock is heard every 50 ms until `heard_for`, its lease unconfirmed, its validity ending at `valid_for`;
    the guardian wakes at its `next_at` (each wake `late`): SIGKILL goes out before the validity's end."""
    valid_until = start + valid_for
    last_heard = start + min(heard_for, valid_for)
    state, now = Stopping(), start
    for _ in range(100_000):
        heard_at = min(last_heard, start + 0.05 * int((now - start) / 0.05))
        step = guard_step(policy, state, now, grace, heard_at=heard_at, valid_until=valid_until, eof=False)
        if step.state.killed:
            break
        state = step.state
        assert step.next_at is not None
        assert step.next_at > now, "the guardian would look again at once, for ever"
        now = min(step.next_at, now + 0.05) + late
    else:
        raise AssertionError("the guardian never killed")
    if valid_for > KILL_MARGIN / 2:
        assert now < valid_until
    else:  # at once (its backstop, the validity's end less half the margin, is already past, but for rounding)
        assert now - start < 1e-9


def test_the_guardian_follows_what_fencelock_already_sent() -> None:
    state = heard(Stopping(), "stop 110.5", 100.0)
    assert state == Stopping(100.0, 110.5)
    # fencelock then dies: no second SIGTERM, SIGKILL when fencelock meant to send it
    assert guard_step(TERM, state, 101.0, GRACE, heard_at=100.0, valid_until=130.0, eof=True) == Stop(
        None, state, 110.5)
    assert guard_step(TERM, state, 110.5, GRACE, heard_at=100.0, valid_until=130.0, eof=True).signal == signal.SIGKILL
    killed = heard(state, "kill", 105.0)
    assert killed.killed
    assert guard_step(TERM, killed, 111.0, GRACE, heard_at=100.0, valid_until=130.0, eof=True).signal is None
    assert heard(Stopping(), "stop nonsense", 100.0) == Stopping()
    assert heard(Stopping(), "valid 12.5", 100.0) == Stopping()


# -- a frozen group ----------------------------------------------------------------------------------------------

def test_a_frozen_group_gets_sigkill_wherever_sigterm_would_go() -> None:
    # a stopped process cannot handle SIGTERM, and continuing it would let it run without the lock
    assert stop_step(TERM, Stopping(), LOST, 100.0, 120.0, GRACE, frozen=True) == Stop(
        signal.SIGKILL, Stopping(None, 100.0, True), None)
    assert stop_step(TERM, Stopping(), DOUBT, 120.0, 130.0, GRACE, frozen=True).signal == signal.SIGKILL
    assert stop_step(TERM, Stopping(), DOUBT, 110.0, 130.0, GRACE, frozen=True) == Stop(None, Stopping(), 120.0)
    assert stop_step(TERM, Stopping(), NONE, 110.0, 130.0, GRACE, frozen=True) == Stop(None, Stopping(), None)
    assert stop_step(IGNORE, Stopping(), LOST, 110.0, 130.0, GRACE, frozen=True).signal is None
    assert guard_step(TERM, Stopping(), 100.0, GRACE, heard_at=100.0, valid_until=125.0, eof=True,
                      frozen=True).signal == signal.SIGKILL


# -- one clock ---------------------------------------------------------------------------------------------------

def test_fencelock_run_and_its_guardian_count_validity_on_the_lease_clock() -> None:
    """The lease counts its validity on CLOCK_BOOTTIME (a suspend counts, as on the server); fencelock turns it into
    a validity end, and its guardian (which imports no package: `exits.lease_clock`) compares it with its own now.
    Both must read that same clock, or after a suspend the guardian would wait out validity the server no longer
    keeps."""
    import time

    from fencelock._cli import exits, supervise
    from fencelock._logic import timing

    assert vars(supervise)["lease_clock"] is timing.lease_clock
    if hasattr(time, "CLOCK_BOOTTIME"):
        before = time.clock_gettime(time.CLOCK_BOOTTIME)
        ours, lease = exits.lease_clock(), timing.lease_clock()
        after = time.clock_gettime(time.CLOCK_BOOTTIME)
        assert before <= ours <= lease <= after
        assert exits.lease_clock is not time.monotonic
    else:  # pragma: no cover (not Linux)
        assert exits.lease_clock is time.monotonic
