"""The Lua scripts, one file each, with a header naming KEYS, ARGV and the return value.

Scripts never build Lua from strings: data comes in only through KEYS and ARGV. Every script touches only the
keys of one lock name, which share one hash slot (see `fencelock._redis.keys`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Lua:
    name: str
    source: str
    sha: str


def _load(name: str) -> Lua:
    source = resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return Lua(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())


ACQUIRE = _load("acquire")
FAIR_ACQUIRE = _load("fair_acquire")
FAIR_LEAVE = _load("fair_leave")
RELEASE = _load("release")
EXTEND = _load("extend")
EXTEND_MANY = _load("extend_many")
GUARD_SET = _load("guard_set")
REDLOCK_ACQUIRE = _load("redlock_acquire")
REDLOCK_RELEASE = _load("redlock_release")
REDLOCK_EXTEND = _load("redlock_extend")
REDLOCK_EXTEND_MANY = _load("redlock_extend_many")
REDLOCK_GATE = _load("redlock_gate")
REDLOCK_MARK = _load("redlock_mark")
STATUS = _load("status")
FORCE_RELEASE = _load("force_release")
EVICTION = _load("eviction")
