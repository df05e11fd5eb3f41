"""ZooKeeper's pure decisions (`fencelock._zk.rules`, `fencelock._zk.url`), without any server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencelock._zk.rules import (
    Child,
    Position,
    Session,
    child_name,
    decode_lease,
    decode_name,
    decode_number,
    encode_lease,
    encode_name,
    encode_number,
    find_own,
    handshake_limit,
    lease_remaining,
    may_return,
    parse_child,
    position,
    queue,
    reconnect_every,
    reconnect_wait,
    renewal_answer,
    retry_after,
    session_timeout_ms,
    session_too_long,
    ttl_fits,
)
from fencelock._zk.url import DEFAULT_PORT, DEFAULT_TIMEOUT, parse_zookeeper_url


def test_urls_give_hosts_chroot_and_timeout() -> None:
    target = parse_zookeeper_url("zookeeper://a:1,b,[::1]:3/x/y?timeout=0.5")
    assert target.hosts == (("a", 1), ("b", DEFAULT_PORT), ("::1", 3))
    assert target.hosts_string == "a:1,b:2181,[::1]:3"
    assert target.chroot == "/x/y"
    assert target.timeout == 0.5
    plain = parse_zookeeper_url("ZooKeeper://127.0.0.1:2181/")
    assert (plain.chroot, plain.timeout) == ("", DEFAULT_TIMEOUT)


def test_a_url_with_credentials_never_shows_them() -> None:
    with pytest.raises(ValueError, match="credentials") as info:
        parse_zookeeper_url("zookeeper://user:hunter2@h:2181/x")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(("url", "why"), [("zookeeper://h?timeout=1&timeout=2", "given twice"),
                                          ("zookeeper://h?timeout=0.0001", "from 0.001")])
def test_a_timeout_given_twice_or_too_short_to_answer_is_refused(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_zookeeper_url(url)


def test_a_non_str_url_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="url must be a str"):
        parse_zookeeper_url(b"zookeeper://h")


@given(st.text(min_size=1, max_size=50))
def test_any_name_is_one_path_component_and_comes_back(name: str) -> None:
    component = encode_name(name)
    assert "/" not in component
    assert component not in (".", "..")
    assert all(0x20 <= ord(c) < 0x7F for c in component)
    assert decode_name(component) == name


def test_names_that_differ_give_different_components() -> None:
    names = ["a/b", "a%2Fb", "a.b", "a%2Eb", ".", "..", "A/B"]
    assert len({encode_name(n) for n in names}) == len(names)


def test_the_queue_is_ordered_by_sequence_number_not_by_name() -> None:
    children = ["ffff-0000000002", "0000-0000000010", "aaaa-0000000001", "not-ours", "x-12", "-0000000003"]
    assert queue(children) == [Child(1, "aaaa"), Child(2, "ffff"), Child(10, "0000")]
    assert child_name(Child(2, "ffff")) == "ffff-0000000002"
    assert parse_child("a-b-0000000007") == Child(7, "a-b")


def test_each_waiter_watches_only_the_node_just_before_it() -> None:
    children = ["c-0000000005", "a-0000000001", "b-0000000003"]
    assert position(children, "a") == (Position.HOLDER, None)
    assert position(children, "b") == (Position.WAITING, Child(1, "a"))
    assert position(children, "c") == (Position.WAITING, Child(3, "b"))
    assert position(children, "d") == (Position.GONE, None)
    assert find_own(children, "b") == Child(3, "b")
    assert find_own(children, "z") is None


@given(st.integers(min_value=1, max_value=10**8))
def test_a_session_outlives_its_ttl_by_at_most_one_step(ttl_ms: int) -> None:
    timeout = session_timeout_ms(ttl_ms)
    assert ttl_ms <= timeout <= ttl_ms * 2 ** 0.25 + 1
    assert session_timeout_ms(timeout) == timeout  # a step maps to itself: TTLs of one step share a session


def test_few_sessions_serve_many_ttls() -> None:
    # from 1 s to 60 s: the steps 2^(40/4) ms ... 2^(64/4) ms, 25 sessions at most
    assert len({session_timeout_ms(ms) for ms in range(1000, 60_001, 100)}) == 25
    assert session_timeout_ms(30_000) == session_timeout_ms(29_000) == 32_768


def test_ttls_below_the_servers_minimum_share_its_session() -> None:
    assert {session_timeout_ms(ms, 2000) for ms in (10, 500, 1999, 2000)} == {2000}
    assert session_timeout_ms(2001, 2000) == session_timeout_ms(2001)


def test_bad_ttl_for_a_session_is_refused() -> None:
    with pytest.raises(ValueError, match="ttl_ms"):
        session_timeout_ms(0)


def test_an_extend_moves_a_node_down_only_from_a_session_far_longer_than_the_new_ttls() -> None:
    assert not session_too_long(2_000, 5_793, None)   # under OVERHANG_MAX x the 2 s TTL's own session (2048 ms)
    assert session_too_long(2_000, 23_171, None)      # a dead holder would block the lock ten times its TTL
    assert not session_too_long(1_000, 4_000, 4_000)  # the server's minimum: every short TTL shares that session


def test_a_ttl_fits_only_a_session_at_least_as_long() -> None:
    assert ttl_fits(30_000, 32_768)
    assert ttl_fits(30_000, 30_000)
    assert not ttl_fits(30_000, 20_000)  # the server lowered it to maxSessionTimeout


@pytest.mark.parametrize(("state", "exists", "answer"), [
    (Session.CONNECTED, True, True),
    (Session.CONNECTED, False, False),   # deleted behind our back
    (Session.CONNECTED, None, None),     # no answer: try again
    (Session.SUSPENDED, None, None),     # the session may live: lost only when the validity runs out
    (Session.SUSPENDED, True, True),     # the answer came before the drop
    (Session.LOST, None, False),         # expired: every node of the session is gone
    (Session.LOST, True, False),
])
def test_what_a_renewal_reports(state: Session, exists: bool | None, answer: bool | None) -> None:
    assert renewal_answer(state, exists) is answer


def test_nodes_carry_numbers_and_ignore_what_is_not_ours() -> None:
    assert decode_number(encode_number(30_000)) == 30_000
    assert decode_number(b"") is None
    assert decode_number(None) is None
    assert decode_number(b"not a number") is None


@given(st.integers(1, 2**40), st.one_of(st.none(), st.integers(1, 2**63)))
def test_a_lease_node_carries_its_ttl_and_once_moved_its_fence(ttl: int, fence: int | None) -> None:
    assert decode_lease(encode_lease(ttl, fence)) == (ttl, fence)


def test_a_lease_node_fencelock_did_not_write_carries_nothing() -> None:
    assert encode_lease(30_000) == encode_number(30_000)  # an unmoved node: as before moves existed
    assert decode_lease(None) == (None, None)
    assert decode_lease(b"garbage") == (None, None)
    assert decode_lease(b"5000 x") == (5000, None)


def test_a_holders_remaining_time_counts_from_its_nodes_last_write() -> None:
    assert lease_remaining(30_000, 1_000_000, 1_010_000.0) == 20.0
    assert lease_remaining(30_000, 1_000_000, 1_040_000.0) == 0.0   # ran out: never negative
    assert lease_remaining(None, 1_000_000, 1_000_000.0) is None     # a node fencelock did not write


def test_each_member_gets_a_share_of_the_timeout_to_answer_a_handshake() -> None:
    assert handshake_limit(2.0, 1) == 2.0
    assert handshake_limit(2.0, 4) == 0.5   # three hung members tried first: the fourth still has 0.5 s
    assert 3 * handshake_limit(1.0, 3) <= 1.0


def test_an_acquire_retries_only_transient_faults_with_a_back_off() -> None:
    assert retry_after(1, False) is None
    assert [retry_after(n, True) for n in (1, 2, 3, 4, 5, 6)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert retry_after(10_000, True) == 1.0   # the wait deadline, not a count, ends the tries


def test_a_fault_is_worth_waiting_out_while_the_server_keeps_the_session() -> None:
    assert may_return(True, None, 100.0, 2000)           # connected again: try at once
    assert may_return(False, 99.0, 100.0, 2000)          # down for 1 s of a 2 s session
    assert not may_return(False, 97.0, 100.0, 2000)      # down longer than the session lives: an outage
    assert not may_return(False, None, 100.0, 2000)      # never connected: the first connection's own timeout


def test_an_attempt_waits_for_its_session_one_request_timeout_and_never_past_the_sessions_own() -> None:
    assert reconnect_wait(2.0, 99.9, 100.0, 10_000) == 2.0     # dropped a moment ago: as long as one request
    assert reconnect_wait(2.0, 99.0, 100.0, 1_500) == 0.5      # the session's timeout ends first: an outage then
    assert reconnect_wait(2.0, 90.0, 100.0, 2_000) == 0.0      # down longer than the session lives: no wait
    assert reconnect_wait(2.0, None, 100.0, 2_000) == 2.0      # kazoo dropped it, the listener has not said so yet
    assert reconnect_wait(2.0, 99.9, 100.0, 10_000, silent=True) == 0.0  # a silent member already cost a timeout
    assert reconnect_every(0.25) == 0.125  # kazoo tries again twice within one attempt's wait for it...
    assert reconnect_every(10.0) == 1.0    # ...and never less often than once a second
