"""A Redlock renewal batch (`extend_many` on every node) is decided as soon as no answer still to come can change
any lease's outcome: a stalled minority never holds it until the node timeout, and an early decision never says
"extended" where the full answers would not, or the reverse."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fencelock._redis.redlock import batch_outcomes, batch_settled


def test_three_healthy_nodes_of_five_decide_the_batch_without_the_two_stalled() -> None:
    replies = {2: [1, 1], 3: [1, 1], 4: [1, 1]}
    assert batch_settled(replies, 2, 5)
    assert batch_outcomes(replies, 2, 5) == [True, True]


def test_a_lease_one_more_answer_could_extend_keeps_the_batch_open() -> None:
    replies = {2: [1, 1], 3: [1, 0], 4: [1, 1]}  # lease 1: two of five so far, two nodes yet to answer
    assert not batch_settled(replies, 2, 5)
    assert batch_outcomes(replies, 2, 5) == [True, None]


def test_a_lease_that_no_answer_to_come_can_extend_is_decided_lost() -> None:
    replies = {2: [0], 3: [0], 4: [0]}  # deleted or taken on the three healthy nodes
    assert batch_settled(replies, 1, 5)
    assert batch_outcomes(replies, 1, 5) == [False]


def test_failed_nodes_count_as_answered_with_nothing() -> None:
    replies: dict[int, list[int] | None] = {0: None, 1: None, 2: None}
    assert batch_settled(replies, 1, 5)  # two nodes left cannot make three
    assert batch_outcomes(replies, 1, 5) == [None]  # unknown: retried while the lease is valid


@st.composite
def _batches(draw: st.DrawFn) -> tuple[int, int, list[list[int] | None], list[int]]:
    n = draw(st.sampled_from([3, 5, 7]))
    count = draw(st.integers(1, 4))
    rows = [draw(st.none() | st.lists(st.sampled_from([0, 1]), min_size=count, max_size=count)) for _ in range(n)]
    order = draw(st.permutations(list(range(n))))
    return n, count, rows, order


@given(_batches())
def test_once_settled_no_later_answer_changes_which_leases_are_extended(
        batch: tuple[int, int, list[list[int] | None], list[int]]) -> None:
    n, count, rows, order = batch
    final = batch_outcomes(dict(enumerate(rows)), count, n)
    assert batch_settled(dict(enumerate(rows)), count, n)  # liveness: every node answered, it is decided
    so_far: dict[int, list[int] | None] = {}
    for j in order:
        so_far[j] = rows[j]
        if batch_settled(so_far, count, n):
            early = batch_outcomes(so_far, count, n)
            assert [o is True for o in early] == [o is True for o in final]
            # "lost" said early stays lost; "unknown" early may only become "lost", never "extended"
            assert all(f is False for e, f in zip(early, final, strict=True) if e is False)
            break
