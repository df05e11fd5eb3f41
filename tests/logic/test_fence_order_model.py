"""The fence rule `next_fence` (max(stored + 1, clock in µs)) on an in-memory model of a Redis that loses data.

A run interleaves grants, clock steps (forward or back) on the serving node, and data losses: a restart without
persistence (the counter is gone), a failover to a replica that missed the last writes (an older counter
survives, on a node whose clock is skewed against the old one), and the fence key's expiry after the name was
idle for the retention (same node, same clock). What is proven, with Python integers throughout:

- while the counter survives, fences strictly increase whatever the clocks do;
- after a loss, a grant is above every earlier fence exactly when its clock reading is above them, or the
  surviving counter already was: the assumption of `docs/design/fences.md` is necessary and sufficient;
- in physical terms: with skew at most K between nodes, no clock stepping back, and at least 2K + 1 µs between
  the last grant before a failover and the first one after it, fences strictly increase;
- expiry after a retention R, with the clock stepping back by less than R in all, keeps fences increasing;
- the counter-only rule (stored + 1) hands out an old fence again after any loss of the counter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from fencelock._redis.fences import EXACT_IN_LUA, clock_us, fence_keep_ms, next_fence

START = 1_800_000_000_000_000  # µs since 1970, about 2027: the clock floor's order of magnitude


@dataclass
class Grant:
    dt: int  # µs of real time before the grant


@dataclass
class Step:
    delta: int  # µs the serving node's clock jumps (negative: back)


@dataclass
class Loss:
    kept: int | None  # None: counter gone; k: the counter as it was k grants ago (a replica behind by k writes)
    offset: int       # the new node's clock offset against real time, µs
    gap: int          # µs of real time before the next event (the failover's or the restart's duration)


@dataclass
class Run:
    """Real time, the serving node's clock offset and stored counter, and every grant: (clock, fence)."""
    rule: str = "clock"
    now: int = START
    offset: int = 0
    stored: int | None = None
    history: list[int | None] = field(default_factory=list)  # the counter after each grant
    grants: list[tuple[int, int, bool]] = field(default_factory=list)  # (clock reading, fence, first after loss)
    lost: bool = False

    def apply(self, event: Grant | Step | Loss) -> None:
        if isinstance(event, Grant):
            self.now += event.dt
            reading = self.now + self.offset
            fence = next_fence(self.stored, reading) if self.rule == "clock" else (self.stored or 0) + 1
            self.stored = fence
            self.history.append(fence)
            self.grants.append((reading, fence, self.lost))
            self.lost = False
        elif isinstance(event, Step):
            self.offset += event.delta
        else:
            if event.kept is None or event.kept >= len(self.history):
                self.stored = None
            else:
                self.stored = self.history[len(self.history) - 1 - event.kept]
            self.offset = event.offset
            self.now += event.gap
            self.lost = True


def fences(run: Run) -> list[int]:
    return [fence for _, fence, _ in run.grants]


def increasing(values: list[int]) -> bool:
    return all(a < b for a, b in pairwise(values))


grants = st.builds(Grant, st.integers(1, 10_000_000))
steps = st.builds(Step, st.integers(-3_600_000_000, 3_600_000_000))
losses = st.builds(Loss, st.none() | st.integers(0, 5), st.integers(-2_000_000, 2_000_000),
                   st.integers(0, 5_000_000))


@given(st.lists(grants | steps, max_size=60))
def test_while_the_counter_survives_fences_increase_whatever_the_clock_does(events: list[Grant | Step]) -> None:
    run = Run()
    for event in events:
        run.apply(event)
    assert increasing(fences(run))


@settings(max_examples=300)
@given(st.lists(grants | steps | losses, max_size=60))
def test_after_a_loss_a_grant_is_above_every_earlier_fence_exactly_when_its_clock_or_counter_is(
        events: list[Grant | Step | Loss]) -> None:
    run = Run()
    stored_before: list[int | None] = []
    for event in events:
        stored_before.append(run.stored)
        run.apply(event)
    highest = previous = 0
    seen = 0
    for i, event in enumerate(events):
        if not isinstance(event, Grant):
            continue
        reading, fence, after_loss = run.grants[seen]
        seen += 1
        survived = stored_before[i] or 0
        # the assumption: the clock reading (or what survived of the counter) is above every earlier fence
        assumption = reading > highest or survived >= highest
        assert (fence > highest) == assumption, (reading, fence, highest, survived)
        if not after_loss:
            assert fence > previous  # no loss since the last grant: the counter alone orders them
        highest, previous = max(highest, fence), fence


