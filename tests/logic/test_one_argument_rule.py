"""`lock()` and `acquire()` apply one argument rule (`_logic.args.check_acquire`), at the call, in both trees.

The backend here is a stand-in that records any request: bad input must be refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from fencelock._async.client import AsyncLocks
from fencelock._logic.args import check_acquire
from fencelock._sync.client import Locks

NAME = "job:7"

BAD: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("fair", {"fair": "yes"}, TypeError),
    ("fair", {"fair": 1}, TypeError),
    ("fair", {"fair": True}, ValueError),  # a service that cannot queue fairly
    ("ttl", {"ttl": 1e300}, ValueError),
    ("ttl", {"ttl": True}, TypeError),
    ("wait", {"wait": math.nan}, ValueError),
    ("wait", {"wait": -1}, ValueError),
    ("renew", {"ttl": 10, "renew": 6}, ValueError),
    ("renew", {"renew": "yes"}, TypeError),
    ("on_lost", {"on_lost": "print"}, TypeError),
]


class Untouched:
    """A lock service that must never be asked anything."""

    shown = "a stand-in service"
    block_cap = 1.0
    supports_fair = False
    always_queues = False

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        self.asked.append(attr)
        raise AssertionError(f"the backend was asked for {attr} before the arguments were checked")


def _refusal(call: Any) -> Exception:
    try:
        result = call()
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    except (TypeError, ValueError) as exc:
        return exc
    raise AssertionError("the bad argument was taken")


@pytest.mark.parametrize(("arg", "kwargs", "kind"), BAD, ids=[f"{a}-{k}" for a, k, _ in BAD])
def test_lock_refuses_at_the_call_what_acquire_refuses_with_the_same_error(
        arg: str, kwargs: dict[str, Any], kind: type[Exception]) -> None:
    backend = Untouched()
    refusals = [
        _refusal(lambda: Locks(backend).acquire(NAME, **kwargs)),
        _refusal(lambda: Locks(backend).lock(NAME, **kwargs)),
        _refusal(lambda: AsyncLocks(backend).acquire(NAME, **kwargs)),
        _refusal(lambda: AsyncLocks(backend).lock(NAME, **kwargs)),
    ]
    for exc in refusals:
        assert type(exc) is kind, f"{type(exc).__name__}: {exc}"
        assert arg in str(exc)
        assert repr(NAME) in str(exc)
    assert len({str(exc) for exc in refusals}) == 1  # one rule, one message
    assert backend.asked == []


def test_cancel_on_lost_is_part_of_the_same_rule() -> None:
    with pytest.raises(TypeError, match=r"cancel_on_lost must be True or False.*'job:7'"):
        check_acquire(NAME, 30.0, 1.0, True, None, False, cancel_on_lost="no", supports_fair=True, where="x")
    with pytest.raises(TypeError, match="cancel_on_lost"):
        Locks(Untouched()).lock(NAME, cancel_on_lost="no")  # type: ignore[arg-type]
    args = check_acquire(NAME, 30, None, True, None, True, supports_fair=True, where="x")
    assert (args.ttl, args.wait, args.renew_every, args.fair, args.cancel_on_lost) == (30.0, None, 10.0, True, True)
