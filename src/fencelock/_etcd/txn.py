"""The etcd lock's requests as pure functions: keys in, the JSON gateway's bodies out, and its answers back as `Kv`s.

A lock is a few transactions (`join`, `look`, `release`, `check`, `move`, `force_release`) and a few reads
(`head`, `last_fence`, `scan_page`); the backend sends them and acts on the decoded answers. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

from .rules import Kv, b64, kvs, number, range_end

Body = dict[str, Any]
"""One JSON body (or one operation inside a transaction) as the gateway takes it."""


# ------------------------------------------------------------------------------------------------ operations


def get(key: bytes, end: bytes | None = None, **options: Any) -> Body:
    """A range operation: `key` alone, or every key from `key` up to `end`; `options` as etcd's RangeRequest."""
    request: Body = {"key": b64(key)}
    if end is not None:
        request["range_end"] = b64(end)
    request.update(options)
    return {"request_range": request}


def oldest(directory: bytes) -> Body:
    """The key of `directory` with the lowest create revision: the holder."""
    return get(directory, range_end(directory), sort_order="ASCEND", sort_target="CREATE", limit=1)


def newer(directory: bytes, fence: int) -> Body:
    """How many keys of `directory` were created after `fence` (a count, no keys)."""
    return get(directory, range_end(directory), min_create_revision=fence + 1, count_only=True)


def put(key: bytes, value: bytes, lease: int = 0) -> Body:
    request: Body = {"key": b64(key), "value": b64(value)}
    if lease:
        request["lease"] = lease
    return {"request_put": request}


def delete(key: bytes) -> Body:
    return {"request_delete_range": {"key": b64(key)}}


def created_at(key: bytes, revision: int) -> Body:
    """Compare: `key` was created at `revision` (0: `key` does not exist)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": revision}


def at_version(key: bytes, version: int) -> Body:
    """Compare: `key` was put `version` times since its creation."""
    return {"key": b64(key), "target": "VERSION", "result": "EQUAL", "version": version}


def holds(key: bytes, value: bytes) -> Body:
    """Compare: `key` holds `value`."""
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def record_fence(fence_key: bytes, fence: int) -> Body:
    """Record the fence of a lease being released (in the release's transaction), for `status` of a free lock."""
    return put(fence_key, str(fence).encode())


# ------------------------------------------------------------------------------------------------ transactions


def join(key: bytes, token: str, lease: int, directory: bytes) -> Body:
    """Put our key on our lease if it is absent (a retry finds its own); either way read it and the holder."""
    looks = [get(key), oldest(directory)]
    return {"compare": [created_at(key, 0)], "success": [put(key, token.encode(), lease), *looks], "failure": looks}


def joined(answer: Body) -> tuple[Kv | None, Kv | None]:
    """`join`'s answer: our key and the holder's."""
    mine, owner = (found[0] if found else None for found in ranges(answer)[-2:])
    return mine, owner


def look(key: bytes, directory: bytes, revision: int) -> Body:
    """Read, at one revision: our key (created at `revision`), the holder's, and our predecessor's (the newest key
    created before ours)."""
    before = get(directory, range_end(directory), sort_order="DESCEND", sort_target="CREATE", limit=1,
                 max_create_revision=max(revision - 1, 1), keys_only=True)
    return {"success": [get(key), oldest(directory), before]}


def looked(answer: Body, revision: int) -> tuple[Kv | None, Kv | None, Kv | None, int]:
    """`look`'s answer: our key, the holder's, our predecessor's (None if we have none), and the revision read at."""
    mine, owner, before = (found[0] if found else None for found in ranges(answer))
    if before is not None and before.create_revision >= revision:
        before = None
    return mine, owner, before, number(answer.get("header", {}).get("revision"))


def release(key: bytes, token: str, fence: int, directory: bytes, fence_key: bytes) -> Body:
    """Delete our key if it still holds our token (and, given a fence, was created at it), recording the fence;
    if not, count the keys created after ours (`taken`)."""
    compare = [holds(key, token.encode())]
    success = [delete(key)]
    if fence:
        compare.append(created_at(key, fence))
        success.append(record_fence(fence_key, fence))
    return {"compare": compare, "success": success, "failure": [newer(directory, fence)]}


def count_newer(directory: bytes, fence: int) -> Body:
    """Only count the keys created after `fence` (a release of which nothing is left on the server)."""
    return {"success": [newer(directory, fence)]}


def taken(answer: Body) -> int:
    """The count of `release` (when it did not delete) or `count_newer`: keys created after the fence."""
    return number(answer["responses"][0]["response_range"].get("count"))


def check(keys: list[bytes]) -> Body:
    """Read each key (one transaction, at most `MAX_TXN_OPS` keys)."""
    return {"success": [get(key) for key in keys]}


def still_ours(answer: Body, expected: list[tuple[str, int, int]]) -> list[bool]:
    """`check`'s answer: whether each key still holds its (token, fence, lease)."""
    found = (kv[0] if kv else None for kv in ranges(answer))
    return [kv is not None and kv.value == token.encode() and kv.create_revision == fence and kv.lease == lease
            for kv, (token, fence, lease) in zip(found, expected, strict=True)]


def move(key: bytes, token: str, fence: int, lease: int, version: int) -> Body:
    """Put our key, if still ours and still at `version`, on `lease` (another, or the one it is on): its create
    revision (the fence) stays, its version goes up by one. Of two moves sent at one version, at most one is ever
    applied, whatever order they arrive in: a move whose answer never came is made void by another (`_settle`)."""
    return {"compare": [holds(key, token.encode()), created_at(key, fence), at_version(key, version)],
            "success": [put(key, token.encode(), lease)]}


def force_release(owner: Kv, fence_key: bytes) -> Body:
    """Delete the holder's key if it is still the one read, recording its fence."""
    return {"compare": [created_at(owner.key, owner.create_revision)],
            "success": [delete(owner.key), record_fence(fence_key, owner.create_revision)]}


def ranges(answer: Body) -> list[list[Kv]]:
    """The keys each range operation of a transaction's answer found, in order."""
    return [kvs(response.get("response_range", {})) for response in answer.get("responses", ())]


# ------------------------------------------------------------------------------------------------ reads


def head(directory: bytes) -> Body:
    """A range request (`/v3/kv/range`): the holder's key (no value) and, as `count`, how many keys queue."""
    return {"key": b64(directory), "range_end": b64(range_end(directory)), "sort_order": "ASCEND",
            "sort_target": "CREATE", "limit": 1, "keys_only": True}


def headed(answer: Body) -> tuple[Kv | None, int]:
    """`head`'s answer: the holder (None: the lock is free) and the number of keys."""
    found = kvs(answer)
    return (found[0] if found else None), number(answer.get("count"))


def last_fence(fence_key: bytes) -> Body:
    """A range request: the fence the last release recorded."""
    return {"key": b64(fence_key)}


def fence_of(answer: Body) -> int | None:
    """`last_fence`'s answer: the fence recorded, None if none was."""
    found = kvs(answer)
    return int(found[0].value) if found and found[0].value.isdigit() else None


def scan_page(start: bytes, end: bytes, revision: int, limit: int) -> Body:
    """A range request: up to `limit` keys from `start` to `end` (no values), at `revision` (0: the newest)."""
    body: Body = {"key": b64(start), "range_end": b64(end), "limit": limit, "keys_only": True}
    if revision:
        body["revision"] = revision
    return body
