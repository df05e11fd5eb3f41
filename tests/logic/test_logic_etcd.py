"""The etcd backend's pure decisions (`fencelock._etcd.rules`, `.url`): URLs, keys, the TTL mapping, answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencelock._etcd.rules import (
    Kv,
    Settle,
    Verdict,
    fence_key,
    granted,
    keepalive_suffices,
    lease_seconds,
    lease_too_long,
    lock_key,
    name_dir,
    name_of,
    range_end,
    released,
    retry_after,
    settle,
    verdict,
    version_risk,
)
from fencelock._etcd.url import DEFAULT_TIMEOUT, is_etcd_url, parse_etcd_url
from fencelock._logic.outcomes import Released


def test_one_endpoint_with_the_default_port() -> None:
    target = parse_etcd_url("etcd://127.0.0.1")
    assert target.endpoints == ("http://127.0.0.1:2379",)
    assert not target.tls
    assert target.timeout == DEFAULT_TIMEOUT
    assert target.username is None


def test_several_endpoints_tls_options_and_credentials() -> None:
    target = parse_etcd_url("etcds://root:s%3Acret@h1:2379,h2:23790,[::1]:2381/?timeout=0.5&ssl_ca_certs=/ca.pem"
                            "&ssl_certfile=/c.pem&ssl_keyfile=/k.pem")
    assert target.endpoints == ("https://h1:2379", "https://h2:23790", "https://[::1]:2381")
    assert target.tls
    assert (target.username, target.password) == ("root", "s:cret")
    assert target.timeout == 0.5
    assert (target.ssl_ca_certs, target.ssl_certfile, target.ssl_keyfile) == ("/ca.pem", "/c.pem", "/k.pem")
    assert "s:cret" not in repr(target)
    assert "s%3Acret" not in target.shown
    assert target.shown == "etcds://root:***@h1:2379,h2:23790,[::1]:2381"


@pytest.mark.parametrize(("url", "why"), [
    ("etcd://", "no host"),
    ("etcd://h:0", "port 0"),
    ("etcd://h:70000", "port 70000"),
    ("etcd://h:abc", "not host[:port]"),
    ("etcd://h:", "empty port"),
    ("etcd://h1:2379,h1:2379", "listed twice"),
    ("etcd://h/some/path", "path"),
    ("etcd://h?bogus=1", "unknown option 'bogus'"),
    ("etcd://h?timeout=0", "from 0.001"), ("etcd://h?timeout=1&timeout=2", "given twice"),
    ("etcd://h?timeout=nan", "from 0.001"),
    ("etcd://h?timeout=x", "number of seconds"),
    ("etcd://h?ssl_ca_certs=/ca.pem", "needs etcds://"),
    ("etcd://user@h", "both a user and a password"),
    ("http://h:2379", "scheme"),
])
def test_bad_urls_say_what_is_wrong(url: str, why: str) -> None:
    with pytest.raises(ValueError, match="etcd URL") as info:
        parse_etcd_url(url)
    assert why in str(info.value)


def test_a_bad_url_never_shows_its_password() -> None:
    for url in ("etcd://root:hunter2@h:0", "etcd://root:hunter2@h?bogus=1", "etcd://root:hunter2@", "xx://a:hunter2@h"):
        with pytest.raises(ValueError, match="URL") as info:
            parse_etcd_url(url)
        assert "hunter2" not in str(info.value)


def test_only_etcd_schemes_are_etcd_urls() -> None:
    assert is_etcd_url("etcd://h")
    assert is_etcd_url("ETCDS://h")
    assert not is_etcd_url("redis://h")
    assert not is_etcd_url(["etcd://h"])
    assert not is_etcd_url(None)


def test_lease_ttl_is_whole_seconds_rounded_up() -> None:
    assert lease_seconds(10) == 1
    assert lease_seconds(1000) == 1
    assert lease_seconds(1001) == 2
    assert lease_seconds(30_000) == 30


@given(st.integers(min_value=10, max_value=10**9))
def test_the_lease_never_ends_before_the_ttl_asked_for(ttl_ms: int) -> None:
    seconds = lease_seconds(ttl_ms)
    assert seconds * 1000 >= ttl_ms
    assert seconds * 1000 - ttl_ms < 1000


def test_a_keepalive_suffices_only_when_the_lease_is_long_enough() -> None:
    assert keepalive_suffices(2, 500)      # the server's minimum gave more than asked
    assert keepalive_suffices(30, 30_000)
    assert not keepalive_suffices(30, 30_001)  # a longer TTL needs a new lease


def test_an_extend_moves_down_only_from_a_lease_far_longer_than_the_new_ttl() -> None:
    assert not lease_too_long(8, 2_000)   # within OVERHANG_MAX: the key stays on its lease
    assert lease_too_long(9, 2_000)       # a holder that stops would block the lock 4.5 x its TTL
    assert lease_too_long(20, 2_000)
    assert not lease_too_long(1, 100)     # asked 1 s (the server may have raised it to its minimum)


@given(st.text(min_size=1, max_size=50))
def test_every_name_is_one_key_directory_and_comes_back(name: str) -> None:
    key = lock_key("fencelock", name, 0x1234)
    assert key.startswith(name_dir("fencelock", name))
    assert key.count(b"/") == 2
    assert name_of("fencelock", key) == name


def test_one_names_range_never_covers_another_name() -> None:
    directory = name_dir("fencelock", "a")
    end = range_end(directory)
    for other in ("a/b", "a%", "ab", "a0", "a/"):
        key = lock_key("fencelock", other, 1)
        assert not directory <= key < end, other
    assert directory <= lock_key("fencelock", "a", 2**63 - 1) < end


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_the_fence_record_is_in_no_names_queue(name: str, other: str) -> None:
    key = fence_key("fencelock", name)
    directory = name_dir("fencelock", other)
    assert not directory <= key < range_end(directory)
    assert name_of("fencelock", key) is None  # and listing locks never takes it for one


def test_range_end_is_etcds_prefix_rule() -> None:
    assert range_end(b"a/") == b"a0"
    assert range_end(b"a\xff") == b"b"
    assert range_end(b"\xff\xff") == b"\x00"


def test_keys_that_are_not_ours_have_no_name() -> None:
    assert name_of("fencelock", b"other/x/0000000000000001") is None
    assert name_of("fencelock", b"fencelock/x/not-a-lease") is None
    assert name_of("fencelock", b"fencelock//0000000000000001") is None


def test_a_grant_answer_gives_the_id_the_server_chose_and_at_least_the_ttl_asked() -> None:
    # The gateway sends 64-bit numbers as strings; the server may raise a TTL to its minimum, never lower it.
    assert granted({"ID": "7587883197476331266", "TTL": "2"}, 1) == (7587883197476331266, 2)
    assert granted({"ID": "12", "TTL": "5"}, 5) == (12, 5)
    assert granted({"ID": "12"}, 3) == (12, 3)
    # An answer that names no lease is not a lease (0 would mean "no lease" to every later request).
    assert granted({"TTL": "5"}, 5) is None
    assert granted({"ID": "0", "TTL": "5"}, 5) is None
    assert granted({"ID": "-4", "TTL": "5"}, 5) is None


def test_the_key_of_a_server_chosen_lease_id_names_its_lock() -> None:
    # etcd puts its member ID in the top bits of the IDs it chooses: 16 hex digits, up to 2**63 - 1.
    for lease in (1, 0x694D_8A2C_1F3B_0007, 2**63 - 1):
        assert name_of("fencelock", lock_key("fencelock", "a/b%c", lease)) == "a/b%c"


def _kv(rev: int, value: bytes = b"t") -> Kv:
    return Kv(b"k", rev, 7, value)


def test_granted_only_while_our_key_exists_and_is_the_oldest() -> None:
    assert verdict(_kv(5), b"t", _kv(5)) is Verdict.GRANTED
    assert verdict(_kv(5), b"t", _kv(3)) is Verdict.WAITING
    # Jepsen's etcd 3.4.3 finding: after a wait, a waiter whose key expired meanwhile must not count as holder.
    assert verdict(None, b"t", None) is Verdict.GONE
    assert verdict(None, b"t", _kv(9)) is Verdict.GONE
    assert verdict(_kv(5, b"other"), b"t", _kv(5)) is Verdict.GONE


def test_what_a_release_answer_means() -> None:
    assert released(True, 0) is Released.RELEASED
    assert released(False, 0) is Released.EXPIRED
    assert released(False, 2) is Released.TAKEN
    assert released(False, 2, sent_before=True) is Released.UNSURE  # maybe our own earlier, unanswered release
    assert released(True, 0, sent_before=True) is Released.RELEASED


def test_acquire_retries_once_per_endpoint_and_only_transient_faults() -> None:
    assert retry_after(1, True, 1) == 0.0
    assert retry_after(2, True, 1) is None
    assert [retry_after(n, True, 3) for n in (1, 2, 3, 4)] == [0.0, 0.5, 0.75, None]
    assert retry_after(1, False, 3) is None


@pytest.mark.parametrize(("version", "risky"), [
    ("3.4.23", True), ("3.4.30", True), ("3.4.31", False), ("3.4.40", False),
    ("3.5.0", True), ("3.5.12", True), ("3.5.13", False), ("3.6.0", False), ("3.7.1", False),
    ("3.3.27", True), ("3.4.23-debian", True), (None, False), ("", False), ("unknown", False),
])
def test_which_etcd_versions_may_revoke_live_leases_after_a_leader_pause(version: str | None, risky: bool) -> None:
    risk = version_risk(version)
    assert (risk is not None) is risky
    if risk is not None:
        assert "etcd-io/etcd#15247" in risk
        assert "3.4.31" in risk
        assert "3.5.13" in risk


def test_a_move_is_settled_only_by_a_key_on_the_new_lease_or_past_the_moves_version() -> None:
    """A move from lease 1 to lease 2, sent at version 3, whose answer never came: the key on lease 2 says it landed;
    on lease 1 at version 3 it may yet land (UNDECIDED: void it first); on lease 1 at version 4 a put again won and
    it never can; anything else is a key lost."""
    def kv(lease: int, version: int, value: bytes = b"t", rev: int = 5) -> Kv:
        return Kv(b"k", rev, lease, value, version)

    assert settle(kv(2, 4), b"t", 5, old=1, new=2, version=3) is Settle.MOVED
    assert settle(kv(1, 3), b"t", 5, old=1, new=2, version=3) is Settle.UNDECIDED
    assert settle(kv(1, 4), b"t", 5, old=1, new=2, version=3) is Settle.STAYED
    assert settle(None, b"t", 5, old=1, new=2, version=3) is Settle.GONE
    assert settle(kv(1, 3, value=b"x"), b"t", 5, old=1, new=2, version=3) is Settle.GONE
    assert settle(kv(1, 3, rev=6), b"t", 5, old=1, new=2, version=3) is Settle.GONE
    assert settle(kv(9, 4), b"t", 5, old=1, new=2, version=3) is Settle.GONE
