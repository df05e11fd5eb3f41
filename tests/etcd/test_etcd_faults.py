"""Answers that are lost or misleading (lease IDs another client chose, a grant or put whose answer never came), and
a cluster whose leader is killed while a lock is held."""

from __future__ import annotations

import base64
import secrets
import time
from typing import Any

import httpx
import pytest

import fencelock
from fencelock._etcd.rules import GRANT_TRIES
from fencelock.testing.etcd import EtcdCluster, EtcdDeployment, EtcdServer
from fencelock.testing.proxy import Proxy
from fencelock.testing.timing import slack
from tests.conftest import until
from tests.etcd.helpers import keys_of, lease_keys, lease_ttl, leases_of


def test_a_live_lease_of_another_client_is_never_taken_for_ours(etcd_server: EtcdServer, name: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Another client's live lease, with an ID that client picked itself.
    foreign = 0x5EED_0000_0000_0000 | secrets.randbits(48)
    etcd_server.request("/v3/lease/grant", {"ID": foreign, "TTL": 30})
    # The old code picked its own IDs (secrets.randbits(63)) and took "lease already exists" for a retry of its own
    # grant: with that source forced onto the other client's ID, it put its key on that lease.
    monkeypatch.setattr(secrets, "randbits", lambda bits: foreign)
    locks = fencelock.connect(etcd_server.url)
    try:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        [kv] = keys_of(etcd_server, name)
        assert int(kv["lease"]) != foreign
        assert lease_keys(etcd_server, foreign) == []
        # The other client ends its lease: our key stays, and our lease extends and releases as ours.
        etcd_server.request("/v3/lease/revoke", {"ID": foreign})
        assert [k["value"] for k in keys_of(etcd_server, name)] == [kv["value"]]
        lease.extend()
        assert not lease.lost
        lease.release()
        assert keys_of(etcd_server, name) == []
    finally:
        if lease_ttl(etcd_server, foreign) > 0:
            etcd_server.request("/v3/lease/revoke", {"ID": foreign})
        locks.close()


def test_an_id_the_server_chose_that_another_clients_lease_has_is_refused(own_etcd_server: EtcdServer,
                                                                         name: str) -> None:
    server = own_etcd_server
    # etcd draws the ID of a grant that asks for none from the counter that numbers its requests: a grant of ID 0
    # takes two numbers (the lease's, the request's), a grant of a given ID one. So after this probe, the server's
    # next choices are predictable, and another client that grants them first, with IDs of its own, makes them
    # collide: etcd then answers "lease already exists" about a lease that is not ours.
    probe = int(server.request("/v3/lease/grant", {"ID": 0, "TTL": 30})["ID"])
    taken = [probe + 14 + i for i in range(12)]  # 12 grants: the next choices are probe + 14, + 16, + 18, ...
    for lease in taken:
        server.request("/v3/lease/grant", {"ID": lease, "TTL": 30})
    foreign = {probe, *taken}
    assert leases_of(server) == foreign
    locks = fencelock.connect(server.url)
    try:
        with pytest.raises(fencelock.BackendError, match=f"{GRANT_TRIES} times .* already exists") as info:
            locks.acquire(name, ttl=5.0, wait=0)
        assert info.value.name == name
        assert keys_of(server, name) == []
        assert leases_of(server) == foreign  # it granted nothing, and put nothing on the others' leases
        assert all(lease_keys(server, lease) == [] for lease in foreign)
        # Once the other client's leases are gone, the same client acquires, on a lease of its own.
        for lease in taken:
            server.request("/v3/lease/revoke", {"ID": lease})
        with locks.lock(name, ttl=5.0, wait=0) as held:
            [kv] = keys_of(server, name)
            assert int(kv["lease"]) not in foreign
            assert base64.b64decode(kv["value"]).decode() == held.token
        # A single collision costs one more grant, not the acquisition.
        probe = int(server.request("/v3/lease/grant", {"ID": 0, "TTL": 30})["ID"])
        foreign = {probe, probe + 4, probe + 5}  # two grants: the next choice is probe + 4, then probe + 6
        for lease in sorted(foreign - {probe}):
            server.request("/v3/lease/grant", {"ID": lease, "TTL": 30})
        other = fencelock.connect(server.url)  # no spare lease: it grants
        try:
            with other.lock(name, ttl=5.0, wait=0) as held:
                [kv] = keys_of(server, name)
                assert int(kv["lease"]) not in foreign
        finally:
            other.close()
    finally:
        locks.close()


def test_a_grant_whose_answer_never_came_leaves_only_an_orphan_lease_that_its_ttl_ends(
        own_etcd_server: EtcdServer, name: str) -> None:
    server = own_etcd_server
    port = server.members[0].client_port
    # The URL's first endpoint is a proxy that hands what the client sends to the server 2 s late: the client gives
    # up on its grant after 0.5 s (closing that connection) and retries on the next endpoint, the same server
    # reached directly, while the proxy still delivers the first grant, which the server then makes.
    with Proxy("127.0.0.1", port, delay=2.0, delay_replies=False, name="late-grant") as late:
        locks = fencelock.connect(f"etcd://127.0.0.1:{late.port},127.0.0.1:{port}?timeout=0.5")
        try:
            started = time.monotonic()
            lease = locks.acquire(name, ttl=2.0, wait=5.0)
            # the retry did not wait for the first grant's answer (2 s late)
            assert time.monotonic() - started < min(0.5 + slack(1.3), 1.95)
            assert late.connections == 1
            [kv] = keys_of(server, name)
            ours = int(kv["lease"])
            until(lambda: len(leases_of(server)) == 2, 5.0, "the late grant reached the server")
            [orphan] = leases_of(server) - {ours}
            # Nothing of ours is on the orphan, counts it, or waits on it.
            assert lease_keys(server, orphan) == []
            status = locks.status(name)
            assert (status.held, status.fence, status.queued) == (True, lease.fence, 0)
            lease.release()
            for _ in range(5):  # later acquisitions (the first reuses the released lease) never land on it
                with locks.lock(name, ttl=2.0, wait=0):
                    [kv] = keys_of(server, name)
                    assert int(kv["lease"]) != orphan
            # Its TTL ends it (the lock's TTL, rounded up to whole seconds).
            until(lambda: orphan not in leases_of(server), 6.0, "the orphan lease expired")
        finally:
            locks.close()


def test_a_put_whose_answer_was_lost_is_found_again_by_its_retry(etcd_server: EtcdServer, name: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    locks = fencelock.connect(etcd_server.url)
    gateway: Any = locks.backend._gateway  # type: ignore[attr-defined]
    real = gateway.call
    lost: list[dict[str, Any]] = []

    def answer_lost_once(path: str, body: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        answer: dict[str, Any] = real(path, body, *args, **kwargs)
        if path == "/v3/kv/txn" and not lost and any("request_put" in op for op in body.get("success", ())):
            lost.append(answer)  # the server made the put; the client never hears of it
            raise fencelock.BackendError("the answer was lost", name=name) from httpx.ReadTimeout("lost")
        return answer

    monkeypatch.setattr(gateway, "call", answer_lost_once)
    try:
        before = leases_of(etcd_server)
        lease = locks.acquire(name, ttl=5.0, wait=0)  # a waiter behind its own key would be refused here
        assert lost
        assert lost[0]["succeeded"]
        [kv] = keys_of(etcd_server, name)
        assert int(kv["create_revision"]) == lease.fence  # the first put's key, recognised by lease and token
        assert base64.b64decode(kv["value"]).decode() == lease.token
        assert leases_of(etcd_server) - before == {int(kv["lease"])}  # one grant
        lease.release()
        assert keys_of(etcd_server, name) == []
    finally:
        locks.close()


# ------------------------------------------------------------------------------------------------ a cluster


@pytest.mark.slow
def test_killing_the_leader_keeps_the_lock_exclusive_and_the_fences_increasing(etcd_cluster: EtcdCluster,
                                                                              name: str) -> None:
    deployment = EtcdDeployment(etcd_cluster)
    holder_client = fencelock.connect(etcd_cluster.url)
    other_client = fencelock.connect(etcd_cluster.url)
    lost: list[fencelock.Lease] = []
    try:
        lease = holder_client.acquire(name, ttl=4.0, renew=True, on_lost=lost.append)
        leader = etcd_cluster.leader()
        etcd_cluster.kill(leader)
        overlaps = []
        fences = [lease.fence]
        end = time.monotonic() + 8.0  # two TTLs: a lease that survived was really renewed through the failover
        while time.monotonic() < end:
            try:
                other = other_client.acquire(name, ttl=4.0, wait=0)
            except (fencelock.NotAcquired, fencelock.BackendError):
                pass
            else:
                if not lease.lost:
                    overlaps.append(other.fence)
                fences.append(other.fence)
                other.release()
            time.sleep(0.1)
        assert overlaps == [], "another client got the lock while its holder still believed it held it"
        etcd_cluster.wait_leader(other_than=leader)
        if lost:
            # The loss signal fired: the server must really have let the lease go.
            assert deployment.holder(name) != lease.token
        else:
            assert not lease.lost
            assert deployment.holder(name) == lease.token
            lease.release()
        etcd_cluster.restart(leader)
        with other_client.lock(name, ttl=4.0, wait=10.0) as after:
            fences.append(after.fence)
        assert fences == sorted(set(fences))
    finally:
        holder_client.close()
        other_client.close()
