"""Which of a client's requests goes out next (`_logic.admission`): a cap, queues by urgency, oldest first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencelock._logic.admission import Admission, Urgency, caller_deadline, no_caller_deadline, turn_wait


def test_requests_go_at_once_up_to_the_limit_then_wait() -> None:
    gate: Admission[str] = Admission(2)
    assert gate.enter("a", Urgency.NEW)
    assert gate.enter("b", Urgency.NEW)
    assert not gate.enter("c", Urgency.NEW)
    assert gate.out == 2
    assert gate.waiting == 1
    assert gate.queued("c")


def test_a_freed_slot_goes_to_renewals_then_ongoing_attempts_then_releases_then_new_work_each_oldest_first() -> None:
    gate: Admission[str] = Admission(1)
    assert gate.enter("out", Urgency.NEW)
    for ticket, urgency in [("grant1", Urgency.NEW), ("release1", Urgency.RELEASE), ("put1", Urgency.ONGOING),
                            ("renew1", Urgency.RENEWAL), ("grant2", Urgency.NEW), ("put2", Urgency.ONGOING),
                            ("release2", Urgency.RELEASE), ("renew2", Urgency.RENEWAL)]:
        assert not gate.enter(ticket, urgency)
    order = []
    while (handed := gate.done()) is not None:
        assert gate.out == 1  # the slot passed on
        assert not gate.queued(handed)
        order.append(handed)
    assert order == ["renew1", "renew2", "put1", "put2", "release1", "release2", "grant1", "grant2"]
    assert gate.out == 0
    assert gate.enter("next", Urgency.NEW)


def test_a_withdrawn_request_is_skipped_and_never_handed_a_slot() -> None:
    gate: Admission[str] = Admission(1)
    gate.enter("out", Urgency.NEW)
    gate.enter("gone", Urgency.RENEWAL)
    gate.enter("next", Urgency.NEW)
    gate.withdraw("gone")
    assert gate.waiting == 1
    assert gate.done() == "next"
    assert gate.done() is None
    assert gate.out == 0


def test_close_takes_every_waiting_request_out_of_line() -> None:
    gate: Admission[str] = Admission(1)
    gate.enter("out", Urgency.NEW)
    gate.enter("grant", Urgency.NEW)
    gate.enter("gone", Urgency.NEW)
    gate.enter("release", Urgency.RELEASE)
    gate.withdraw("gone")
    assert gate.close() == ["release", "grant"]
    assert gate.waiting == 0
    assert gate.done() is None  # the request that was out ends too
    assert gate.out == 0


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        Admission(0)


@given(st.integers(1, 4), st.lists(st.tuples(st.sampled_from(["enter", "done", "withdraw"]),
                                              st.sampled_from(list(Urgency))), max_size=60))
def test_never_more_than_the_limit_out_and_nobody_waits_while_a_slot_is_free(
        limit: int, ops: list[tuple[str, Urgency]]) -> None:
    gate: Admission[int] = Admission(limit)
    out: set[int] = set()
    waiting: dict[int, Urgency] = {}
    for ticket, (op, urgency) in enumerate(ops):
        if op == "enter":
            if gate.enter(ticket, urgency):
                out.add(ticket)
            else:
                waiting[ticket] = urgency
        elif op == "done" and out:
            out.pop()
            handed = gate.done()
            if handed is not None:
                # the most urgent waiting, oldest first
                assert waiting[handed] == min(waiting.values())
                assert handed == min(t for t, u in waiting.items() if u == waiting[handed])
                del waiting[handed]
                out.add(handed)
        elif op == "withdraw" and waiting:
            gone = max(waiting)
            gate.withdraw(gone)
            del waiting[gone]
        assert gate.out == len(out) <= limit
        assert gate.waiting == len(waiting)
        assert not waiting or gate.out == limit


def test_a_turn_waits_until_the_callers_deadline_and_at_least_one_request_timeout() -> None:
    assert turn_wait(30.0, 2.0, now=100.0) == 30.0  # no caller's deadline: the limit
    with caller_deadline(105.0):
        assert turn_wait(30.0, 2.0, now=100.0) == 5.0  # the caller's wait comes first
        assert turn_wait(30.0, 2.0, now=104.5) == 2.0  # little left: one request's timeout, its one try
        assert turn_wait(30.0, 2.0, now=110.0) == 2.0  # (past it: the same)
        assert turn_wait(3.0, 2.0, now=100.0) == 3.0  # the limit, if it comes first
        with caller_deadline(None):
            assert turn_wait(30.0, 2.0, now=100.0) == 30.0  # a caller that waits for ever
        assert turn_wait(30.0, 2.0, now=100.0) == 5.0  # (restored on the way out)
    assert turn_wait(30.0, 2.0, now=100.0) == 30.0


def test_a_background_clean_up_is_not_bound_by_its_callers_deadline() -> None:
    import contextvars

    def clean_up() -> float:
        no_caller_deadline()
        return turn_wait(30.0, 2.0, now=100.0)

    with caller_deadline(101.0):
        assert contextvars.copy_context().run(clean_up) == 30.0  # (a task's own copy of the caller's context)
        assert turn_wait(30.0, 2.0, now=100.0) == 2.0  # the caller's own is untouched


def test_the_undo_of_a_cancelled_asyncio_request_is_not_bound_by_its_callers_deadline() -> None:
    """A cancelled acquire's give-back (`undo_if_interrupted`'s undo) runs in the background after its caller
    left: it must not inherit the caller's deadline, or its wait for a connection would end at once."""
    import asyncio

    from fencelock._async import _concurrency

    seen: list[float] = []

    async def main() -> None:
        undone = asyncio.Event()

        async def request() -> None:
            await asyncio.sleep(0.05)

        async def undo() -> None:
            seen.append(turn_wait(30.0, 2.0, now=100.0))
            undone.set()

        async def caller() -> None:
            with caller_deadline(101.0):
                await _concurrency.undo_if_interrupted(request, undo, lambda: None)

        task = asyncio.ensure_future(caller())
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.wait_for(undone.wait(), 5.0)

    asyncio.run(main())
    assert seen == [30.0]


def test_the_undo_of_an_interrupted_sync_request_is_not_bound_by_its_callers_deadline() -> None:
    from fencelock._sync import _concurrency

    seen: list[float] = []

    def request() -> None:
        raise KeyboardInterrupt

    def undo() -> None:
        seen.append(turn_wait(30.0, 2.0, now=100.0))

    with caller_deadline(101.0):
        try:
            _concurrency.undo_if_interrupted(request, undo, lambda: None)
        except KeyboardInterrupt:
            pass
        assert turn_wait(30.0, 2.0, now=100.0) == 2.0  # the caller's own is untouched
    assert seen == [30.0]
