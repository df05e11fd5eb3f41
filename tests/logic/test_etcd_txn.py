"""The etcd lock's transactions (`fencelock._etcd.txn`), run against a small model of etcd's txn semantics. No server.

The model (`Store`) does what etcd does with the operations these bodies use: compares on CREATE and VALUE, puts,
deletes, and ranges (sort, limit, create-revision bounds, count and keys only), answering in the JSON gateway's
format (base64 keys, numbers as strings, zeros left out). The real server runs the same bodies in tests/etcd.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fencelock._etcd import txn
from fencelock._etcd.rules import Kv, Verdict, fence_key, lock_key, name_dir, range_end, verdict

PREFIX = "fencelock"


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


@dataclass
class _Entry:
    value: bytes
    create_revision: int
    lease: int
    version: int = 1


@dataclass
class Store:
    """etcd's key space, as far as the lock's transactions use it."""

    keys: dict[bytes, _Entry] = field(default_factory=dict)
    revision: int = 1

    def txn(self, body: dict[str, Any]) -> dict[str, Any]:
        body = json.loads(json.dumps(body))  # what goes over the wire: plain JSON
        succeeded = all(self._compare(c) for c in body.get("compare", ()))
        ops = body.get("success" if succeeded else "failure", ())
        wrote = False
        responses = []
        for op in ops:
            (kind, request), = op.items()
            if kind == "request_range":
                responses.append({"response_range": self.range(request)})
            elif kind == "request_put":
                key = _unb64(request["key"])
                if not wrote:
                    self.revision += 1
                    wrote = True
                old = self.keys.get(key)
                created = old.create_revision if old else self.revision
                self.keys[key] = _Entry(_unb64(request.get("value", "")), created, int(request.get("lease", 0)),
                                        old.version + 1 if old else 1)
                responses.append({"response_put": {}})
            elif kind == "request_delete_range":
                key = _unb64(request["key"])
                if key in self.keys:
                    if not wrote:
                        self.revision += 1
                        wrote = True
                    del self.keys[key]
                responses.append({"response_delete_range": {}})
            else:  # pragma: no cover - a body the model does not know
                raise AssertionError(kind)
        answer: dict[str, Any] = {"header": {"revision": str(self.revision)}, "responses": responses}
        if succeeded:
            answer["succeeded"] = True  # the gateway leaves out false
        return answer

    def _compare(self, compare: dict[str, Any]) -> bool:
        entry = self.keys.get(_unb64(compare["key"]))
        assert compare["result"] == "EQUAL"
        if compare["target"] == "CREATE":
            return (entry.create_revision if entry else 0) == int(compare.get("create_revision", 0))
        if compare["target"] == "VERSION":
            return (entry.version if entry else 0) == int(compare.get("version", 0))
        assert compare["target"] == "VALUE"
        return entry is not None and entry.value == _unb64(compare.get("value", ""))

    def range(self, request: dict[str, Any]) -> dict[str, Any]:
        start = _unb64(request["key"])
        end = _unb64(request["range_end"]) if "range_end" in request else None
        found = [(k, e) for k, e in self.keys.items() if (k == start if end is None else start <= k < end)]
        found = [(k, e) for k, e in found if e.create_revision >= int(request.get("min_create_revision", 0))]
        if "max_create_revision" in request:
            found = [(k, e) for k, e in found if e.create_revision <= int(request["max_create_revision"])]
        found.sort(key=lambda ke: ke[1].create_revision if request.get("sort_target") == "CREATE" else ke[0],
                   reverse=request.get("sort_order") == "DESCEND")
        count = len(found)
        answer: dict[str, Any] = {"count": str(count)} if count else {}
        if request.get("count_only"):
            return answer
        limit = int(request.get("limit", 0))
        kvs = []
        for key, entry in found[:limit] if limit else found:
            kv = {"key": base64.b64encode(key).decode(), "create_revision": str(entry.create_revision),
                  "version": str(entry.version)}
            if entry.lease:
                kv["lease"] = str(entry.lease)
            if entry.value and not request.get("keys_only"):
                kv["value"] = base64.b64encode(entry.value).decode()
            kvs.append(kv)
        if kvs:
            answer["kvs"] = kvs
        return answer


def _join(store: Store, name: str, token: str, lease: int) -> tuple[Kv | None, Kv | None]:
    return txn.joined(store.txn(txn.join(lock_key(PREFIX, name, lease), token, lease, name_dir(PREFIX, name))))


def test_the_first_to_join_holds_and_the_next_waits_behind_it() -> None:
    store = Store()
    mine, owner = _join(store, "job", "a", 1)
    assert mine is not None
    assert owner == mine
    assert verdict(mine, b"a", owner) is Verdict.GRANTED
    second, owner2 = _join(store, "job", "b", 2)
    assert second is not None
    assert owner2 == mine
    assert verdict(second, b"b", owner2) is Verdict.WAITING
    assert second.create_revision > mine.create_revision  # the fence of a later holder is larger


def test_a_join_retried_after_a_lost_answer_finds_its_own_key() -> None:
    store = Store()
    first, _ = _join(store, "job", "a", 1)
    _join(store, "job", "b", 2)
    written = store.revision
    again, owner = _join(store, "job", "a", 1)  # the same lease and token: the put is not made twice
    assert again == first
    assert owner == first
    assert store.revision == written  # a read only: no write, no watcher woken
    assert len(store.keys) == 2


def test_a_look_names_the_predecessor_only() -> None:
    store = Store()
    kvs = [_join(store, "job", token, lease)[0] for lease, token in enumerate("abcd", start=1)]
    assert all(kv is not None for kv in kvs)
    third = kvs[2]
    assert third is not None
    mine, owner, before, revision = txn.looked(
        store.txn(txn.look(third.key, name_dir(PREFIX, "job"), third.create_revision)), third.create_revision)
    assert (mine, owner) == (third, kvs[0])
    assert before is not None
    assert before.key == lock_key(PREFIX, "job", 2)
    assert revision == store.revision
    head = kvs[0]
    assert head is not None
    assert txn.looked(store.txn(txn.look(head.key, name_dir(PREFIX, "job"), head.create_revision)),
                      head.create_revision)[2] is None  # the holder has no predecessor


def test_release_deletes_only_our_key_and_records_its_fence() -> None:
    store, directory, fences = Store(), name_dir(PREFIX, "job"), fence_key(PREFIX, "job")
    mine, _ = _join(store, "job", "a", 1)
    assert mine is not None
    wrong = store.txn(txn.release(mine.key, "not-a", mine.create_revision, directory, fences))
    assert not wrong.get("succeeded")
    assert mine.key in store.keys
    done = store.txn(txn.release(mine.key, "a", mine.create_revision, directory, fences))
    assert done.get("succeeded")
    assert mine.key not in store.keys
    assert txn.headed(store.range(txn.head(directory))) == (None, 0)  # the fence key is no holder
    assert txn.fence_of(store.range(txn.last_fence(fences))) == mine.create_revision


def test_a_release_that_finds_its_key_gone_counts_who_came_after() -> None:
    store, directory, fences = Store(), name_dir(PREFIX, "job"), fence_key(PREFIX, "job")
    mine, _ = _join(store, "job", "a", 1)
    assert mine is not None
    del store.keys[mine.key]  # its lease expired
    assert txn.taken(store.txn(txn.release(mine.key, "a", mine.create_revision, directory, fences))) == 0
    assert txn.taken(store.txn(txn.count_newer(directory, mine.create_revision))) == 0
    _join(store, "job", "b", 2)
    assert txn.taken(store.txn(txn.release(mine.key, "a", mine.create_revision, directory, fences))) == 1
    assert txn.taken(store.txn(txn.count_newer(directory, mine.create_revision))) == 1


def test_a_release_with_no_fence_records_none() -> None:
    store, directory, fences = Store(), name_dir(PREFIX, "job"), fence_key(PREFIX, "job")
    mine, _ = _join(store, "job", "a", 1)
    assert mine is not None
    assert store.txn(txn.release(mine.key, "a", 0, directory, fences)).get("succeeded")
    assert fences not in store.keys


def test_check_tells_each_key_that_is_still_ours() -> None:
    store = Store()
    a, _ = _join(store, "x", "a", 1)
    b, _ = _join(store, "y", "b", 2)
    assert a is not None
    assert b is not None
    keys = [a.key, b.key, lock_key(PREFIX, "z", 3)]
    answer = store.txn(txn.check(keys))
    assert txn.still_ours(answer, [("a", a.create_revision, 1), ("b", b.create_revision, 2),
                                   ("c", 5, 3)]) == [True, True, False]
    assert txn.still_ours(answer, [("other", a.create_revision, 1), ("b", b.create_revision + 1, 2),
                                   ("c", 5, 3)]) == [False, False, False]
    assert txn.still_ours(answer, [("a", a.create_revision, 9), ("b", b.create_revision, 2),
                                   ("c", 5, 3)]) == [False, True, False]  # on another lease: not ours


def test_move_puts_the_key_on_a_new_lease_and_keeps_its_fence() -> None:
    store = Store()
    mine, _ = _join(store, "job", "a", 1)
    assert mine is not None
    assert mine.version == 1
    assert store.txn(txn.move(mine.key, "a", mine.create_revision, 7, 1)).get("succeeded")
    entry = store.keys[mine.key]
    assert (entry.lease, entry.create_revision, entry.value, entry.version) == (7, mine.create_revision, b"a", 2)
    assert not store.txn(txn.move(mine.key, "b", mine.create_revision, 8, 2)).get("succeeded")
    assert not store.txn(txn.move(mine.key, "a", mine.create_revision + 1, 8, 2)).get("succeeded")
    assert store.keys[mine.key].lease == 7


def test_of_two_moves_sent_at_one_version_only_the_first_to_arrive_applies() -> None:
    """A move whose answer never came, and the put on the old lease that voids it (`_settle`): in either order of
    arrival, exactly one applies, and a read tells which (the key's lease and version)."""
    for first, second in ((7, 1), (1, 7)):
        store = Store()
        mine, _ = _join(store, "job", "a", 1)
        assert mine is not None
        assert store.txn(txn.move(mine.key, "a", mine.create_revision, first, 1)).get("succeeded")
        assert not store.txn(txn.move(mine.key, "a", mine.create_revision, second, 1)).get("succeeded")
        [[kv]] = txn.ranges(store.txn(txn.check([mine.key])))
        assert (kv.lease, kv.version) == (first, 2)


def test_force_release_removes_the_holder_it_read_and_no_later_one() -> None:
    store, directory, fences = Store(), name_dir(PREFIX, "job"), fence_key(PREFIX, "job")
    holder, _ = _join(store, "job", "a", 1)
    _join(store, "job", "b", 2)
    owner, count = txn.headed(store.range(txn.head(directory)))
    assert holder is not None
    assert owner is not None
    assert (owner.key, owner.create_revision, count) == (holder.key, holder.create_revision, 2)
    assert store.txn(txn.force_release(owner, fences)).get("succeeded")
    assert txn.fence_of(store.range(txn.last_fence(fences))) == owner.create_revision
    # The same key made again (a new acquisition on the same lease) is not the holder that was read.
    _join(store, "job", "a", 1)
    assert not store.txn(txn.force_release(owner, fences)).get("succeeded")


def test_a_scan_page_reads_at_one_revision_once_known() -> None:
    head = f"{PREFIX}/".encode()
    first = txn.scan_page(head, range_end(head), 0, 500)
    assert "revision" not in first
    assert first["limit"] == 500
    assert first["keys_only"]
    assert txn.scan_page(head, range_end(head), 42, 500)["revision"] == 42


def test_a_fence_record_that_is_not_a_number_shows_none() -> None:
    store, fences = Store(), fence_key(PREFIX, "job")
    assert txn.fence_of(store.range(txn.last_fence(fences))) is None
    store.keys[fences] = _Entry(b"garbage", 2, 0)
    assert txn.fence_of(store.range(txn.last_fence(fences))) is None


names = st.text(min_size=1, max_size=20)


@given(names, names, st.integers(1, 2**63 - 1), st.text(min_size=1, max_size=10))
def test_every_key_a_join_touches_is_in_its_name_and_the_fence_key_never_is(
        name: str, other: str, lease: int, token: str) -> None:
    directory = name_dir(PREFIX, name)
    body = txn.join(lock_key(PREFIX, name, lease), token, lease, directory)
    end = range_end(directory)
    for op in body["success"] + body["failure"]:
        (request,) = op.values()
        assert directory <= _unb64(request["key"]) < end
        if "range_end" in request:
            assert _unb64(request["range_end"]) == end
    assert not directory <= fence_key(PREFIX, name) < end
    if other != name:  # another name's keys never fall in this name's range
        assert not directory <= lock_key(PREFIX, other, lease) < end
