"""Grants that wait for durability: what `connect(..., durability=...)` takes, the command pipelined after each
grant or extend (WAIT or WAITAOF), and what its answer means. No I/O.

    durability=None        off (the default): a grant counts once the primary answered
    durability="replica"   WAIT 1 <timeout>: at least one replica acknowledged the write
    durability=N (int)     WAIT N <timeout>: at least N replicas acknowledged it
    durability="aof"       WAITAOF 1 0 <timeout>: the primary fsynced it to its append-only file

A grant whose confirmation does not come within `durability_timeout` is given back (compare-and-delete) and the
caller gets `NotDurable`; an extend that is not confirmed claims no new validity. What WAIT does not promise is in
`docs/design/durability.md`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .._logic.args import seconds_of, shown_number

DEFAULT_DURABILITY_TIMEOUT = 1.0
"""Seconds the server waits for the confirmation before it answers with what it has (a grant is then refused)."""

MAX_REPLICAS = 1000
"""The largest replica count taken (a typo such as 10000 is refused rather than waited for in vain)."""

MODES = ("replica", "aof")


@dataclass(frozen=True)
class Durability:
    """A checked `durability` setting: `mode` "replica" (confirmed by `replicas` replicas) or "aof" (by the
    primary's fsync), each within `timeout` seconds."""

    mode: str
    replicas: int
    timeout: float

    @property
    def timeout_ms(self) -> int:
        return max(1, math.ceil(self.timeout * 1000.0))

    @property
    def command(self) -> tuple[str | int, ...]:
        """The command sent right after the script, on the same connection (it waits for that connection's writes)."""
        if self.mode == "aof":
            return "WAITAOF", 1, 0, self.timeout_ms
        return "WAIT", self.replicas, self.timeout_ms

    @property
    def shown(self) -> str:
        """The setting as a message names it."""
        return "durability='aof'" if self.mode == "aof" else (
            "durability='replica'" if self.replicas == 1 else f"durability={self.replicas}")

    def wanted(self) -> str:
        return "an fsync of the primary's append-only file" if self.mode == "aof" else (
            f"{self.replicas} replica{'s' if self.replicas > 1 else ''}")

    def confirmed(self, answer: Any) -> bool:
        """True if the WAIT / WAITAOF answer confirms the write. An error answer raises `Unsupported`."""
        if isinstance(answer, Exception):
            raise Unsupported(f"{self.shown} needs {self.command[0]} (WAITAOF: Redis >= 7.2, with appendonly "
                              f"yes), but the server answered: {answer}")
        if self.mode == "aof":
            return isinstance(answer, list) and len(answer) == 2 and int(answer[0]) >= 1
        return int(answer) >= self.replicas

    def got(self, answer: Any) -> str:
        """What the answer confirmed, for messages."""
        if self.mode == "aof":
            local = int(answer[0]) if isinstance(answer, list) and answer else 0
            return "the primary's fsync confirmed" if local else "no fsync confirmed"
        count = int(answer)
        return f"{count} replica{'' if count == 1 else 's'} acknowledged"

    def probe(self) -> tuple[str | int, ...] | None:
        """A command that fails at once on a server that cannot give this confirmation, and writes nothing (None:
        every Redis since 3.0 has WAIT)."""
        return ("WAITAOF", 1, 0, 1) if self.mode == "aof" else None


class Unsupported(Exception):
    """The server cannot give the confirmation asked for (no WAITAOF, or no append-only file)."""


def check_durability(value: object, timeout: object) -> Durability | None:
    """`durability` and `durability_timeout`, checked (before anything is sent); None: off."""
    if timeout is not None:
        seconds = _timeout(timeout)
    if value is None:
        if timeout is not None:
            raise ValueError(f"durability_timeout={timeout!r} needs durability='replica', a replica count or "
                             "'aof'; durability is off")
        return None
    if timeout is None:
        seconds = DEFAULT_DURABILITY_TIMEOUT
    if isinstance(value, bool):
        raise TypeError(f"durability must be None, 'replica', 'aof' or a number of replicas, got bool {value!r}")
    if isinstance(value, int):
        if not 1 <= value <= MAX_REPLICAS:
            raise ValueError(f"durability must be a number of replicas from 1 to {MAX_REPLICAS}, got "
                             f"{shown_number(value)}")
        return Durability("replica", value, seconds)
    if isinstance(value, str):
        if value not in MODES:
            raise ValueError(f"durability must be None, 'replica', 'aof' or a number of replicas, got {value!r}")
        return Durability(value, 1 if value == "replica" else 0, seconds)
    raise TypeError(f"durability must be None, 'replica', 'aof' or a number of replicas, got "
                    f"{type(value).__name__} {value!r}")


def _timeout(value: object) -> float:
    number = seconds_of(value, "durability_timeout")
    if not math.isfinite(number) or not 0.001 <= number <= 3600.0:
        raise ValueError(f"durability_timeout must be a number of seconds from 0.001 to 3600, got {value!r}")
    return number


def check_against_socket(durability: Durability, socket_timeout: float | None) -> None:
    """The server answers only after `durability_timeout`: the read of that answer must not be cut first."""
    if socket_timeout is not None and durability.timeout > socket_timeout / 2:
        raise ValueError(f"durability_timeout must be at most half the socket timeout ({socket_timeout} s), so "
                         f"that the confirmation's answer is read before the socket gives up; got "
                         f"{durability.timeout}")
