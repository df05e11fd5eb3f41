"""Two threads (or tasks) that release one lease at once: one release request is sent, and both callers get its
outcome. Before, the second sent its own release, found the key gone, and raised a false `LockLost`.

The first release is held back on the wire (`FaultProxy`), so the second call certainly comes while it is in
flight; the proxy counts the release requests that reached the server.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock.testing.faults import PAUSE, FaultProxy, Rule
from fencelock.testing.servers import RedisServer
from tests.conftest import lock_value

HELD_BACK = 0.2


def _outcome(call: Any) -> Any:
    try:
        call()
    except fencelock.LockError as exc:
        return exc
    return None


@pytest.mark.parametrize("stolen", [False, True], ids=["held", "stolen"])
@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_two_releases_at_once_send_one_request_and_both_get_its_outcome(own_server: RedisServer, name: str,
                                                                         front: str, stolen: bool) -> None:
    raw: Any = own_server.client()
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"
        outcomes: list[Any] = []
        if front == "sync":
            with fencelock.connect(url) as locks:
                lease = locks.acquire(name, ttl=5.0, wait=0)
                if stolen:
                    raw.delete(f"fencelock:{{{name}}}:lock")
                held = proxy.arm(Rule(PAUSE, "release", delay=HELD_BACK))
                first = threading.Thread(target=lambda: outcomes.append(_outcome(lease.release)))
                first.start()
                assert held.hit.wait(5)
                outcomes.append(_outcome(lease.release))  # while the first one is held back
                first.join()
        else:
            async def main() -> None:
                async with fencelock.aio.connect(url) as locks:
                    lease = await locks.acquire(name, ttl=5.0, wait=0)
                    if stolen:
                        raw.delete(f"fencelock:{{{name}}}:lock")
                    held = proxy.arm(Rule(PAUSE, "release", delay=HELD_BACK))

                    async def release() -> Any:
                        try:
                            await lease.release()
                        except fencelock.LockError as exc:
                            return exc
                        return None

                    first = asyncio.ensure_future(release())
                    assert await asyncio.to_thread(held.hit.wait, 5)
                    second = await release()
                    outcomes.extend([await first, second])

            asyncio.run(main())
    assert len(outcomes) == 2
    if stolen:
        assert all(isinstance(o, fencelock.LockLost) for o in outcomes), outcomes
        assert outcomes[0] is not outcomes[1]  # each caller its own exception, naming the lock
        assert all(o.name == name for o in outcomes)
    else:
        assert outcomes == [None, None]  # (before: one of them raised LockLost, "gone from the server")
    assert lock_value(raw, name) is None
    releases = [r for r in proxy.requests if r.name == "release" and r.args[0] == b"EVALSHA"]
    assert len(releases) == 1, [r.args[0] for r in proxy.requests if r.name == "release"]
