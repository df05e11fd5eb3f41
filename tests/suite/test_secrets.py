"""A password, in whatever form it is given, never appears in a message, a repr, a log record or CLI output.

The sweep gives one distinctive password in every place a URL can carry one (userinfo, `?password=`, escaped,
unescaped with `/ ? # @` in it, alone before `@`), for every scheme, in URLs that are valid and in URLs that are
malformed in each way the parsers check. Each is handed to the sync and asyncio `connect`, then, where that
succeeds, a request is sent to a server that is not there (a `BackendError`) and, for Redis, to a real server
that refuses the password (requirepass, and an ACL user). The CLI gets the same URLs, by `--url` and by
`FENCELOCK_URL`. Everything said on the way is searched for the password.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

import fencelock
import fencelock.aio
from fencelock._cli.commands import run_cli
from fencelock._cli.options import server_url_like
from fencelock._etcd.url import parse_etcd_url
from fencelock._logic.urls import parse_redis_url, redact
from fencelock._zk.url import parse_zookeeper_url
from fencelock.testing.servers import RedisServer, free_port
from tests.conftest import _require_server_binary

SECRET = "Zq7xSecretPw"
"""Distinctive enough that any appearance is a leak, and free of characters a URL would escape."""

AWKWARD = [SECRET, f"{SECRET}/x", f"{SECRET}?x", f"{SECRET}?w=x", f"{SECRET}#x", f"{SECRET}@x", f"a:{SECRET}",
           f"{SECRET}%"]
"""The password as users really write it, unescaped: each of these breaks a naive parser in its own way."""

CLOSED = free_port()  # nothing listens here: requests fail fast with a BackendError


def _shown(url: str) -> str:
    """A test id without the port (chosen per process: pytest-xdist's workers must collect the same ids)."""
    return url.replace(str(CLOSED), "PORT")


def _forms(scheme: str, host: str) -> list[str]:
    """Every way of writing `scheme` URLs with the password in them, valid and malformed."""
    forms: list[str] = []
    for pw in AWKWARD:
        forms += [f"{scheme}://user:{pw}@{host}", f"{scheme}://:{pw}@{host}", f"{scheme}://{pw}@{host}",
                  f"{scheme}://user:{quote(pw, safe='')}@{host}"]
    tail = "" if scheme.startswith(("etcd", "zookeeper")) else "/0"
    forms += [
        f"{scheme}://{host}{tail}?password={SECRET}",
        f"{scheme}://{host}{tail}?username=u&password={SECRET}",
        f"{scheme}://{host}{tail}?password={SECRET}@x",
        f"{scheme}://{host}{tail}?socket_timeout=0.5&password={SECRET}#frag",
        f"{scheme}://{host}{tail}?ssl_keyfile=/k&ssl_password={SECRET}",
        # malformed, each way the parsers check
        f"{scheme}://user:{SECRET}@{host.split(':')[0]}:99999{tail}",
        f"{scheme}://user:{SECRET}@{host.split(':')[0]}:0{tail}",
        f"{scheme}://user:{SECRET}@{host.split(':')[0]}:abc{tail}",
        f"{scheme}://user:{SECRET}@{host}/not-a-db",
        f"{scheme}://user:{SECRET}@{host}{tail}?bogus=1",
        f"{scheme}://user:{SECRET}@{host}{tail}?{SECRET}=1",
        f"{scheme}://user:{SECRET}@{host}{tail}?socket_timeout=-1&password={SECRET}",
        f"{scheme}://user:{SECRET}@{host}{tail}?timeout=nan",
        f"{scheme}://user:{SECRET}@",
        f"{scheme}://user:{SECRET}@[::1{tail}",
        f"{scheme}:/user:{SECRET}@{host}",
        f"{scheme}//user:{SECRET}@{host}",
        f"{scheme}://user:{SECRET}@{host},{host}{tail}",
        # an option's value run into the password's: `?` typed for `&`, or the `&` left out
        f"{scheme}://{host}{tail}?socket_timeout=5?password={SECRET}",
        f"{scheme}://{host}{tail}?socket_timeout=5password={SECRET}",
        f"{scheme}://{host}{tail}?timeout=5?password={SECRET}",
        f"{scheme}://{host}{tail}?db=0?password={SECRET}",
        f"{scheme}://{host}{tail}?protocol=3?password={SECRET}",
    ]
    return forms


SCHEMES = ["redis", "rediss", "redis+cluster", "rediss+cluster", "etcd", "etcds", "zookeeper"]
URLS = sorted({url for scheme in SCHEMES for url in _forms(scheme, f"127.0.0.1:{CLOSED}")}
              | {f"unix:///nowhere/r.sock?password={SECRET}", f"unix:///tmp/x.sock?db=0&password={SECRET}",
                 f"unix://user:{SECRET}@/tmp/x.sock", f"http://user:{SECRET}@h", f"user:{SECRET}@h:1"})


def _clean(text: str, where: str) -> None:
    assert SECRET not in text, f"the password appears in {where}: {text!r}"


def _clean_error(exc: BaseException, where: str) -> None:
    """The error, its args, and every error chained to it (a traceback shows those too) hold no password."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current is exc or not type(current).__module__.startswith(("redis", "httpx", "kazoo", "ssl")):
            _clean(str(current), f"{where}: {type(current).__name__}")
            _clean(repr(current.args), f"{where}: {type(current).__name__}.args")
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


@pytest.fixture(autouse=True)
def every_log_record(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every log record of every logger, at every level, is searched for the password after the test."""
    caplog.set_level(logging.DEBUG)
    yield
    for record in caplog.records:
        _clean(record.getMessage(), f"log record {record.name}")
        if record.exc_info and record.exc_info[1] is not None:
            _clean_error(record.exc_info[1], f"log record {record.name}")


@pytest.mark.parametrize("url", URLS, ids=_shown)
def test_no_password_in_any_message_or_repr_sync(url: str) -> None:
    _clean(redact(url), "redact()")
    for parse in (parse_redis_url, parse_etcd_url, parse_zookeeper_url):
        try:
            _clean(repr(parse(url)), f"repr({parse.__name__}())")
        except (ValueError, TypeError) as exc:
            _clean_error(exc, f"{parse.__name__}()")
    try:
        locks = fencelock.connect(url)
    except (ValueError, TypeError, fencelock.LockError, ImportError) as exc:
        _clean_error(exc, "connect()")
        return
    try:
        _clean(repr(locks), "repr(locks)")
        _clean(repr(locks.backend.__dict__ if hasattr(locks.backend, "__dict__") else ""), "the backend's fields")
        with pytest.raises((fencelock.BackendError, ValueError)) as info:
            locks.acquire("secrets:probe", wait=0)
        _clean_error(info.value, "acquire()")
        with pytest.raises((fencelock.BackendError, ValueError)) as info:
            locks.status("secrets:probe")
        _clean_error(info.value, "status()")
    finally:
        locks.close()


@pytest.mark.parametrize("url", [u for u in URLS if "redis" in u or "etcd" in u][::3], ids=_shown)
def test_no_password_in_any_message_or_repr_asyncio(url: str) -> None:
    async def main() -> None:
        try:
            locks = fencelock.aio.connect(url)
        except (ValueError, TypeError, fencelock.LockError, ImportError) as exc:
            _clean_error(exc, "aio.connect()")
            return
        try:
            _clean(repr(locks), "repr(locks)")
            with pytest.raises((fencelock.BackendError, ValueError)) as info:
                await locks.acquire("secrets:probe", wait=0)
            _clean_error(info.value, "acquire()")
        finally:
            await locks.aclose()

    asyncio.run(main())


def _cli(args: list[str], capsys: pytest.CaptureFixture[str], env_url: str | None = None,
         monkeypatch: pytest.MonkeyPatch | None = None) -> int:
    if env_url is not None and monkeypatch is not None:
        monkeypatch.setenv("FENCELOCK_URL", env_url)
    status = run_cli(args)
    out, err = capsys.readouterr()
    _clean(out, f"the CLI's stdout for {args}")
    _clean(err, f"the CLI's stderr for {args}")
    return status


@pytest.mark.parametrize("url", URLS[::2], ids=_shown)
def test_no_password_in_cli_output(url: str, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert _cli(["status", "--url", url, "secrets:probe"], capsys) in (2, 69)
    assert _cli(["run", "--url", url, "--wait", "0", "secrets:probe", "--", "true"], capsys) in (2, 69)
    monkeypatch.delenv("FENCELOCK_URL", raising=False)
    assert _cli(["list"], capsys, env_url=url, monkeypatch=monkeypatch) in (2, 69)


MISPLACED = [url for url in URLS if not url.startswith("user:")]
"""The URL forms a careless hand puts in the lock name's place: every one with a scheme, typed right or wrong
(`user:pw@h:1`, with none, cannot be told from a name)."""


@pytest.mark.parametrize("url", MISPLACED[::2], ids=_shown)
def test_a_server_url_given_where_the_lock_name_goes_is_refused_unshown(url: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`fencelock run URL NAME -- ...` (the URL in the lock name's place): exit 2, before anything is sent, saying
    to give it with --url, and never showing it. The same for status, release and list's pattern."""
    closed = f"redis://127.0.0.1:{CLOSED}/0"
    for args in (["run", "--url", closed, url, "job", "--", "true"], ["status", "--url", closed, url],
                 ["release", "--url", closed, url, "--force", "--yes"], ["list", "--url", closed, url]):
        assert _cli(args, capsys) == 2, args


@pytest.mark.parametrize("name", ["s3://bucket/key", "redis:migration", "etcd-backup", "orders:42"])
def test_a_lock_name_that_is_no_server_url_is_still_a_name(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Only what is recognisably a server URL is refused (`server_url_like`): these are names (the server here is
    down, so the exit says so, 69, after trying)."""
    assert not server_url_like(name)
    assert _cli(["status", "--url", f"redis://127.0.0.1:{CLOSED}/0", name], capsys) == 69


def test_no_password_in_cli_output_with_debug_off_in_a_real_process() -> None:
    """The console entry point in its own process, the URL in FENCELOCK_URL as the help advises."""
    url = f"redis://user:{SECRET}@127.0.0.1:{CLOSED}/0?password={SECRET}"
    for args in (["status", "x"], ["run", "x", "--", "true"], ["release", "x", "--force", "--yes"]):
        done = subprocess.run([sys.executable, "-m", "fencelock", *args], capture_output=True, text=True,
                              timeout=60, env={"FENCELOCK_URL": url, "PATH": "/usr/bin:/bin"})
        assert done.returncode == 69, done.stderr
        _clean(done.stdout + done.stderr, f"fencelock {' '.join(args)}")
        assert "127.0.0.1" in done.stderr  # the error still says where it tried


def test_a_password_with_spaces_in_fencelock_url_is_never_split_into_shown_pieces() -> None:
    """FENCELOCK_URL holds several URLs separated by spaces (Redlock): it is split only before a `scheme://`, so a
    password with spaces in it stays in its URL, masked whole (it used to be split there, and its first piece
    shown as a URL `redis://:<piece>`)."""
    url = f"redis://:{SECRET} and  more@127.0.0.1:{CLOSED}/0"
    done = subprocess.run([sys.executable, "-m", "fencelock", "status", "x"], capture_output=True, text=True,
                          timeout=60, env={"FENCELOCK_URL": url, "PATH": "/usr/bin:/bin"})
    _clean(done.stdout + done.stderr, "fencelock status")
    for piece in ("and", "more"):
        assert f" {piece}," not in done.stderr, done.stderr
        assert f"'{piece}'" not in done.stderr, done.stderr
    assert done.returncode == 69, done.stderr  # one URL, tried (nothing listens there)


# -- a real server that refuses the password ------------------------------------------------------------------

@pytest.fixture(scope="module")
def guarded() -> Iterator[RedisServer]:
    _require_server_binary()
    with RedisServer(name="requirepass") as server:
        admin: Any = server.client()  # (set after the start: the harness's readiness check sends PING without AUTH)
        admin.execute_command("ACL", "SETUSER", "app", "on", ">app-right-one", "~*", "+@all")
        admin.config_set("requirepass", "the-right-one")
        yield server


def _refused_urls(server: RedisServer) -> list[str]:
    at = f"127.0.0.1:{server.port}"
    return [f"redis://:{SECRET}@{at}/0", f"redis://app:{SECRET}@{at}/0", f"redis://{at}/0?password={SECRET}",
            f"redis://{at}/0?username=app&password={SECRET}", f"redis://default:{SECRET}@{at}/0"]


def test_a_server_that_refuses_the_password_never_hears_it_echoed(guarded: RedisServer,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for url in _refused_urls(guarded):
        with fencelock.connect(url) as locks:
            _clean(repr(locks), "repr(locks)")
            for call in (lambda: locks.acquire("secrets:refused", wait=0), lambda: locks.status("secrets:refused"),
                         lambda: locks.list("*"), lambda: locks.force_release("secrets:refused")):
                with pytest.raises(fencelock.BackendError) as info:
                    call()
                _clean_error(info.value, f"an error from a server refusing {redact(url)}")

        async def main(url: str = url) -> None:
            async with fencelock.aio.connect(url) as alocks:
                with pytest.raises(fencelock.BackendError) as info:
                    await alocks.acquire("secrets:refused", wait=0)
                _clean_error(info.value, f"an asyncio error from a server refusing {redact(url)}")

        asyncio.run(main())
        assert _cli(["status", "--url", url, "secrets:refused"], capsys) == 69
    # and the right password works, so the refusals above were the password's doing
    with fencelock.connect(f"redis://app:app-right-one@127.0.0.1:{guarded.port}/0") as locks:
        locks.acquire("secrets:accepted", wait=0).release()


def test_redlock_nodes_never_show_a_password(guarded: RedisServer) -> None:
    urls = [f"redis://:{SECRET}@127.0.0.1:{guarded.port}/0", f"redis://127.0.0.1:{CLOSED}/0?password={SECRET}",
            f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"]
    with fencelock.connect(urls) as locks:
        _clean(repr(locks), "repr(redlock locks)")
        with pytest.raises(fencelock.BackendError) as info:
            locks.acquire("secrets:redlock", wait=0)
        _clean_error(info.value, "a Redlock error")
    with pytest.raises(ValueError, match="twice") as twice:
        fencelock.connect([urls[0], urls[0], urls[1]])
    _clean_error(twice.value, "the Redlock duplicate-node error")
