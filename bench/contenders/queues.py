"""The rows on the services where waiters queue: etcd (one member and three) and ZooKeeper (kazoo's recipe)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, cast

from .registry import TTL, Contender, Locker, Need, Target, register
from .subject import fencelock_async, fencelock_sync

# --------------------------------------------------------------------------------------------------------- etcd

def floor_etcd(target: Target) -> Locker:
    """etcd's least work, by hand over the JSON gateway with one httpx client: grant a lease, put the key only if
    absent (one txn); release by revoking the lease (which deletes only the key on it). Three round trips, no
    waiting, no fence check, no confirmation that the key was still ours."""
    import base64

    import httpx  # the etcd extra

    endpoint = "http://" + target.url.removeprefix("etcd://").split(",")[0]
    client = httpx.Client(base_url=endpoint, trust_env=False)

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        lease: object = client.post("/v3/lease/grant", json={"TTL": int(TTL)}).json()["ID"]
        key = base64.b64encode(name.encode()).decode()
        answer = client.post("/v3/kv/txn", json={
            "compare": [{"key": key, "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": key, "value": base64.b64encode(secrets.token_bytes(16)).decode(),
                                         "lease": lease}}]}).json()
        if answer.get("succeeded"):
            return lease
        client.post("/v3/lease/revoke", json={"ID": lease})
        return None

    def release(handle: object) -> None:
        client.post("/v3/lease/revoke", json={"ID": handle})

    return Locker(acquire, release, client.close)


ONE_ETCD = Need("etcd")
ETCD3 = Need("etcd", 3)

for _need, _where in ((ONE_ETCD, "1 member"), (ETCD3, "3 members")):
    _n = _need.nodes
    _suffix = "" if _n == 1 else str(_n)
    register(Contender(
        f"floor-etcd{_suffix}", f"floor: etcd by hand, {_where}", "floor", _need, make=floor_etcd,
        contended=False, cycles_scale=0.3,
        note="httpx on the JSON gateway: lease grant, txn put-if-absent, lease revoke",
    ))
    register(Contender(
        f"fencelock-etcd{_suffix}", f"fencelock etcd, {_where}", "subject", _need, make=fencelock_sync,
        cycles_scale=0.2, runs=2,
        note="fencelock.connect('etcd://...'): acquire(ttl=30) / lease.release(): grant, txn, txn, revoke",
    ))
register(Contender(
    "fencelock-aio-etcd", "fencelock.aio etcd, 1 member", "info", ONE_ETCD, make_async=fencelock_async,
    contended=False, cycles_scale=0.2,
    note="fencelock.aio.connect('etcd://...'), one task, for information",
))


# ---------------------------------------------------------------------------------------------------- ZooKeeper

def _kazoo_client(target: Target) -> Any:
    """A started kazoo client with its defaults (10 s session), at the host list of a `zookeeper://` URL."""
    from kazoo.client import KazooClient  # a bench-only dependency: imported only when this row runs

    from fencelock._zk.url import parse_zookeeper_url

    client = KazooClient(hosts=parse_zookeeper_url(target.url).hosts_string)
    client.start(timeout=10)
    return client


def _kazoo_close(client: Any) -> Callable[[], None]:
    def close() -> None:
        client.stop()
        client.close()

    return close


def floor_zookeeper(target: Target) -> Locker:
    """By hand with kazoo: create an ephemeral sequential node, list the children, delete it. No waiting, no TTL,
    no fence: the least a correct ZooKeeper lock does (the holder is known only once the queue is read)."""
    client = _kazoo_client(target)
    root = "/bench-floor"

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        path: str = client.create(f"{root}/{name}/{secrets.token_hex(16)}-", ephemeral=True, sequence=True,
                                  makepath=True)
        children = sorted(client.get_children(f"{root}/{name}"), key=lambda child: child[-10:])
        if path.rsplit("/", 1)[1] == children[0]:
            return path
        client.delete(path)
        return None

    def release(handle: object) -> None:
        client.delete(cast(str, handle))

    return Locker(acquire, release, _kazoo_close(client))


def kazoo_lock(target: Target) -> Locker:
    """kazoo's own `Lock` recipe: a uuid-prefixed ephemeral sequential node, each waiter watches its predecessor.
    Its lock lives as long as the client's session (10 s by default): it has no TTL of its own."""
    from kazoo.recipe.lock import Lock

    client = _kazoo_client(target)

    def acquire(name: str, wait: float) -> object | None:
        lock = Lock(client, f"/bench-kazoo/{name}")
        got = lock.acquire(blocking=wait > 0, timeout=wait if wait > 0 else None)
        return lock if got else None

    def release(handle: object) -> None:
        cast("Any", handle).release()

    return Locker(acquire, release, _kazoo_close(client))


ZOOKEEPER = Need("zookeeper")

register(Contender(
    "floor-zk", "floor: ZooKeeper by hand (kazoo)", "floor", ZOOKEEPER, make=floor_zookeeper, contended=False,
    cycles_scale=0.5,
    note="create ephemeral sequential + get_children + delete, with kazoo",
))
register(Contender(
    "fencelock-zk", "fencelock ZooKeeper", "subject", ZOOKEEPER, make=fencelock_sync, cycles_scale=0.5,
    note="fencelock.connect('zookeeper://...'): acquire(ttl=30) / lease.release()",
))
register(Contender(
    "kazoo-lock", "kazoo Lock recipe", "anchor", ZOOKEEPER, make=kazoo_lock, cycles_scale=0.5,
    note="kazoo.recipe.lock.Lock(client, path).acquire(blocking=, timeout=): watches its predecessor",
))
register(Contender(
    "fencelock-aio-zk", "fencelock.aio ZooKeeper", "info", ZOOKEEPER, make_async=fencelock_async,
    contended=False, cycles_scale=0.5,
    note="fencelock.aio.connect('zookeeper://...'), one task, for information",
))
