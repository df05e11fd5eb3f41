"""How a lock name maps to Redis keys.

Every key of one name carries the same hash tag, so that one Lua script can touch them all on Redis Cluster:

    fencelock:{<name>}:lock     the lease: value = the holder's token, PX = the TTL
    fencelock:{<name>}:fence    the fence counter; on one Redis it expires once idle (`fences.fence_keep_ms`)
    fencelock:{<name>}:waiters  set by a failed attempt, lives as long as the holder's key: "someone waits"
    fencelock:{<name>}:wake     a list a release pushes to when someone waits; waiters BLPOP it
    fencelock:{<name>}:queue    fair mode: the waiting tokens, oldest first
    fencelock:{<name>}:deadlines  fair mode: when each queue entry expires (a zset, server milliseconds)
    fencelock:{<name>}:wake:<token>  fair mode: the list one waiter BLPOPs; the release wakes only the head

`<name>` is the name as the user gave it, with `%`, `{` and `}` percent-encoded, so that a brace in a name can
never move the hash tag (an empty or shifted tag would scatter the keys over several slots).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from redis.crc import key_slot

PREFIX = "fencelock"

_ENCODE = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


class RedisKeys(NamedTuple):
    lock: str
    fence: str
    waiters: str
    wake: str
    queue: str


def encode_name(name: str) -> str:
    return name.translate(_ENCODE)


_DECODE = {"%25": "%", "%7B": "{", "%7D": "}"}


def decode_name(encoded: str) -> str:
    return re.sub("%25|%7B|%7D", lambda match: _DECODE[match.group()], encoded)


def tag(name: str, prefix: str = PREFIX) -> str:
    """The common start of every key of `name`: `fencelock:{<encoded name>}`."""
    return f"{prefix}:{{{encode_name(name)}}}"


@lru_cache(maxsize=65536)  # the watchdog asks for every renewed lease's keys at every renewal
def redis_keys(name: str, prefix: str = PREFIX) -> RedisKeys:
    base = tag(name, prefix)
    return RedisKeys(f"{base}:lock", f"{base}:fence", f"{base}:waiters", f"{base}:wake", f"{base}:queue")


def fair_keys(name: str, prefix: str = PREFIX) -> tuple[str, str]:
    """The fair queue's deadlines key, and the prefix of its waiters' own wake lists."""
    base = tag(name, prefix)
    return f"{base}:deadlines", f"{base}:wake:"


_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def glob_escape(text: str) -> str:
    """`text` as a SCAN MATCH glob that matches exactly it: a prefix such as `app[1]` is not a pattern."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def fence_match(prefix: str = PREFIX) -> str:
    """The SCAN MATCH glob for every fence key of `prefix` (a Redlock repair reads them all)."""
    return glob_escape(prefix) + ":{*}:fence"


def scan_match(pattern: str, prefix: str = PREFIX) -> str:
    """The SCAN MATCH glob for the lock keys of the names `pattern` (fnmatch) may match.

    Where `pattern` uses only `*`, `?` and characters that read the same in a key, the server filters by it;
    otherwise (brackets, backslashes, and the characters a key encodes) it returns every lock key. Either way
    the caller filters the names with fnmatch: this only saves traffic, it decides nothing.
    """
    head = glob_escape(prefix) + ":{"
    if any(c in pattern for c in "[]\\%{}"):
        return head + "*}:lock"
    return head + pattern + "}:lock"


def name_of_lock_key(key: str | bytes, prefix: str = PREFIX) -> str | None:
    """The lock name a `fencelock:{<encoded name>}:lock` key belongs to (None: not a lock key of `prefix`, or
    not UTF-8, which fencelock never writes)."""
    if isinstance(key, bytes):
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            return None
    else:
        text = key
    start, end = f"{prefix}:{{", "}:lock"
    if not (text.startswith(start) and text.endswith(end)) or len(text) < len(start) + len(end):
        return None
    encoded = text[len(start):-len(end)]
    if "{" in encoded or "}" in encoded:
        return None
    return decode_name(encoded)


def check_data_key(guard_key: str, data_key: bytes, name: str, cluster: bool) -> None:
    """The data key of a guarded write (`RedisGuard.set`), before anything is sent: never the guard's own key (its
    fence would be written over), and on a Redis Cluster in the guard key's hash slot (one script touches both)."""
    if data_key == guard_key.encode("utf-8"):
        raise ValueError(f"key must not be the guard's own key {guard_key!r}, which holds the highest fence "
                         f"(lock {name!r})")
    if cluster and key_slot(data_key) != key_slot(guard_key.encode("utf-8")):
        raise ValueError(f"key {data_key.decode('utf-8', 'replace')!r} is in hash slot {key_slot(data_key)}, not in "
                         f"the guard's ({key_slot(guard_key.encode('utf-8'))}): on a Redis Cluster one script writes "
                         f"both, so use guard.key(name, suffix) or the hash tag {{{encode_name(name)}}} in it "
                         f"(lock {name!r})")
