"""The invariant checker's own rules, on hand-made histories (pure: no server)."""

from __future__ import annotations

import fencelock
from fencelock.testing.invariants import History, LeaseRecord, Op, Sample, check

TTL = 1.0


def _history() -> History:
    history = History()
    record = LeaseRecord("job", "t" * 32, TTL, renewing=False, client="client", acquired_at=10.0)
    history.leases.append(record)
    history.ops.append(Op("acquire", "job", record, start=9.99, ttl=TTL, end=10.0))
    return history


def _sample(kept_ms: list[int | None]) -> Sample:
    """Five nodes seen at t=10.5: the first len(kept_ms) keep the token for that many ms, the rest hold nothing."""
    tokens = tuple(("t" * 32 if i < len(kept_ms) else None) for i in range(5))
    pttls = tuple((kept_ms[i] if i < len(kept_ms) else -2) for i in range(5))
    return Sample("job", 10.5, 10.501, tokens, pttls)


def test_a_key_past_its_ttl_is_reported() -> None:
    # the TTL ends at 11.0; a key kept until 11.1 on a single node outlives it
    assert any("outlives its TTL" in line for line in check(_history(), [_sample([600])]))


def test_a_minority_straggler_is_allowed_up_to_straggle() -> None:
    # 3 of 5 nodes keep the key until its TTL, 2 keep it 0.1 s longer (their request came after the quorum)
    sample = _sample([500, 500, 500, 600, 600])
    assert check(_history(), [sample], quorum=3, straggle=0.25) == []
    assert any("outlives its TTL" in line for line in check(_history(), [sample], quorum=3, straggle=0.05))


def test_a_quorum_past_its_ttl_is_reported_whatever_the_straggle() -> None:
    sample = _sample([600, 600, 600, 500, 500])
    assert any("outlives its TTL" in line for line in check(_history(), [sample], quorum=3, straggle=0.25))


def test_a_call_that_raised_may_have_its_requests_land_up_to_straggle_later_on_a_quorum() -> None:
    # an extend that gave up at 10.2 (no quorum answer in time): its requests still land, by 10.3, on 3 of 5 nodes
    history = _history()
    record = history.leases[0]
    history.ops.append(Op("extend", "job", record, start=10.05, ttl=TTL, end=10.2,
                          error=fencelock.BackendError("no quorum answered in time", name="job")))
    sample = _sample([800, 800, 800, 500, 500])  # kept until 11.3
    assert check(history, [sample], quorum=3, straggle=0.25) == []
    assert any("outlives its TTL" in line for line in check(history, [sample], quorum=3, straggle=0.05))
    history.ops[-1].error = None  # a call that returned had its quorum by its end: no straggle for the quorum
    assert any("outlives its TTL" in line for line in check(history, [sample], quorum=3, straggle=0.25))
