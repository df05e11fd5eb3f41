"""Where the benchmark process and the servers run: CPU affinity for the uncontended workload.

On a small VM the scheduler moves a client and its server between cores at will, and a request answered on the
same core costs about half as much as one answered across cores (no cross-core wake-up). Left alone, rounds flip
between the two modes and a ratio of medians can land on either: two rows of the same run disagree by 2x. So
the uncontended workload is measured under fixed placements:

    split    client on one core, servers on another: like a real deployment (the server is elsewhere, each
             request pays a wake-up), and the placement the targets are judged on
    shared   client and servers on one core: wall time = client CPU + server CPU, the pure cost of the code
    free     no pinning (fewer than two usable cores, or no sched_setaffinity on this OS)

The contended workload runs unpinned (its worker processes need every core).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    name: str
    description: str
    client: frozenset[int] | None  # None: leave as is
    server: frozenset[int] | None


FREE = Placement("free", "no pinning", None, None)


def _usable() -> list[int]:
    if not hasattr(os, "sched_getaffinity"):
        return []
    return sorted(os.sched_getaffinity(0))


def placements() -> list[Placement]:
    """The placements this machine allows: split (the headline) then shared, or free only."""
    cpus = _usable()
    if len(cpus) < 2:
        return [FREE]
    client, server = cpus[0], cpus[1]
    return [
        Placement("split", f"client on CPU {client}, server on CPU {server}", frozenset({client}),
                  frozenset({server})),
        Placement("shared", f"client and server on CPU {client}", frozenset({client}), frozenset({client})),
    ]


@contextmanager
def placed(placement: Placement, server_pids: Sequence[int]) -> Iterator[None]:
    """Pin this process and the given server processes (ours: started by this run) for the duration."""
    if placement.client is None or placement.server is None:
        yield
        return
    saved = {pid: os.sched_getaffinity(pid) for pid in (0, *server_pids)}
    try:
        os.sched_setaffinity(0, placement.client)
        for pid in server_pids:
            os.sched_setaffinity(pid, placement.server)
        yield
    finally:
        for pid, cpus in saved.items():
            try:
                os.sched_setaffinity(pid, cpus)
            except ProcessLookupError:  # a server that is gone needs no restoring
                pass
