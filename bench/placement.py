"""Where the benchmark process and the servers run: CPU affinity for the uncontended workload.

On a small VM the scheduler moves a client and its server between cores at will, and a request answered on the
same core costs about half as much as one answered across cores (no cross-core wake-up). Left alone, rounds flip
between the two modes and a ratio of medians can land on either: two rows of the same run disagree by 2x. So
the uncontended workload is measured under fixed placements:

    split    client on one core, servers on another: like a real deployment (the server is elsewhere, each
             request pays a wake-up), and the placement the targets are judged on
    shared   client and servers on one core: wall time = client CPU + server CPU, the pure cost of the code
    free     no pinning (fewer than two usable cores, or no sched_setaffinity on this OS)

Redlock rows run in the same placements, with every node pinned where the single server is. With two cores
there is no faithful copy of "one machine per node": in split the nodes share CPU 1, so a request written to
five nodes is served by five processes one after the other (a real deployment serves them side by side). That
costs every Redlock row alike (and the hand-written Redlock floor shows how much), and keeps the Redlock rows
comparable with the single-node rows of the same placement, which the 5-node / 1-node target needs. Leaving
the nodes free instead lets the scheduler move client and nodes between the cores at will: the noise this module
exists to avoid.

Every thread is pinned, not only the main one: the client's threads (fencelock's and pottery's fan-out pools,
which inherit from the thread that starts them, but may have started before) and the servers' own threads.

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
        Placement("split", f"client on CPU {client}, server (every Redlock node too) on CPU {server}",
                  frozenset({client}), frozenset({server})),
        Placement("shared", f"client and server(s) on CPU {client}", frozenset({client}), frozenset({client})),
    ]


def _threads(pid: int) -> list[int]:
    """The thread ids of process `pid` (Linux: /proc/PID/task), or just `pid` where that cannot be listed."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return [pid]


def _pin(pid: int, cpus: frozenset[int] | set[int]) -> None:
    """Pin every thread of process `pid` (a thread that has just ended needs no pinning)."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            pass


@contextmanager
def placed(placement: Placement, server_pids: Sequence[int]) -> Iterator[None]:
    """Pin every thread of this process and of the given server processes (ours: started by this run) for the
    duration; afterwards every thread of each (also one started meanwhile) gets the process's old CPUs back."""
    if placement.client is None or placement.server is None:
        yield
        return
    me = os.getpid()
    saved: dict[int, set[int]] = {}
    for pid in (me, *server_pids):
        try:
            saved[pid] = os.sched_getaffinity(pid)
        except ProcessLookupError:  # a server that is gone needs no pinning
            pass
    try:
        _pin(me, placement.client)
        for pid in saved:
            if pid != me:
                _pin(pid, placement.server)
        yield
    finally:
        for pid, cpus in saved.items():
            _pin(pid, cpus)
