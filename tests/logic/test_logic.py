"""Pure decisions, tested without any server: argument checks, time rules, key naming, fencing, URLs."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

import fencelock._logic.fencing as fencing
from fencelock._logic.args import MIN_TTL, check_name, check_ttl, check_wait, ttl_ms
from fencelock._logic.outcomes import Released, State, after_release
from fencelock._logic.timing import MAX_BLOCK_SHARE, Deadline, backoff, block_for, drift, validity_end
from fencelock._logic.urls import parse_redis_url, redact
from fencelock._redis.keys import decode_name, encode_name, redis_keys


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- arguments ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ttl", [0, 0.0, -1, MIN_TTL / 2, math.nan, math.inf, -math.inf])
def test_bad_ttl_values_are_value_errors_naming_ttl_and_lock(ttl: float) -> None:
    with pytest.raises(ValueError, match=r"ttl .*lock 'orders:42'"):
        check_ttl(ttl, "orders:42")


@pytest.mark.parametrize("ttl", [True, False, "5", None, b"5", [5]])
def test_non_number_ttls_are_type_errors(ttl: object) -> None:
    with pytest.raises(TypeError, match=r"ttl must be a number of seconds.*lock 'n'"):
        check_ttl(ttl, "n")


def test_ttl_is_rounded_up_to_whole_milliseconds() -> None:
    assert ttl_ms(0.0101) == 11  # never truncated: the server must not expire before our validity says
    assert ttl_ms(30.0) == 30000
    assert check_ttl(2, "n") == 2.0


@pytest.mark.parametrize(("wait", "expected"), [(None, None), (0, 0.0), (1.5, 1.5), (math.inf, None)])
def test_wait_values(wait: float | None, expected: float | None) -> None:
    assert check_wait(wait, "n") == expected


@pytest.mark.parametrize("wait", [-0.001, -1, math.nan])
def test_bad_wait_values(wait: float) -> None:
    with pytest.raises(ValueError, match="wait"):
        check_wait(wait, "n")


@pytest.mark.parametrize("wait", [True, "1"])
def test_non_number_waits(wait: object) -> None:
    with pytest.raises(TypeError, match="wait"):
        check_wait(wait, "n")


@pytest.mark.parametrize(("name", "error"), [("", ValueError), (None, TypeError), (5, TypeError),
                                             (b"x", TypeError), ("x" * 1025, ValueError)])
def test_bad_names(name: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="name"):
        check_name(name)


# -- time -----------------------------------------------------------------------------------------------------

def test_deadline_is_set_once_and_never_rearmed() -> None:
    clock = FakeClock()
    deadline = Deadline.after(1.0, clock())
    clock.now += 0.4
    assert deadline.remaining(clock()) == pytest.approx(0.6)
    clock.now += 0.6
    assert deadline.expired(clock())
    assert deadline.remaining(clock()) == 0.0
    assert not Deadline.after(None, clock()).expired(clock.now + 1e9)


def test_validity_is_ttl_minus_elapsed_minus_drift_counted_from_before_the_send() -> None:
    assert drift(30.0) == pytest.approx(0.302)
    assert validity_end(30.0, sent_at=100.0) == pytest.approx(100.0 + 30.0 - 0.302)


@given(st.floats(0.0, 100.0), st.floats(0.0, 100.0), st.none() | st.floats(-1.0, 100.0), st.floats(0.01, 5.0),
       st.floats(0.01, 100.0))
def test_a_waiter_never_blocks_past_deadline_holder_expiry_cap_or_a_share_of_its_ttl(
        wait: float, elapsed: float, holder_ttl: float | None, cap: float, ttl: float) -> None:
    deadline = Deadline.after(wait, 0.0)
    limit = block_for(deadline, elapsed, holder_ttl, cap, ttl)
    assert 0.0 <= limit <= cap
    assert limit <= ttl * MAX_BLOCK_SHARE
    assert limit <= deadline.remaining(elapsed)
    if holder_ttl is not None:
        assert limit <= max(holder_ttl, 0.0)


def test_backoff_is_jittered_and_capped() -> None:
    rng = random.Random(7)
    delays = [backoff(n, rng) for n in range(40)]
    assert all(0.0 <= d <= 0.2 for d in delays)
    assert len(set(delays)) == len(delays)


# -- keys -----------------------------------------------------------------------------------------------------

@given(st.text(min_size=1, max_size=50))
def test_all_keys_of_a_name_share_one_hash_slot_and_the_name_round_trips(name: str) -> None:
    keys = redis_keys(name)
    assert len({key_slot(key.encode()) for key in keys}) == 1
    assert decode_name(encode_name(name)) == name


def test_braces_in_names_cannot_move_the_hash_tag() -> None:
    keys = redis_keys("}a{b}")
    assert keys.lock == "fencelock:{%7Da%7Bb%7D}:lock"
    assert redis_keys("a").lock == "fencelock:{a}:lock"


# -- fencing and outcomes -------------------------------------------------------------------------------------

def test_fencing_rule() -> None:
    assert fencing.accepts(1, None)
    assert fencing.accepts(5, 5)          # the same holder may write again
    assert fencing.accepts(6, 5)
    assert not fencing.accepts(4, 5)      # a stale holder


def test_release_outcomes() -> None:
    assert after_release(Released.RELEASED, None, 10.0) is State.RELEASED
    assert after_release(Released.EXPIRED, None, 10.0) is State.LOST
    assert after_release(Released.TAKEN, None, 10.0) is State.LOST
    # An earlier release got no reply: if it was sent in time, the key gone or another's is its doing (it deleted
    # our key, and a waiter took the lock since): released (decision 2026-12-05-release-retried-with-a-waiter).
    assert after_release(Released.EXPIRED, 9.0, 10.0) is State.RELEASED
    assert after_release(Released.TAKEN, 9.0, 10.0) is State.RELEASED
    assert after_release(Released.UNSURE, 9.0, 10.0) is State.RELEASED
    # Sent after the validity ended: the key may have expired (and been taken) before it landed.
    assert after_release(Released.EXPIRED, 11.0, 10.0) is State.LOST
    assert after_release(Released.TAKEN, 11.0, 10.0) is State.LOST
    assert after_release(Released.TAKEN, 10.0, 10.0) is State.LOST


# -- URLs -----------------------------------------------------------------------------------------------------

def test_urls() -> None:
    target = parse_redis_url("rediss://app:s3cret@cache.example:6380/2?socket_timeout=0.5")
    assert not target.cluster
    assert target.options == {"socket_timeout": 0.5}
    assert target.url == "rediss://app:s3cret@cache.example:6380/2"
    assert "s3cret" not in target.shown
    cluster = parse_redis_url("redis+cluster://127.0.0.1:7000")
    assert cluster.cluster
    assert cluster.url == "redis://127.0.0.1:7000"


@pytest.mark.parametrize("url", ["http://h", "redis://", "redis://h:99999", "redis://h:0", "redis://h/abc",
                                 "redis://h?bogus=1", "redis://h?socket_timeout=-1", "redis+cluster://h/1",
                                 "unix://", "redis://:pw@[::1"])
def test_malformed_urls_are_value_errors_that_hide_the_password(url: str) -> None:
    with pytest.raises(ValueError, match="url") as info:
        parse_redis_url(url.replace("redis://h", "redis://u:hunter2@h"))
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(("url", "why"), [
    ("redis://h/2147483648", "database must be a number from 0 to 2147483647"),
    ("redis://h/\u00b2", "database must be a number"),
    ("unix:///s.sock?db=-1", "database must be a number"),
    ("unix:///s.sock?db=abc", "database must be a number"),
    ("redis://h/1?db=2", "database is given twice"),
    ("redis://h?db=1&db=1", "option db is given twice"),
    ("redis+cluster://h?db=3", "Cluster has only database 0"),
    ("redis://h?protocol=4", "protocol must be 2 or 3"),
    ("rediss://h?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of"),
    ("rediss://h?ssl_check_hostname=perhaps", "ssl_check_hostname must be true or false"),
    ("redis://h?client_name=a%20b", "client_name must be printable ASCII"),
    ("redis://h?ssl_ca_certs=/ca.pem", "needs rediss://"),
    ("redis://h?timeout=2", "takes socket_timeout"),
])
def test_redis_url_values_the_server_or_client_cannot_take_are_refused_by_name(url: str, why: str) -> None:
    """Refused before anything is sent, naming the option: redis-py would pass these on and fail later, or not at
    all (a TLS option on redis:// is silently plain text)."""
    with pytest.raises(ValueError, match=why):
        parse_redis_url(url.replace("://h", "://u:hunter2@h"))


def test_redis_url_values_at_their_bounds_are_taken() -> None:
    assert parse_redis_url("redis://h/2147483647").url == "redis://h/2147483647"
    target = parse_redis_url("rediss://h?protocol=3&ssl_cert_reqs=none&ssl_check_hostname=false&client_name=w-1")
    assert "client_name=w-1" in target.url


def test_redact() -> None:
    assert redact("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    assert redact("redis://h:1/0") == "redis://h:1/0"
