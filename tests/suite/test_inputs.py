"""Bad input is refused at every public entry point, before anything is sent, by a TypeError or ValueError that
names the argument (and the lock, where there is one); the CLI exits 2 for it.

A table of bad values (numbers the server cannot take or that make no sense, NaN, infinities, bools where
numbers go, names UTF-8 cannot encode, guard values of the wrong type, Redlock "nodes" that are one server)
crossed with the entry points: sync and asyncio `acquire`, `lock`, `extend`, the operators' requests, the guard,
`connect` and the CLI. The server is a real Redis of the test's own; its slow log, which logs every command and
is reset before each case, shows that no command of the client under test reached it. (An earlier case's client
may still send its one background eviction check, after its first grant: that script is not counted.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._cli.commands import run_cli
from fencelock._scripts import EVICTION
from fencelock.testing.servers import RedisServer, free_port
from tests.conftest import _require_server_binary

NAME = "inputs:job"
NAN, INF = float("nan"), float("inf")
SURROGATE = "bad\ud800name"
HUGE = 10**400  # an int too large for a float: float() raises OverflowError, which must never escape
HUGER = 10**5000  # ... and too long for str() to print


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    _require_server_binary()
    logged = ["--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"]
    with RedisServer(name="inputs", extra_args=logged) as running:
        yield running


def _counter(admin: Any) -> Callable[[], list[str]]:
    """Reset the server's slow log; the callable returns the commands it logged since, except the test's own
    (CONFIG, INFO, SLOWLOG) and an earlier client's eviction check."""
    admin.slowlog_reset()
    ours = (b"CONFIG", b"INFO", b"SLOWLOG")
    check = (b"EVALSHA " + EVICTION.sha.encode(), b"EVAL " + EVICTION.source.encode()[:20])

    def sent() -> list[str]:
        entries: Any = admin.slowlog_get(100000)
        commands = [bytes(entry["command"]) for entry in entries]
        return [c.decode(errors="replace") for c in commands if not c.upper().startswith(ours)
                and not c.startswith(check)]

    return sent


@pytest.fixture
def quiet(server: RedisServer) -> Iterator[Callable[[], list[str]]]:
    """The commands sent since this test began (`_counter`)."""
    admin: Any = server.client()
    yield _counter(admin)
    admin.close()


