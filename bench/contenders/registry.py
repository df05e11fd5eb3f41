"""The registry's types: what a contender needs (`Need`), where it connects (`Target`), what its factory gives
(`Locker`, `AsyncLocker`), and `register()`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

TTL = 30.0
"""Seconds: the TTL of every acquisition in every row."""

Role = Literal["floor", "subject", "anchor", "info"]
"""floor: the least work a correct lock can do; subject: fencelock; anchor: a library users pick today;
info: measured and shown, no target depends on it."""


@dataclass(frozen=True)
class Need:
    """What a contender needs running: `nodes` servers of one `service`.

    "redis": one Redis-compatible server (the single-node rows). "redlock": `nodes` independent Redis masters,
    apart from the single-node server (later: "etcd", "zookeeper").
    """

    service: str
    nodes: int = 1

    def __str__(self) -> str:
        return self.service if self.nodes == 1 else f"{self.nodes} x {self.service}"


@dataclass(frozen=True)
class Target:
    """Where the servers of one `Need` listen (picklable: it is handed to worker processes)."""

    service: str
    urls: tuple[str, ...]

    @property
    def url(self) -> str:
        return self.urls[0]


@dataclass(frozen=True)
class Locker:
    """acquire/release callables bound to one client. `close` frees the client."""

    acquire: Callable[[str, float], object | None]
    release: Callable[[object], None]
    close: Callable[[], None]


@dataclass(frozen=True)
class AsyncLocker:
    acquire: Callable[[str, float], Awaitable[object | None]]
    release: Callable[[object], Awaitable[None]]
    close: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Reference:
    """The figures anchors.md gives for this contender (another run, redis-py 5.3), for comparison."""

    uncontended_us: float | None = None
    per_s: float | None = None
    wait_p99_ms: float | None = None
    longest_ms: float | None = None


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    role: Role
    need: Need
    make: Callable[[Target], Locker] | None = None
    make_async: Callable[[Target], AsyncLocker] | None = None
    uncontended: bool = True
    contended: bool = True
    reference: Reference = field(default_factory=Reference)
    note: str = ""
    cycles_scale: float = 1.0
    """Uncontended cycles (and warm-up) per round, as a share of the run's `--cycles`: a slow row makes fewer
    cycles per round, so that every round of every row takes a few tenths of a second."""
    runs: int | None = None
    """At most this many contended runs (None: as many as the run's `--runs`)."""

    @property
    def group(self) -> str:
        """What `--only` accepts besides the key: "single" (one Redis), else the service ("redlock", "etcd")."""
        return "single" if self.need.service == "redis" else self.need.service


REGISTRY: dict[str, Contender] = {}


def register(contender: Contender) -> Contender:
    if contender.key in REGISTRY:
        raise ValueError(f"contender {contender.key!r} registered twice")
    if (contender.make is None) == (contender.make_async is None):
        raise ValueError(f"contender {contender.key!r} needs exactly one of make / make_async")
    if contender.contended and contender.make is None:
        raise ValueError(f"contender {contender.key!r}: the contended workload runs sync lockers in processes")
    REGISTRY[contender.key] = contender
    return contender
