# Generated from _async/etcd_operators.py by scripts/unasync.py: do not edit, edit that file instead.
"""The etcd backend's operators' calls (`status`, `list`, `force_release`): reads, and a removal, that hold no
lease. The lock's own transactions are in `etcd`."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from .._errors import BackendError
from .._etcd import txn
from .._etcd.rules import SCAN_PAGE, Kv, fence_key, kvs, name_dir, name_of, number, range_end
from .._logic.admission import Urgency
from .._logic.status import LockStatus
from .etcd_gateway import Gateway


class EtcdOperators:
    """What an etcd backend offers operators, over its gateway (`_gateway`) and key prefix (`_prefix`)."""

    _gateway: Gateway
    _prefix: str

    def _revoke(self, lease: int, name: str) -> None:
        """Best effort: end a lease (and delete the key on it). Unreachable: it ends with its TTL."""
        try:
            self._gateway.revoke(lease, name)
        except BackendError:
            pass

    def _head(self, name: str) -> tuple[Kv | None, int]:
        return txn.headed(self._gateway.read(txn.head(name_dir(self._prefix, name)), "status", name))

    def status(self, name: str) -> LockStatus:
        """The holder (the oldest key), its fence, its lease's TTL left (whole seconds) and the waiters.

        A free lock shows the fence of the last lease released through fencelock (`release()` or `force_release`
        record it in their transaction); None if none was: etcd keeps nothing of a lease that expired.
        """
        owner, count = self._head(name)
        if owner is None:
            last = txn.fence_of(self._gateway.read(txn.last_fence(fence_key(self._prefix, name)), "status",
                                                         name))
            return LockStatus(name, False, last, None, 0)
        return LockStatus(name, True, owner.create_revision, self._gateway.time_to_live(owner.lease, name),
                          count - 1)

    def scan(self, pattern: str) -> list[LockStatus]:
        """Every held lock whose name matches `pattern`, read in pages of `SCAN_PAGE` keys at one revision."""
        head = f"{self._prefix}/".encode()
        end = range_end(head)
        start, revision = head, 0
        found: dict[str, list[Any]] = {}  # name: [oldest key, keys]
        while True:
            data = self._gateway.read(txn.scan_page(start, end, revision, SCAN_PAGE), "list", None)
            revision = revision or number(data.get("header", {}).get("revision"))
            page = kvs(data)
            for kv in page:
                name = name_of(self._prefix, kv.key)
                if name is None or not fnmatchcase(name, pattern):
                    continue
                entry = found.setdefault(name, [kv, 0])
                entry[1] += 1
                if kv.create_revision < entry[0].create_revision:
                    entry[0] = kv
            if not data.get("more") or not page:
                break
            start = page[-1].key + b"\x00"
        statuses = []
        for name in sorted(found):
            owner, count = found[name]
            statuses.append(LockStatus(name, True, owner.create_revision,
                                       self._gateway.time_to_live(owner.lease, name), count - 1))
        return statuses

    def force_release(self, name: str) -> LockStatus:
        """Delete the holder's key and revoke its lease (the next waiter gets the lock); returns what was removed."""
        for _ in range(3):
            owner, count = self._head(name)
            if owner is None:
                return LockStatus(name, False, None, None, 0)
            remaining = self._gateway.time_to_live(owner.lease, name)
            # Not sent again by the gateway: a first sending that was applied would make the second report nothing
            # removed. (A failed compare reads the holder again, once the loop comes round.)
            answer = self._gateway.txn(txn.force_release(owner, fence_key(self._prefix, name)),
                                             "force-release", name, Urgency.NEW, again=False)
            if answer.get("succeeded"):
                self._revoke(owner.lease, name)
                return LockStatus(name, True, owner.create_revision, remaining, count - 1)
        raise BackendError("the holder kept changing while it was being removed", name=name)