@settings(max_examples=300)
@given(st.integers(0, 1_000_000), st.data())
def test_with_bounded_skew_and_failovers_slower_than_twice_the_skew_fences_increase(skew: int,
                                                                                   data: st.DataObject) -> None:
    """Clocks that only move forward, within `skew` of real time; every loss takes more than 2 * skew."""
    forward = st.builds(Step, st.integers(0, 10_000_000))
    loss = st.builds(Loss, st.none() | st.integers(0, 5), st.integers(-skew, skew),
                     st.integers(2 * skew + 1, 2 * skew + 10_000_000))
    events = data.draw(st.lists(grants | forward | loss, max_size=60))
    run = Run(offset=data.draw(st.integers(-skew, skew)))
    for event in events:
        if isinstance(event, Step):  # a forward step stays within the skew bound: a clock catching up
            event = Step(min(event.delta, skew - run.offset))
        run.apply(event)
    assert increasing(fences(run))


@settings(max_examples=300)
@given(st.integers(1_000, 7 * 24 * 3600 * 1_000_000), st.data())
def test_expiry_after_the_retention_keeps_fences_increasing_unless_the_clock_went_back_by_more(
        retention: int, data: st.DataObject) -> None:
    """The fence key expires only after the name was idle for `retention` µs, on the same node and clock.

    The clock may step back, by less than the retention in all: fences still increase.
    """
    budget = retention - 1
    run = Run()
    for event in data.draw(st.lists(grants | steps | st.just("expire"), max_size=60)):
        if event == "expire":
            run.apply(Loss(None, run.offset, retention))  # idle for the retention, then gone
            continue
        if isinstance(event, Step) and event.delta < 0:
            delta = max(event.delta, -budget)
            budget += delta
            event = Step(delta)
        assert not isinstance(event, str)
        run.apply(event)
    assert increasing(fences(run))


def test_a_clock_behind_by_more_than_the_failover_took_hands_out_an_old_fence_again() -> None:
    """The boundary of the assumption: the new node's clock is 10 s behind, and the failover took 2 s."""
    run = Run()
    for event in (Grant(1), Grant(1), Loss(None, -10_000_000, 2_000_000), Grant(1)):
        run.apply(event)
    old, new = fences(run)[1], fences(run)[2]
    assert new <= old


@given(st.lists(grants, max_size=20), st.lists(grants, max_size=20), st.integers(0, 5_000_000))
def test_the_counter_alone_hands_out_an_old_fence_again_after_the_counter_is_lost(
        before: list[Grant], after: list[Grant], gap: int) -> None:
    """A restart without persistence on one node whose clock runs on: the counter restarts, the clock does not."""
    counter_only = Run(rule="counter")
    with_clock = Run()
    events: list[Grant | Step | Loss] = [Grant(1), *before, Loss(None, 0, gap), Grant(1), *after]
    for event in events:
        counter_only.apply(event)
        with_clock.apply(event)
    assert not increasing(fences(counter_only))  # it starts again at 1
    assert increasing(fences(with_clock))        # a clock that did not step back carries the order


@given(st.integers(0, 9_000_000_000), st.integers(0, 999_999))
def test_the_clock_floor_is_exact_in_lua_until_far_beyond_any_real_clock(seconds: int, micros: int) -> None:
    """Lua numbers are doubles: the script's floor is exact while it stays below 2^53 (the year 2255)."""
    floor = clock_us(seconds, micros)
    assert floor < EXACT_IN_LUA
    assert float(seconds) * 1_000_000 + float(micros) == float(floor)
    assert int(float(floor)) == floor


@given(st.floats(0.001, 1e9), st.integers(1, 2**40))
def test_the_fence_key_never_lives_less_than_the_lease(retention: float, lease_ms: int) -> None:
    keep = fence_keep_ms(retention, lease_ms)
    assert keep >= lease_ms
    assert keep >= retention * 1000
