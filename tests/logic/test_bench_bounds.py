"""The bench's reach arithmetic (`bench/workload.py`), pure: what the closed loop of the contended workload
allows any lock, checked against a simulated FIFO queue."""

from __future__ import annotations

import math

import pytest

from bench.workload import (
    Contended,
    ContendedParams,
    ContendedRun,
    _WorkerReport,
    least_mean_wait_ms,
    least_p99_ms,
    most_hand_off_ms,
    summarise,
)


def _fifo_waits(workers: int, hold: float, hand_off: float, outside: float, turns: int) -> list[float]:
    """Waits in a FIFO lock where every worker loops: wait, hold, then `outside` (release and pause) before it
    asks again, and each grant follows the previous section's end by `hand_off` (or waits for its asker)."""
    asked = [i * 1e-6 for i in range(workers)]  # all ask at once, in index order
    queue = list(range(workers))
    free_at = 0.0
    waits = []
    for _ in range(turns):
        who = queue.pop(0)
        granted = max(free_at + hand_off, asked[who])
        waits.append(granted - asked[who])
        ended = granted + hold
        free_at = ended
        asked[who] = ended + outside
        queue.append(who)
    return waits[turns // 2:]  # the steady state


def _result(workers: int, hold: float, outside: float) -> Contended:
    return Contended("x", ContendedParams(workers=workers), hold_mean_ms=hold, outside_mean_ms=outside)


@pytest.mark.parametrize("hand_off", [0.0, 0.05, 0.3])
def test_a_fifo_queue_gives_the_least_mean_wait_plus_one_round_of_hand_offs(hand_off: float) -> None:
    waits = _fifo_waits(8, 1.1, hand_off, 0.8, 4000)
    mean = sum(waits) / len(waits)
    assert mean == pytest.approx(8 * (1.1 + hand_off) - 1.1 - 0.8, abs=1e-6)
    assert least_mean_wait_ms(_result(8, 1.1, 0.8)) == pytest.approx(8 * 1.1 - 1.1 - 0.8)  # the hand-off-free case
    assert least_mean_wait_ms(_result(8, 1.1, 0.8)) <= mean + 1e-9


def test_the_lowest_p99_puts_one_percent_at_the_bound_and_the_rest_at_the_p99() -> None:
    lowest = least_p99_ms(6.9, 18.0)
    waits = [lowest] * 99 + [18.0]
    assert sum(waits) / len(waits) == pytest.approx(6.9)


def test_the_longest_hand_off_for_a_p99_is_the_one_whose_fifo_mean_meets_it() -> None:
    result = _result(8, 1.1, 0.8)
    most = most_hand_off_ms(result, 7.5, 18.0)
    assert most > 0
    waits = _fifo_waits(8, 1.1, most, 0.8, 4000)
    mean = sum(waits) / len(waits)
    assert mean == pytest.approx(0.99 * 7.5 + 0.01 * 18.0, abs=1e-6)  # exactly what the p99 and bound allow
    # A slower hand-off gives a FIFO queue a mean wait (and, every wait being alike, a p99) above the target.
    slower = _fifo_waits(8, 1.1, most + 0.01, 0.8, 4000)
    assert min(slower) > 7.5
    assert most_hand_off_ms(result, 6.0, 18.0) < 0  # below the least mean wait: no hand-off is fast enough
    assert math.isclose(least_p99_ms(least_mean_wait_ms(result), 18.0), (6.9 - 0.18) / 0.99)


def test_the_longest_wait_is_taken_apart_into_the_sections_held_during_it_and_the_rest() -> None:
    # Worker 1 asks at 0.0 while worker 0 holds 0.0-5.0 (a stretched 1 ms section) and then 5.3-6.3; it gets
    # the lock at 6.6: 6.6 ms of wait, 6.0 ms of it others' sections (the longest 5.0), 0.6 ms hand-offs.
    ms = 1e-3
    holder = _WorkerReport(0, [(0.0, 0.0, 5.0 * ms), (5.2 * ms, 5.3 * ms, 6.3 * ms)], 0, None)
    waiter = _WorkerReport(1, [(0.0, 6.6 * ms, 7.6 * ms)], 0, None)
    run = ContendedRun("x", (-1.0, 1.0), [holder, waiter])
    result = summarise("x", ContendedParams(workers=2), [run])
    assert result.longest_ms == pytest.approx(6.6)
    assert result.longest_holds_ms == pytest.approx(6.0)
    assert result.longest_top_hold_ms == pytest.approx(5.0)