# (case id, call on a sync Locks, error type, argument the message must name, whether the lock name is known)
Call = Callable[[Any], Any]
LOCK_CASES: list[tuple[str, Call, type[Exception], str, bool]] = [
    ("ttl-1e300", lambda lk: lk.acquire(NAME, ttl=1e300), ValueError, "ttl", True),
    ("ttl-ms-over-lua", lambda lk: lk.acquire(NAME, ttl=2.0**53), ValueError, "ttl", True),
    ("ttl-eleven-years", lambda lk: lk.acquire(NAME, ttl=11 * 365 * 86400.0), ValueError, "ttl", True),
    ("ttl-nan", lambda lk: lk.acquire(NAME, ttl=NAN), ValueError, "ttl", True),
    ("ttl-inf", lambda lk: lk.acquire(NAME, ttl=INF), ValueError, "ttl", True),
    ("ttl-tiny", lambda lk: lk.acquire(NAME, ttl=0.001), ValueError, "ttl", True),
    ("ttl-bool", lambda lk: lk.acquire(NAME, ttl=True), TypeError, "ttl", True),
    ("ttl-str", lambda lk: lk.acquire(NAME, ttl="5"), TypeError, "ttl", True),
    ("wait-1e300", lambda lk: lk.acquire(NAME, wait=1e300), ValueError, "wait", True),
    ("wait-nan", lambda lk: lk.acquire(NAME, wait=NAN), ValueError, "wait", True),
    ("wait-negative", lambda lk: lk.acquire(NAME, wait=-1), ValueError, "wait", True),
    ("wait-minus-inf", lambda lk: lk.acquire(NAME, wait=-INF), ValueError, "wait", True),
    ("wait-bool", lambda lk: lk.acquire(NAME, wait=False), TypeError, "wait", True),
    ("renew-tiny", lambda lk: lk.acquire(NAME, renew=1e-9), ValueError, "renew", True),
    ("renew-nan", lambda lk: lk.acquire(NAME, renew=NAN), ValueError, "renew", True),
    ("renew-over-half", lambda lk: lk.acquire(NAME, ttl=10, renew=6), ValueError, "renew", True),
    ("renew-str", lambda lk: lk.acquire(NAME, renew="yes"), TypeError, "renew", True),
    ("ttl-huge-int", lambda lk: lk.acquire(NAME, ttl=HUGE), ValueError, "ttl", True),
    ("ttl-huger-int", lambda lk: lk.acquire(NAME, ttl=-HUGER), ValueError, "ttl", True),
    ("wait-huge-int", lambda lk: lk.acquire(NAME, wait=HUGE), ValueError, "wait", True),
    ("renew-huge-int", lambda lk: lk.acquire(NAME, renew=HUGE), ValueError, "renew", True),
    ("lock-ttl-huge-int", lambda lk: lk.lock(NAME, ttl=HUGE), ValueError, "ttl", True),
    ("lock-wait-huger-int", lambda lk: lk.lock(NAME, wait=HUGER), ValueError, "wait", True),
    ("lock-renew-huge-int", lambda lk: lk.lock(NAME, renew=HUGE), ValueError, "renew", True),
    ("fair-str", lambda lk: lk.acquire(NAME, fair="yes"), TypeError, "fair", True),
    ("fair-int", lambda lk: lk.acquire(NAME, fair=1), TypeError, "fair", True),
    ("on-lost-int", lambda lk: lk.acquire(NAME, on_lost=5), TypeError, "on_lost", True),
    ("name-surrogate", lambda lk: lk.acquire(SURROGATE), ValueError, "name", False),
    ("name-bytes", lambda lk: lk.acquire(b"job"), TypeError, "name", False),
    ("name-empty", lambda lk: lk.acquire(""), ValueError, "name", False),
    ("name-long", lambda lk: lk.acquire("x" * 2000), ValueError, "name", False),
    ("lock-fair-str", lambda lk: lk.lock(NAME, fair="yes"), TypeError, "fair", True),
    ("lock-ttl-1e300", lambda lk: lk.lock(NAME, ttl=1e300), ValueError, "ttl", True),
    ("lock-wait-nan", lambda lk: lk.lock(NAME, wait=NAN), ValueError, "wait", True),
    ("lock-renew-bool-ttl", lambda lk: lk.lock(NAME, ttl=False), TypeError, "ttl", True),
    ("lock-on-lost", lambda lk: lk.lock(NAME, on_lost="print"), TypeError, "on_lost", True),
    ("lock-cancel-on-lost", lambda lk: lk.lock(NAME, cancel_on_lost="no"), TypeError, "cancel_on_lost", True),
    ("lock-name-surrogate", lambda lk: lk.lock(SURROGATE), ValueError, "name", False),
    ("status-surrogate", lambda lk: lk.status(SURROGATE), ValueError, "name", False),
    ("status-int", lambda lk: lk.status(42), TypeError, "name", False),
    ("force-release-surrogate", lambda lk: lk.force_release(SURROGATE), ValueError, "name", False),
    ("list-surrogate", lambda lk: lk.list(SURROGATE), ValueError, "pattern", False),
    ("list-int", lambda lk: lk.list(3), TypeError, "pattern", False),
]


def _check(exc: BaseException, kind: type[Exception], arg: str, named: bool) -> None:
    assert type(exc) is kind, f"{type(exc).__name__}: {exc}"
    assert arg in str(exc), f"the message does not name {arg!r}: {exc}"
    if named:
        assert repr(NAME) in str(exc), f"the message does not name the lock: {exc}"


@pytest.mark.parametrize(("call", "kind", "arg", "named"), [c[1:] for c in LOCK_CASES],
                         ids=[c[0] for c in LOCK_CASES])
def test_sync_entry_points_refuse_bad_input_before_sending(server: RedisServer, quiet: Callable[[], list[str]],
                                                           call: Call, kind: type[Exception], arg: str,
                                                           named: bool) -> None:
    with fencelock.connect(server.url) as locks:
        with pytest.raises((TypeError, ValueError)) as info:
            call(locks)   # lock() must refuse at the call, not at the `with`
        _check(info.value, kind, arg, named)
    assert quiet() == []


@pytest.mark.parametrize(("call", "kind", "arg", "named"), [c[1:] for c in LOCK_CASES],
                         ids=[c[0] for c in LOCK_CASES])
def test_asyncio_entry_points_refuse_bad_input_before_sending(server: RedisServer,
                                                              quiet: Callable[[], list[str]], call: Call,
                                                              kind: type[Exception], arg: str, named: bool) -> None:
    async def main() -> None:
        async with fencelock.aio.connect(server.url) as locks:
            async def attempt() -> None:
                made = call(locks)
                if asyncio.iscoroutine(made):
                    await made

            with pytest.raises((TypeError, ValueError)) as info:
                await attempt()
            _check(info.value, kind, arg, named)

    asyncio.run(main())
    assert quiet() == []


