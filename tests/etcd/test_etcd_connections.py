"""Reaching etcd: URLs, a missing extra, servers that are down or stopped, credentials, TLS, and a bounded close()."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

import pytest

import fencelock
from fencelock._async.etcd import CLOSE_TIMEOUT
from fencelock.testing.etcd import EtcdServer
from fencelock.testing.servers import free_port
from fencelock.testing.timing import slack
from tests.conftest import IN_CI, require_etcd_binary, until
from tests.etcd.helpers import b64, keys_of, lease_ttl, leases_of


@pytest.mark.parametrize("url", ["etcd://", "etcd://127.0.0.1:0", "etcd://h/x", "etcd://h?bogus=1",
                                 "etcd://root:hunter2@h:0"])
def test_bad_urls_are_refused_before_anything_is_sent(url: str) -> None:
    for connect in (fencelock.connect, fencelock.aio.connect):
        with pytest.raises(ValueError, match="url") as info:
            connect(url)
        assert "hunter2" not in str(info.value)


def test_etcd_endpoints_go_in_one_url_not_a_list() -> None:
    with pytest.raises(ValueError, match="one URL"):
        fencelock.connect(["etcd://127.0.0.1:2379", "etcd://127.0.0.2:2379", "etcd://127.0.0.3:2379"])


def test_a_missing_extra_is_named() -> None:
    code = "import sys; sys.modules['httpx'] = None; import fencelock; fencelock.connect('etcd://127.0.0.1:1')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode != 0
    assert "pip install 'fencelock[etcd]'" in result.stderr


def test_nothing_listening_gives_backend_error_at_once(name: str) -> None:
    locks = fencelock.connect(f"etcd://127.0.0.1:{free_port()}")
    try:
        started = time.monotonic()
        with pytest.raises(fencelock.BackendError) as info:
            locks.acquire(name, wait=5.0)
        assert time.monotonic() - started < slack(1.5)
        assert info.value.name == name
    finally:
        locks.close()


def test_a_stopped_server_gives_backend_error_in_bounded_time_and_the_lease_stays_releasable(
        own_etcd_server: EtcdServer, name: str) -> None:
    locks = fencelock.connect(own_etcd_server.url + "?timeout=0.5")
    try:
        lease = locks.acquire(name, ttl=30.0)
        own_etcd_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(fencelock.BackendError):
                locks.acquire(name + ":2", wait=10.0)
            assert time.monotonic() - started < 2 * 0.5 + slack(1.5)  # two tries of 0.5 s, on a busy machine
            with pytest.raises(fencelock.BackendError):
                lease.release()
            with pytest.raises(fencelock.BackendError):
                locks.backend.status(name)
        finally:
            own_etcd_server.resume()
        lease.release()  # it kept its token
        assert keys_of(own_etcd_server, name) == []
    finally:
        locks.close()


def test_asyncio_stopped_server_gives_backend_error(own_etcd_server: EtcdServer, name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(own_etcd_server.url + "?timeout=0.5")
        try:
            own_etcd_server.pause()
            try:
                with pytest.raises(fencelock.BackendError):
                    await asyncio.wait_for(locks.acquire(name, wait=10.0), 5.0)
            finally:
                own_etcd_server.resume()
        finally:
            await locks.aclose()

    asyncio.run(main())


def test_user_and_password_from_the_url(own_etcd_server: EtcdServer, name: str) -> None:
    for path, body in (("/v3/auth/user/add", {"name": "root", "password": "s3cret"}),
                       ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
                       ("/v3/auth/enable", {})):
        own_etcd_server.request(path, body)
    host = own_etcd_server.url.removeprefix("etcd://")
    locks = fencelock.connect(f"etcd://root:s3cret@{host}")
    try:
        assert "s3cret" not in repr(locks)
        holder = locks.acquire(name, ttl=10.0)
        threading.Timer(0.3, holder.release).start()
        with locks.lock(name, ttl=10.0, wait=5.0) as lease:  # the waiter's watch is authenticated too
            assert lease.fence > holder.fence
    finally:
        locks.close()
    wrong = fencelock.connect(f"etcd://root:hunter2@{host}")
    try:
        with pytest.raises(fencelock.BackendError, match="authentication as 'root' failed") as info:
            wrong.acquire(name, wait=0)
        assert "hunter2" not in str(info.value)
    finally:
        wrong.close()


def test_etcds_urls_use_tls(tmp_path: Any, name: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        if IN_CI:
            pytest.fail("the etcd TLS test needs openssl (apt-get install openssl)")
        pytest.skip("the etcd TLS test needs openssl (apt-get install openssl)")
    require_etcd_binary()
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    with EtcdServer(memory=True, tls=(cert, key)) as server:
        assert server.url.startswith("etcds://")
        locks = fencelock.connect(f"{server.url}?ssl_ca_certs={cert}")
        try:
            with locks.lock(name, ttl=5.0, wait=0) as lease:
                assert lease.fence > 0
        finally:
            locks.close()
        untrusted = fencelock.connect(server.url)  # the system's CAs do not know this certificate
        try:
            with pytest.raises(fencelock.BackendError):
                untrusted.acquire(name, wait=0)
        finally:
            untrusted.close()
        plain = fencelock.connect(server.url.replace("etcds://", "etcd://"))
        try:
            with pytest.raises(fencelock.BackendError):
                plain.acquire(name, wait=0)
        finally:
            plain.close()


# ------------------------------------------------------------------------------------------------ close()


def _spares(locks: fencelock.Locks, server: EtcdServer, name: str, n: int) -> set[int]:
    """Make `n` spare leases: hold `n` locks at once, then release them all (each lease is kept, keyless)."""
    before = leases_of(server)
    leases = [locks.acquire(f"{name}:{i}", ttl=1.0, wait=0) for i in range(n)]
    for lease in leases:
        lease.release()
    spares = leases_of(server) - before
    assert len(spares) == n
    return spares


def test_close_on_a_stalled_server_is_bounded_and_the_spare_leases_end_by_their_ttl(
        own_etcd_server: EtcdServer, name: str) -> None:
    server = own_etcd_server
    locks = fencelock.connect(server.url)  # the default request timeout: 2 s
    spares = _spares(locks, server, name, 3)
    locks.acquire(f"{name}:held", ttl=1.0, wait=0, renew=True)  # renewed: the watchdog stops with close() too
    [held] = keys_of(server, f"{name}:held")
    server.pause()
    try:
        started = time.monotonic()
        locks.close()
        took = time.monotonic() - started
    finally:
        server.resume()
    # The old close() waited one request timeout (2 s) for the first revoke on a stalled server.
    assert took < CLOSE_TIMEOUT + slack(0.6), took
    left = spares | {int(held["lease"])}
    until(lambda: not leases_of(server) & left, 5.0, "the leases close() left ended by their TTL")
    # On a server that answers, close() still revokes them at once.
    again = fencelock.connect(server.url)
    spares = _spares(again, server, name, 3)
    again.close()
    assert not leases_of(server) & spares


def test_asyncio_close_on_a_stalled_server_is_bounded(own_etcd_server: EtcdServer, name: str) -> None:
    server = own_etcd_server

    async def main() -> float:
        locks = fencelock.aio.connect(server.url)
        for lease in [await locks.acquire(f"{name}:{i}", ttl=1.0, wait=0) for i in range(3)]:
            await lease.release()
        server.pause()
        try:
            started = time.monotonic()
            await locks.aclose()
            return time.monotonic() - started
        finally:
            server.resume()

    took = asyncio.run(main())
    assert took < CLOSE_TIMEOUT + slack(0.6), took


def test_close_with_waiters_in_flight_revokes_their_leases_before_it_returns(etcd_server: EtcdServer,
                                                                            name: str) -> None:
    """The probe: the waiters' keys stayed queued until their leases' TTL after close() returned."""
    holder = fencelock.connect(etcd_server.url)
    lease = holder.acquire(name, ttl=10.0, wait=0)
    locks = fencelock.connect(etcd_server.url)
    errors: list[BaseException] = []

    def wait_for_it() -> None:
        try:
            locks.acquire(name, ttl=10.0, wait=30.0)
        except BaseException as exc:
            errors.append(exc)

    waiters = [threading.Thread(target=wait_for_it) for _ in range(3)]
    try:
        for waiter in waiters:
            waiter.start()
        until(lambda: len(keys_of(etcd_server, name)) == 4, 5.0, "the waiters queued")
        queued = {int(kv["lease"]) for kv in keys_of(etcd_server, name)[1:]}
        started = time.monotonic()
        locks.close()
        assert time.monotonic() - started < 2.0 + slack(0.5)  # the URL's timeout at most
        assert [kv["value"] for kv in keys_of(etcd_server, name)] == [b64(lease.token.encode())]
        assert all(lease_ttl(etcd_server, waiter_lease) == -1 for waiter_lease in queued)
        for waiter in waiters:
            waiter.join(5.0)
        assert len(errors) == 3
        assert all(isinstance(exc, fencelock.LockError) for exc in errors), errors
        lease.release()
    finally:
        holder.close()


def test_asyncio_close_with_waiters_in_flight_revokes_their_leases_before_it_returns(etcd_server: EtcdServer,
                                                                                    name: str) -> None:
    async def main() -> None:
        holder = fencelock.aio.connect(etcd_server.url)
        lease = await holder.acquire(name, ttl=10.0, wait=0)
        locks = fencelock.aio.connect(etcd_server.url)
        waiters = [asyncio.ensure_future(locks.acquire(name, ttl=10.0, wait=30.0)) for _ in range(3)]
        try:
            await asyncio.to_thread(until, lambda: len(keys_of(etcd_server, name)) == 4, 5.0, "the waiters queued")
            await locks.aclose()
            assert [kv["value"] for kv in keys_of(etcd_server, name)] == [b64(lease.token.encode())]
            outcomes = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 5.0)
            assert all(isinstance(outcome, fencelock.LockError) for outcome in outcomes), outcomes
            await lease.release()
        finally:
            await holder.aclose()

    asyncio.run(main())


def test_a_request_still_connecting_when_close_runs_leaves_no_socket_open(etcd_server: EtcdServer,
                                                                           name: str) -> None:
    """A background cleanup (a release after a failed acquire) may be making its connection when `close()` runs.
    The HTTP pool's close has no socket to close then and forgets that connection; the request then completes on
    it. CI once found that socket left to the garbage collector (a ResourceWarning in a later test)."""
    locks = fencelock.connect(etcd_server.url)
    gateway: Any = locks.backend._gateway  # type: ignore[attr-defined]
    pool = gateway._transport._pool
    real = pool._network_backend
    connecting, go = threading.Event(), threading.Event()
    made: list[Any] = []

    class SlowToConnect:
        """The real network, except that a connection is made only once the test says so."""

        def connect_tcp(self, *args: Any, **kwargs: Any) -> Any:
            connecting.set()
            go.wait(5.0)
            made.append(real.connect_tcp(*args, **kwargs))
            return made[-1]

        def __getattr__(self, attribute: str) -> Any:
            return getattr(real, attribute)

    pool._network_backend = SlowToConnect()
    answers: list[dict[str, Any]] = []
    request = threading.Thread(target=lambda: answers.append(
        gateway.call("/v3/kv/range", {"key": b64(name.encode())}, "range", name)))
    request.start()
    assert connecting.wait(5.0)
    locks.close()
    go.set()
    request.join(5.0)
    [answer] = answers  # the request went through, after close()
    assert "error" not in answer
    [stream] = made
    assert stream.get_extra_info("socket").fileno() == -1, "the connection made during close() is still open"


def test_the_harness_gives_a_member_new_ports_when_its_first_were_taken() -> None:
    require_etcd_binary()
    with socket.socket() as holder:
        server = EtcdServer(memory=True)
        try:
            member = server.members[0]
            holder.bind(("127.0.0.1", member.client_port))
            holder.listen()
            taken = member.client_port
            server.start()
            assert member.client_port != taken
            assert server.request("/v3/kv/range", {"key": "eA=="}).get("kvs") is None
            server.pause()
            assert member.paused
            server.resume()
            server.kill(0)
            assert server.pids() == [None]
            server.restart(0)
            assert server.pids() != [None]
        finally:
            server.close()


@pytest.mark.parametrize("option", ["ssl_ca_certs", "ssl_certfile", "ssl_keyfile"])
def test_a_tls_file_that_cannot_be_read_is_a_value_error_naming_its_option_at_connect(
        etcd_server: EtcdServer, tmp_path: Any, option: str) -> None:
    missing = tmp_path / "missing.pem"
    others = {"ssl_certfile": "ssl_keyfile", "ssl_keyfile": "ssl_certfile"}
    url = etcd_server.url.replace("etcd://", "etcds://") + f"?{option}={missing}"
    if option in others:  # a client certificate needs both files: the other one exists (an empty file)
        (tmp_path / "other.pem").write_text("")
        url += f"&{others[option]}={tmp_path / 'other.pem'}"
    for connect in (fencelock.connect, fencelock.aio.connect):
        with pytest.raises(ValueError, match=f"{option}.*cannot be read") as info:
            connect(url)
        assert not isinstance(info.value, OSError)
        assert info.value.__cause__ is None
        assert info.value.__suppress_context__


def test_a_tls_file_that_holds_no_certificate_is_a_value_error_naming_its_option_at_connect(
        etcd_server: EtcdServer, tmp_path: Any) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    url = etcd_server.url.replace("etcd://", "etcds://")
    for query, option in ((f"ssl_ca_certs={empty}", "ssl_ca_certs"), (f"ssl_certfile={empty}", "ssl_certfile")):
        with pytest.raises(ValueError, match=f"{option}.* no certificate") as info:
            fencelock.connect(f"{url}?{query}")
        assert info.value.__cause__ is None


# ------------------------------------------------------------------------------------------------ server versions


def test_a_server_version_that_may_revoke_live_leases_is_warned_about_once_per_client(
        etcd_server: EtcdServer, name: str, caplog: pytest.LogCaptureFixture) -> None:
    """Debian's etcd 3.4.23 has etcd-io/etcd#15247 (fixed in 3.4.31 and 3.5.13): a WARNING on fencelock.etcd, once
    per client, after its first grant; the locks work as usual."""
    caplog.set_level(logging.WARNING, logger="fencelock.etcd")

    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "fencelock.etcd" and "15247" in r.getMessage()]

    for client in range(2):
        locks = fencelock.connect(etcd_server.url)
        try:
            for i in range(3):
                locks.acquire(f"{name}:{i}", ttl=5.0, wait=0).release()
            until(lambda n=client + 1: len(warnings()) == n, 5.0, "the warning of this client")
        finally:
            locks.close()
    message = warnings()[0].getMessage()
    assert "etcd 3.4.23" in message
    assert "3.4.31" in message
    assert f"{name}:0" in message
    time.sleep(0.2)
    assert len(warnings()) == 2  # once per client


def test_a_forked_child_sends_on_connections_of_its_own(etcd_server: EtcdServer, name: str) -> None:
    """A client used on both sides of fork(): the child's requests never go out on its parent's pooled sockets.
    Here the child leaves a waiter's watch open on the socket it used and exits; the parent's next request on its
    pool must be answered as its own (it read the child's watch stream, and timed out, when the pool was shared)."""
    holder = fencelock.connect(etcd_server.url)
    locks = fencelock.connect(etcd_server.url)
    try:
        held = holder.acquire(name, ttl=10.0, wait=0)
        assert locks.status(name).held  # the parent's pool now keeps one idle connection
        with warnings.catch_warnings():  # Python 3.12 warns about forking a process that has threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            try:
                threading.Thread(target=lambda: locks.acquire(name, ttl=2.0, wait=5.0), daemon=True).start()
                time.sleep(0.5)  # queued behind the holder, watching its key
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        seen = locks.status(name)
        assert seen.held
        assert seen.fence == held.fence
        held.release()
    finally:
        locks.close()
        holder.close()
