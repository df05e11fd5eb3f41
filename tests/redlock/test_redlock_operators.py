"""What Redlock tells operators, on real nodes checked by an independent client: status, list and a forced release
never call a lock free that a silent node could prove held; `fencelock nodes` on a new deployment says it can be
granted, and shows the quarantine the servers keep (the longest any client asked for), not its own default."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisNodes

from ._support import _holds
from .test_redlock_losses import _restart_empty, _Three, three

__all__ = ["three"]  # (the fixture, for this module's tests)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fencelock", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FENCELOCK_URL": ""})


# -- 6: a silent node may complete a holder's quorum ---------------------------------------------------------------

def test_a_lock_held_on_a_node_that_does_not_answer_is_never_called_free(three: _Three, name: str) -> None:
    """X holds {A, B}; B stops answering. status(), list() and `fencelock status -q` used to call the lock free
    (only A and C answered, and they disagree), and force_release said nothing was held while it deleted A's key.
    Now each raises QuorumUnavailable naming what every node answered (CLI: exit 69)."""
    a, b = three.servers[0], three.servers[1]
    urls = three.urls()
    locks = fencelock.connect(urls)
    warm = locks.acquire(name + ":warm", ttl=1.0, wait=2.0)
    try:
        warm.release()
    except fencelock.QuorumUnavailable:  # (its 0.15 s node timeout, on a busy machine: the error says to go again)
        warm.release()
    with three.cut(2):
        held = locks.acquire(name, ttl=30.0, wait=0)
    assert locks.status(name).held
    with three.cut(1):                                # B stops answering (nothing sent meanwhile reaches it)
        with pytest.raises(fencelock.QuorumUnavailable, match="could complete a holder's quorum") as caught:
            locks.status(name)
        assert f"{urls[1]}: no answer" in str(caught.value)
        with pytest.raises(fencelock.QuorumUnavailable):
            locks.list()
        quiet = _cli("status", "-q", name, *[arg for url in urls for arg in ("--url", url)])
        assert quiet.returncode == 69, (quiet.returncode, quiet.stderr)
        with pytest.raises(fencelock.QuorumUnavailable):
            locks.force_release(name)
    assert _holds(b, name, held.token)            # B never heard the forced release
    assert not _holds(a, name, held.token)        # A did: the error says run it again
    assert locks.status(name).held is False       # all three answer: no holder has a quorum now
    locks.close()


def _until_kept(raw: Any, quarantine_ms: int, again: Callable[[], object] | None = None) -> None:
    """Wait until the node's incarnation keeps a quarantine of `quarantine_ms` (the look runs in the background
    after a grant). `again`: an acquire that looks once more, every 0.5 s meanwhile (a background look is best
    effort: one that met a pooled connection the restart had closed, not noticed yet, looks at the next acquire)."""
    deadline = time.monotonic() + 5.0
    retry = time.monotonic() + 0.5
    while True:
        born, until = raw.hmget("fencelock:redlock:incarnation", "born", "until")
        if born is not None and int(until) - int(born) == quarantine_ms:
            return
        assert time.monotonic() < deadline, (born, until)
        if again is not None and time.monotonic() > retry:
            again()
            retry = time.monotonic() + 0.5
        time.sleep(0.02)


# -- 10: `fencelock nodes` --------------------------------------------------------------------------------------------

@pytest.fixture
def nodes() -> Iterator[RedisNodes]:
    started = RedisNodes(3).start()
    yield started
    started.close()


def test_fencelock_nodes_says_a_new_deployment_can_be_granted_and_shows_the_quarantine_the_servers_keep(
        nodes: RedisNodes, name: str) -> None:
    """On a brand-new deployment `fencelock nodes` exited 69 ("cannot be granted") although the first acquire is
    granted at once; and for a node nobody looked at since its restart it showed its own default delay as the
    quarantine. Now: exit 0; a quarantine not started yet shows none; a started one ends when the servers keep it,
    the longest any client asked for."""
    args = [arg for url in nodes.urls for arg in ("--url", url)]
    new = _cli("nodes", *args, "--json")
    assert new.returncode == 0, new.stderr
    report = json.loads(new.stdout)
    assert report["available"] is True
    assert [n["quarantine_left"] for n in report["nodes"]] == [None, None, None]
    assert not any(node.client().exists("fencelock:redlock:incarnation") for node in nodes.nodes)
    shown = _cli("nodes", *args)
    assert shown.returncode == 0
    assert "new deployment" in shown.stdout
    locks = fencelock.connect(nodes.urls, repair_delay=30.0)
    locks.acquire(name, ttl=1.0, wait=0).release()     # granted at once, as `nodes` said

    _restart_empty(nodes.nodes[0])
    raw: Any = nodes.nodes[0].client()
    unseen = json.loads(_cli("nodes", *args, "--json").stdout)["nodes"][0]
    assert unseen["state"] == "fresh"
    assert unseen["quarantine_left"] is None
    locks.acquire(name, ttl=1.0, wait=0).release()     # a client with a 30 s delay looks: the quarantine starts
    _until_kept(raw, 30_000, lambda: locks.acquire(name, ttl=1.0, wait=0).release())
    started = json.loads(_cli("nodes", *args, "--json").stdout)["nodes"][0]
    assert 25.0 < started["quarantine_left"] <= 30.0
    longer = fencelock.connect(nodes.urls, repair_delay=45.0)
    longer.acquire(name, ttl=1.0, wait=0).release()    # one asking for 45 s: the servers keep the longest
    _until_kept(raw, 45_000, lambda: longer.acquire(name, ttl=1.0, wait=0).release())
    kept = json.loads(_cli("nodes", *args, "--json").stdout)["nodes"][0]
    assert 40.0 < kept["quarantine_left"] <= 45.0
    assert not raw.exists(redis_keys(name).lock)
    locks.close()
    longer.close()


def test_a_node_that_lost_its_data_is_silent_in_status_list_and_a_forced_release_never_free(
        three: _Three, name: str) -> None:
    """X holds {A, B}; B restarts empty (not ready: quarantined until repaired). B's "free" says nothing: it lost
    X's key. status(), list() and force_release() used to count it and call the lock free (B and C agree); now B
    is silent, as a node that does not answer, and each says it cannot tell (CLI: exit 69)."""
    a, b = three.servers[0], three.servers[1]
    urls = three.urls()
    locks = fencelock.connect(urls)
    locks.acquire(name + ":warm", ttl=1.0, wait=2.0).release()
    with three.cut(2):
        held = locks.acquire(name, ttl=30.0, wait=0)
    _restart_empty(b)
    with pytest.raises(fencelock.QuorumUnavailable, match="could complete a holder's quorum") as caught:
        locks.status(name)
    assert f"{urls[1]}: not ready" in str(caught.value)
    with pytest.raises(fencelock.QuorumUnavailable, match="not ready"):
        locks.list()
    quiet = _cli("status", "-q", name, *[arg for url in urls for arg in ("--url", url)])
    assert quiet.returncode == 69, (quiet.returncode, quiet.stderr)
    with pytest.raises(fencelock.QuorumUnavailable):
        locks.force_release(name)
    assert not _holds(a, name, held.token)  # A's key went: the error says run it again once B counts
    locks.close()


def test_a_node_url_that_points_at_another_listed_server_after_a_reconnect_is_refused(three: _Three, name: str) -> None:
    """C's URL is a proxy; while C is cut off, C goes away and the proxy is pointed at A (a DNS name or a virtual
    IP moved). The client's next connection there reaches A: identities are asked again after a node failed, so
    status() and acquire() raise NotIndependent instead of counting A twice (before, only the first contact
    asked)."""
    a = three.servers[0]
    locks = fencelock.connect(three.urls())
    locks.acquire(name + ":warm", ttl=1.0, wait=2.0).release()
    assert locks.status(name).held is False       # every node said who it is
    with three.cut(2):
        assert locks.status(name).held is False   # (A and B answer; C does not, and is asked again later)
        three.servers[2].kill()                   # C is gone, its connections with it ...
        three.proxies[2].target_port = a.port     # ... and C's URL reaches A from now on
    with pytest.raises(fencelock.NotIndependent, match="reach one server"):
        locks.status(name)
    with pytest.raises(fencelock.NotIndependent):
        locks.acquire(name, ttl=1.0, wait=0)
    locks.close()


def test_nodes_shows_when_a_node_not_trusted_after_a_restart_counts_again(nodes: RedisNodes, name: str) -> None:
    """A node restarted empty is not trusted until its quarantine ends and it is repaired: `nodes()` and
    `fencelock nodes` say when that is ("counts again in 29.9 s"), not only its state; before the quarantine
    started, how long it will last (the asking client's repair delay)."""
    args = [arg for url in nodes.urls for arg in ("--url", url)]
    locks = fencelock.connect(nodes.urls, repair_delay=30.0)
    locks.acquire(name, ttl=1.0, wait=0).release()
    _restart_empty(nodes.nodes[0])
    unseen = locks.nodes().nodes[0]
    assert unseen.counts_in == 30.0
    assert unseen.eta == "counts again 30.0 s after the next acquire (its quarantine starts then)"
    locks.acquire(name, ttl=1.0, wait=0).release()  # the look starts its quarantine
    _until_kept(nodes.nodes[0].client(), 30_000, lambda: locks.acquire(name, ttl=1.0, wait=0).release())
    waiting, ready = locks.nodes().nodes[:2]
    assert waiting.counts_in is not None
    assert 25.0 < waiting.counts_in <= 30.0
    assert re.fullmatch(r"counts again in (2\d|30)\.\d s", waiting.eta), waiting.eta
    assert (ready.counts_in, ready.eta) == (0.0, "counts now")
    shown = _cli("nodes", *args)
    assert "counts again in " in shown.stdout, shown.stdout
    assert re.search(r'"eta": "counts again in \d+\.\d s"', _cli("nodes", *args, "--json").stdout)
    locks.close()


def test_a_renewed_lease_counts_a_node_again_once_it_said_who_it_is_after_a_failure(three: _Three, name: str) -> None:
    """C misses one of the watchdog's renewals, so it is asked who it is again; the renewals alone must ask (no
    acquire, release or status in between), or C's "yes" would never count again, and with A cut off next the
    lease would be lost on a healthy quorum (B and C)."""
    locks = fencelock.connect(three.urls())
    lost: list[object] = []
    lease = locks.acquire(name, ttl=1.0, wait=2.0, renew=True, on_lost=lost.append)
    a, c = three.proxies[0], three.proxies[2]
    c.stall()
    time.sleep(0.8)                                # renewals meanwhile fail on C (the watchdog never stops sending)
    c.heal()
    time.sleep(0.8)                                # C answers the renewals again, and who it is
    a.stall()
    try:
        time.sleep(1.5)                            # B and C renew it: longer than its TTL
    finally:
        a.heal()
    assert not lost
    assert lease.remaining() > 0.0
    lease.release()
    locks.close()