EXTEND_CASES = [(1e300, ValueError), (NAN, ValueError), (INF, ValueError), (True, TypeError), ("1", TypeError),
                (2.0**53, ValueError), (HUGE, ValueError), (HUGER, ValueError)]


@pytest.mark.parametrize(("ttl", "kind"), EXTEND_CASES,
                         ids=[repr(c[0]) if c[0] not in (HUGE, HUGER) else "huge-int" for c in EXTEND_CASES])
def test_extend_refuses_bad_ttls_before_sending(server: RedisServer, ttl: object, kind: type[Exception]) -> None:
    admin: Any = server.client()
    with fencelock.connect(server.url) as locks:
        lease = locks.acquire(NAME, ttl=5)
        sent = _counter(admin)
        with pytest.raises((TypeError, ValueError)) as info:
            lease.extend(ttl)  # type: ignore[arg-type]
        _check(info.value, kind, "ttl", True)
        assert sent() == []
        assert lease.held
        lease.release()


GUARD_CASES: list[tuple[str, Call, type[Exception], str]] = [
    ("fence-too-big", lambda g: g.set(NAME, 2**63, "k", "v"), ValueError, "fence"),
    ("fence-bool", lambda g: g.set(NAME, True, "k", "v"), TypeError, "fence"),
    ("fence-float", lambda g: g.set(NAME, 3.0, "k", "v"), TypeError, "fence"),
    ("value-none", lambda g: g.set(NAME, 3, "k", None), TypeError, "value"),
    ("value-bool", lambda g: g.set(NAME, 3, "k", True), TypeError, "value"),
    ("value-dict", lambda g: g.set(NAME, 3, "k", {"a": 1}), TypeError, "value"),
    ("value-surrogate", lambda g: g.set(NAME, 3, "k", SURROGATE), ValueError, "value"),
    ("key-int", lambda g: g.set(NAME, 3, 5, "v"), TypeError, "key"),
    ("key-surrogate", lambda g: g.set(NAME, 3, SURROGATE, "v"), ValueError, "key"),
    ("key-empty", lambda g: g.set(NAME, 3, "", "v"), ValueError, "key"),
    ("suffix-surrogate", lambda g: g.key(NAME, SURROGATE), ValueError, "suffix"),
]


@pytest.mark.parametrize(("call", "kind", "arg"), [c[1:] for c in GUARD_CASES], ids=[c[0] for c in GUARD_CASES])
def test_the_guard_refuses_bad_input_before_sending(server: RedisServer, quiet: Callable[[], list[str]],
                                                    call: Call, kind: type[Exception], arg: str) -> None:
    guard = fencelock.RedisGuard(server.client())
    with pytest.raises((TypeError, ValueError)) as info:
        call(guard)
    _check(info.value, kind, arg, True)
    assert quiet() == []


