"""What a release's replies mean when a release went twice (its connection closed under the first sending)."""

from __future__ import annotations

import pytest

from fencelock._logic.lease import LeaseState
from fencelock._logic.outcomes import Released, gone
from fencelock._redis.redlock import NO_ANSWER, UNSURE, node_code, release_outcome
from fencelock._redis.request import Resent, ScriptRequest, release_answer, reply_of
from fencelock._scripts import RELEASE, STATUS


def test_only_a_second_sending_of_a_release_is_marked() -> None:
    first = ScriptRequest(None, RELEASE, [], [])
    assert type(reply_of(first, 0)) is int
    assert isinstance(reply_of(first.again(), 0), Resent)
    assert not isinstance(reply_of(ScriptRequest(None, STATUS, [], []).again(), 0), Resent)
    assert isinstance(reply_of(first.again(), ConnectionError()), ConnectionError)  # errors pass as they are


@pytest.mark.parametrize(("code", "answer"), [
    (1, Released.RELEASED), (0, Released.EXPIRED), (-1, Released.TAKEN),
    # A second sending that finds the key gone or another's: our first may have deleted it, and a waiter taken it.
    (Resent(1), Released.RELEASED), (Resent(0), Released.UNSURE), (Resent(-1), Released.UNSURE),
])
def test_a_single_servers_release_answer(code: int, answer: Released) -> None:
    assert release_answer(code) is answer


def test_a_redlock_node_code() -> None:
    assert node_code(None) == NO_ANSWER
    assert node_code(TimeoutError()) == NO_ANSWER
    assert node_code(Resent(0)) == UNSURE
    assert node_code(Resent(-1)) == UNSURE
    assert [node_code(c) for c in (1, 0, -1, Resent(1))] == [1, 0, -1, 1]


@pytest.mark.parametrize(("codes", "outcome"), [
    ([1, 1, 1, 0, 0], Released.RELEASED),
    ([1, 1, UNSURE, 0, NO_ANSWER], Released.UNSURE),     # a quorum released or may have
    ([1, 1, NO_ANSWER, NO_ANSWER, 0], None),             # the silent nodes could make the quorum: unknown
    ([1, UNSURE, 0, 0, NO_ANSWER], None),
    ([1, 0, 0, 0, -1], Released.TAKEN),
    ([1, 0, 0, 0, UNSURE], Released.EXPIRED),
])
def test_a_redlock_release_outcome(codes: list[int], outcome: Released | None) -> None:
    assert release_outcome(codes, len(codes)) is outcome


@pytest.mark.parametrize(("sent_before", "others_queued", "answer"), [
    (False, False, Released.EXPIRED), (False, True, Released.TAKEN),
    (True, False, Released.UNSURE), (True, True, Released.UNSURE),   # maybe our own earlier sending: judged
])
def test_a_key_found_gone_where_waiters_queue(sent_before: bool, others_queued: bool, answer: Released) -> None:
    assert gone(sent_before, others_queued) is answer


def test_a_release_sent_again_that_finds_its_key_gone_is_released_if_the_first_left_in_time() -> None:
    """The waiter queued behind us holds the lock after our first release went through (etcd, ZooKeeper: "gone";
    Redis: another token)."""
    life: LeaseState[object] = LeaseState(10.0, valid_until=20.0, renew_every=None)
    life.release_unknown(sent_at=12.0)                              # the first sending: no answer
    assert life.release_answered(gone(True, True), sent_at=13.0)    # the second: gone, someone queued
    retried: LeaseState[object] = LeaseState(10.0, valid_until=20.0, renew_every=None)
    retried.release_unknown(sent_at=12.0)                           # Redis: the caller's own retry finds ...
    assert retried.release_answered(Released.TAKEN, sent_at=13.0)   # ... the waiter's token: released
    late: LeaseState[object] = LeaseState(10.0, valid_until=20.0, renew_every=None)
    late.release_unknown(sent_at=21.0)                              # sent after the validity ended
    assert not late.release_answered(gone(True, True), sent_at=22.0)
