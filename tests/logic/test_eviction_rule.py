"""The eviction rule, without a server: which `{maxmemory, policy}` answers mean a held lock may be evicted."""

from __future__ import annotations

from typing import Any

import pytest

from fencelock._redis.eviction import eviction_risk


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu",
                                    "volatile-random", "volatile-ttl"])
def test_every_policy_but_noeviction_with_a_limit_may_evict_a_held_lock(policy: str) -> None:
    """Lock keys all have a TTL: `volatile-*` may pick them as `allkeys-*` may."""
    risk = eviction_risk([1024, policy.encode()])
    assert risk is not None
    assert f"maxmemory 1024 bytes, maxmemory-policy {policy}" in risk
    assert "set maxmemory-policy noeviction" in risk


@pytest.mark.parametrize("reply", [[0, b"allkeys-lru"], [1024, b"noeviction"], [1024, "noeviction"]])
def test_no_limit_or_noeviction_never_evicts(reply: list[Any]) -> None:
    assert eviction_risk(reply) is None


@pytest.mark.parametrize("reply", [None, [], [b"x", b"allkeys-lru"], Exception("NOPERM")])
def test_an_answer_that_is_not_one_is_not_reported(reply: Any) -> None:
    """A refused or odd answer says nothing about the server: no report (the check never fails a grant)."""
    assert eviction_risk(reply) is None