def _connect_cases(server: RedisServer) -> list[tuple[str, Callable[[], Any], type[Exception], str]]:
    one, other, third = server.url, f"redis://127.0.0.1:{free_port()}/0", f"redis://127.0.0.1:{free_port()}/0"
    return [
        ("prefix-int", lambda: fencelock.connect(one, prefix=5), TypeError, "prefix"),  # type: ignore[arg-type]
        ("prefix-surrogate", lambda: fencelock.connect(one, prefix=SURROGATE), ValueError, "prefix"),
        ("prefix-braces", lambda: fencelock.connect(one, prefix="a{b}"), ValueError, "prefix"),
        ("node-timeout-bool", lambda: fencelock.connect([one, other, third], node_timeout=True), TypeError,
         "node_timeout"),
        ("node-timeout-1e300", lambda: fencelock.connect([one, other, third], node_timeout=1e300), ValueError,
         "node_timeout"),
        ("repair-str", lambda: fencelock.connect([one, other, third], repair="yes"),  # type: ignore[arg-type]
         TypeError, "repair"),
        ("repair-delay-nan", lambda: fencelock.connect([one, other, third], repair_delay=NAN), ValueError,
         "repair_delay"),
        ("node-timeout-huge-int", lambda: fencelock.connect([one, other, third], node_timeout=HUGE), ValueError,
         "node_timeout"),
        ("repair-delay-huge-int", lambda: fencelock.connect([one, other, third], repair_delay=HUGE), ValueError,
         "repair_delay"),
        ("fence-retention-1e308", lambda: fencelock.connect(one, fence_retention=1e308), ValueError,
         "fence_retention"),
        ("fence-retention-huge-int", lambda: fencelock.connect(one, fence_retention=HUGE), ValueError,
         "fence_retention"),
        ("durability-timeout-huge-int", lambda: fencelock.connect(one, durability="replica",
                                                                  durability_timeout=HUGE), ValueError,
         "durability_timeout"),
        ("durability-huge-int", lambda: fencelock.connect(one, durability=HUGE), ValueError, "durability"),
        ("redlock-same-url", lambda: fencelock.connect([one, one, other]), ValueError, "url"),
        ("redlock-localhost", lambda: fencelock.connect([one, one.replace("127.0.0.1", "localhost"), other]),
         ValueError, "url"),
        ("redlock-other-db", lambda: fencelock.connect([one, one.replace("/0", "/1"), other]), ValueError, "url"),
        ("redlock-ipv4-spelled-out", lambda: fencelock.connect([one, one.replace("127.0.0.1", "127.000.0.1"),
                                                                 other]), ValueError, "url"),
        ("redlock-opts-for-one", lambda: fencelock.connect(one, node_timeout=1.0), ValueError, "node_timeout"),
        ("url-socket-timeout-nan", lambda: fencelock.connect(one + "?socket_timeout=nan"), ValueError, "url"),
        ("url-socket-timeout-inf", lambda: fencelock.connect(one + "?socket_timeout=inf"), ValueError, "url"),
        ("url-socket-timeout-1e300", lambda: fencelock.connect(one + "?socket_timeout=1e300"), ValueError, "url"),
        ("url-etcd-timeout-1e300", lambda: fencelock.connect("etcd://127.0.0.1:2379?timeout=1e300"), ValueError,
         "url"),
        ("url-zookeeper-timeout-1e300", lambda: fencelock.connect("zookeeper://127.0.0.1:2181?timeout=1e300"),
         ValueError, "url"),
        ("url-int", lambda: fencelock.connect(6379), TypeError, "url"),  # type: ignore[arg-type]
    ]


def test_connect_refuses_bad_options_before_sending(server: RedisServer, quiet: Callable[[], list[str]]) -> None:
    for case, call, kind, arg in _connect_cases(server):
        with pytest.raises((TypeError, ValueError)) as info:
            call().close()
        assert type(info.value) is kind, (case, info.value)
        assert arg in str(info.value), (case, str(info.value))
    assert quiet() == []


CLI_CASES = [
    ["run", "--ttl", "1e400", NAME, "--", "true"],
    ["run", "--ttl", "nan", NAME, "--", "true"],
    ["run", "--ttl", "1e300", NAME, "--", "true"],
    ["run", "--ttl", "0", NAME, "--", "true"],
    ["run", "--wait", "1e300", NAME, "--", "true"],
    ["run", "--wait", "nan", NAME, "--", "true"],
    ["run", "--wait", "-1", NAME, "--", "true"],
    ["run", "--grace", "nan", NAME, "--", "true"],
    ["run", "--grace", "inf", NAME, "--", "true"],
    ["run", "--grace", "-1", NAME, "--", "true"],
    ["run", SURROGATE, "--", "true"],
    ["status", SURROGATE],
    ["list", SURROGATE],
    ["release", SURROGATE, "--force", "--yes"],
]


@pytest.mark.parametrize("args", CLI_CASES, ids=[" ".join(a[:3]).encode("ascii", "replace").decode()
                                                  for a in CLI_CASES])
def test_the_cli_exits_2_for_bad_input_before_sending(server: RedisServer, quiet: Callable[[], list[str]],
                                                      args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status = run_cli([args[0], "--url", server.url, *args[1:]])
    _, err = capsys.readouterr()
    assert status == 2, err
    option = next((a for a in args if a.startswith("--") and a not in ("--", "--force", "--yes")), None)
    assert (option.lstrip("-") if option else ("pattern" if args[0] == "list" else "name")) in err, err
    assert quiet() == []


def test_redlock_nodes_that_are_one_server_are_refused_in_the_cli(server: RedisServer,
                                                                   quiet: Callable[[], list[str]],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    other = f"redis://127.0.0.1:{free_port()}/0"
    status = run_cli(["status", "--url", server.url, "--url", server.url.replace("/0", "/2"), "--url", other,
                      NAME])
    _, err = capsys.readouterr()
    assert status == 2, err
    assert "one server" in err
    assert quiet() == []


def test_the_command_count_sees_a_request_that_is_sent(server: RedisServer, quiet: Callable[[], list[str]]) -> None:
    """The check above is not blind: one good acquire shows up in it."""
    with fencelock.connect(server.url) as locks:
        locks.acquire(NAME, ttl=5, wait=0).release()
    assert quiet() != []
