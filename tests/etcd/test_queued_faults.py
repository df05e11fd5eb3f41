"""Faults while requests are queued in one etcd client for their turn among `MAX_IN_FLIGHT` (issue 14, decision
2026-12-05-queued-faults).

One asyncio client starts far more acquires than its 8 requests in flight, a competing client acquires part of the
same names (its waiters share a watch per name), and while requests wait for their turn: the server is paused
(SIGSTOP for a second, then SIGCONT), half the queued callers are cancelled, or the client is closed. The server,
read by the test, shows: no two leases of a name claim validity, none claims more than its etcd lease keeps (whole
seconds), errors are fencelock errors naming the lock within a bound, a held lease is kept or reported lost, no
key of a call that failed or was cancelled outlives its TTL, and the admission slots drain.

The network's faults (`NETWORK`: a reply lost or late, a connection reset before or after its request, idle
connections closed) hit some of the burst's `acquire` transactions as they leave the admission queue: the client
under test connects through a `FaultProxy` (HTTP), the rival and the checks straight to the server; the held
lease is kept throughout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import threading
import time
from typing import Any

import pytest

import fencelock.aio
from fencelock._etcd.rules import name_dir, range_end
from fencelock.testing.etcd import EtcdServer
from fencelock.testing.faults import FaultProxy
from fencelock.testing.framing import HTTP
from tests._queued_faults import (
    LATE_BY,
    NETWORK,
    SOCKET_TIMEOUT,
    Burst,
    Network,
    burst,
    check_claims,
    check_errors,
    inject,
    release_all,
    settle,
)
from tests.etcd.helpers import b64, lease_ttl

pytestmark = pytest.mark.alone  # (it loads one client to its limits: no other test runs beside it)

TTL = 2.0
COUNT = 240
CONTESTED = 60
WAIT = 5.0  # (queued requests give up by their caller's wait: long enough to stay queued while the faults fire)
LIMIT = 20.0
"""A bound on every call: well below the 30 s queue bound, above a request's timeouts after a pause."""


def _keys(server: EtcdServer, stem: str) -> dict[str, tuple[str, int]]:
    """Each holder's or waiter's key of the names starting with `stem`: its value (a lease's token) -> (key, etcd
    lease)."""
    start = name_dir("fencelock", stem)[:-1]
    answer = server.request("/v3/kv/range", {"key": b64(start), "range_end": b64(range_end(start))})
    found = {}
    for kv in answer.get("kvs", []):
        key = base64.b64decode(kv["key"]).decode()
        if key.count("/") > 1:  # (inside a name's directory: a holder's or a waiter's; not a release's fence key)
            found[base64.b64decode(kv["value"]).decode()] = (key, int(kv.get("lease", 0)))
    return found


def _kept(server: EtcdServer, stem: str) -> Any:
    def kept(leases: list[Any]) -> list[float | None]:
        keys = _keys(server, stem)
        left: list[float | None] = []
        for lease in leases:
            found = keys.get(lease.token)
            ttl = lease_ttl(server, found[1]) if found is not None else -1
            left.append(float(ttl) if ttl >= 0 else None)  # (0: less than a second left)
        return left
    return kept


@pytest.mark.parametrize("fault", ["pause_long", "pause_cancel", "pause_close", "cancel", *NETWORK])
def test_a_fault_while_etcd_requests_are_queued(own_etcd_server: EtcdServer, fault: str) -> None:
    server = own_etcd_server
    with contextlib.ExitStack() as stack:
        url, network = server.url, None
        if fault in NETWORK:
            proxy = stack.enter_context(FaultProxy("127.0.0.1", server.members[0].client_port, name="queued-etcd",
                                                   framing=HTTP))
            url = f"etcd://127.0.0.1:{proxy.port}?timeout={SOCKET_TIMEOUT}"
            network = Network(fault, [proxy], "acquire", late=LATE_BY, count=12, spread=12)
        _queued_fault(server, fault, url, network)


def _queued_fault(server: EtcdServer, fault: str, url: str, network: Network | None) -> None:
    stem = f"eq:{fault}:"
    names = [f"{stem}{i}" for i in range(COUNT)]
    lost = threading.Event()

    fault_at = functools.partial(inject, fault, pause=server.pause, resume=server.resume)

    async def main() -> tuple[Burst, bool, float, str]:
        async with fencelock.aio.connect(url) as locks, fencelock.aio.connect(server.url) as rival:
            keeper = await locks.acquire(f"keeper:{fault}", ttl=3.0, wait=0, renew=True,
                                         on_lost=lambda lease: lost.set())
            gateway = locks.backend._gateway  # type: ignore[attr-defined]

            def queued() -> int:
                return int(gateway._admission.waiting)

            result = await burst(locks, rival, names, CONTESTED, TTL, WAIT, queued,
                                 lambda tasks: network.inject(queued) if network else fault_at(tasks, locks), LIMIT)
            failed = network.end() if network else ""
            assert not failed, failed
            check_errors(result, LIMIT)
            await asyncio.to_thread(check_claims, result, _kept(server, stem), 1.0)
            kept = keeper.held
            state, after = "", 0.0
            if not fault.endswith("close"):
                def idle() -> bool:
                    return bool(gateway._admission.out == 0 and gateway._admission.waiting == 0)
                if not await settle(idle):
                    state = f"out={gateway._admission.out} waiting={gateway._admission.waiting}"
                started = time.monotonic()
                again = await locks.acquire(f"after:{fault}", ttl=TTL, wait=1.0)  # (the same client, not rebuilt)
                await again.release()
                after = time.monotonic() - started
                with contextlib.suppress(fencelock.LockLost):  # (raised when the fault did make it lost)
                    await keeper.release()
            await release_all(result)
            return result, kept, after, state

    result, kept, after, state = asyncio.run(main())
    assert result.queued_at_fault > 0, "no request waited for its turn when the fault came"
    assert kept != lost.is_set(), f"the keeper: held={kept}, on_lost fired={lost.is_set()}"
    if fault in ("cancel", *NETWORK):
        assert kept, "the held lease was lost through a fault that does not stop its server"
    if not fault.endswith("close"):
        assert len(result.granted()) > CONTESTED, "the burst was not served"
    assert not state, f"the admission did not drain: {state}"
    assert after < 2.0
    time.sleep(TTL + 1.2)  # (etcd's TTLs are whole seconds, rounded up)
    left = _keys(server, stem)
    assert not left, f"keys left beyond their TTL: {sorted(key for key, _ in left.values())[:5]}"
