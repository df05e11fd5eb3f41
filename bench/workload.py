"""The workloads. Every contender runs the same code; only its `Locker` differs.

uncontended   one client, one name nobody else wants: acquire (one attempt) + release, in a tight loop. Rounds
              of all contenders are interleaved (round 1 of each, then round 2 of each, ...), so a slow spell of the
              machine hits every row alike; the result is the median round.
contended     N worker processes (spawn: each imports the library and makes its own client), one shared name.
              Each loops: acquire (blocking, at most `wait` s), hold the critical section `hold` s, release,
              pause `pause` s, from a common start instant. Each acquisition records when it was
              requested, granted, and when its critical section ended, on CLOCK_MONOTONIC (one clock for all
              processes on Linux), so that overlapping critical sections can be counted across processes.
              Only the steady state is measured: the window of `duration` s opens `settle` s after the start
              (when all workers arrived at once and ran their first, colder, iterations) and every worker keeps
              going for `settle` s after it closes (a worker that stops pickles its records and closes its
              client, which the others waiting for the lock would otherwise pay for). A wait counts when it was
              requested inside the window, however long it then took; throughput counts grants inside it.
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any, TypeVar

import redis

from . import stats
from .contenders import REGISTRY, AsyncLocker, Contender, Locker, Target
from .placement import Placement, placed

Progress = Callable[[str], None]
T = TypeVar("T")


def _quiet(_: str) -> None:
    pass


# ------------------------------------------------------------------------------------------------- uncontended

@dataclass
class Uncontended:
    key: str
    cycles: int
    rounds_us: list[float] = field(default_factory=list)
    client_cpu_us: list[float] = field(default_factory=list)  # per cycle, each round: this process, every thread
    server_cpu_us: list[float] = field(default_factory=list)  # per cycle, each round: every server process
    proxy_cpu_us: list[float] = field(default_factory=list)   # per cycle, each round: every delay proxy (--latency)

    @property
    def median_us(self) -> float:
        return stats.median(self.rounds_us)

    @property
    def client_cpu_median_us(self) -> float:
        return stats.median(self.client_cpu_us) if self.client_cpu_us else math.nan

    @property
    def server_cpu_median_us(self) -> float:
        return stats.median(self.server_cpu_us) if self.server_cpu_us else math.nan

    @property
    def proxy_cpu_median_us(self) -> float:
        return stats.median(self.proxy_cpu_us) if self.proxy_cpu_us else math.nan

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "median_us": self.median_us, "min_us": min(self.rounds_us, default=math.nan),
                "max_us": max(self.rounds_us, default=math.nan)}


def servers_cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds (user + system, every thread) the server processes have used so far; NaN without /proc. The
    kernel counts in clock ticks (10 ms): a round of a second or more reads it to about 1 %."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return math.nan
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class _SyncRunner:
    def __init__(self, locker: Locker, name: str) -> None:
        self._locker = locker
        self._name = name

    def run(self, cycles: int) -> float:
        """Seconds for `cycles` acquire+release cycles."""
        acquire, release, name = self._locker.acquire, self._locker.release, self._name
        started = time.perf_counter()
        for _ in range(cycles):
            handle = acquire(name, 0.0)
            if handle is None:
                raise RuntimeError(f"{name!r} was busy in the uncontended workload")
            release(handle)
        return time.perf_counter() - started

    def close(self) -> None:
        self._locker.close()


class _AsyncRunner:
    """An async locker on its own event loop, kept for the whole run (its connections live in that loop)."""

    def __init__(self, make: Callable[[Target], AsyncLocker], target: Target, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._name = name

        async def create() -> AsyncLocker:
            return make(target)  # inside the loop, in case the client binds to the running loop

        self._locker = self._loop.run_until_complete(create())

    async def _cycles(self, cycles: int) -> float:
        acquire, release, name = self._locker.acquire, self._locker.release, self._name
        started = time.perf_counter()
        for _ in range(cycles):
            handle = await acquire(name, 0.0)
            if handle is None:
                raise RuntimeError(f"{name!r} was busy in the uncontended workload")
            await release(handle)
        return time.perf_counter() - started

    def run(self, cycles: int) -> float:
        return self._loop.run_until_complete(self._cycles(cycles))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._locker.close())
        finally:
            self._loop.close()


def scaled(count: int, contender: Contender, least: int = 10) -> int:
    """`count` cycles scaled by the contender's `cycles_scale` (a slow row makes fewer per round), at least `least`."""
    return max(least, round(count * contender.cycles_scale))


def uncontended(rows: Sequence[tuple[Contender, Target]], *, places: Sequence[Placement],
                server_pids: Sequence[int], rounds: int, cycles: int, warmup: int,
                proxy_pids: Sequence[int] = (), progress: Progress = _quiet) -> dict[str, dict[str, Uncontended]]:
    """placement name -> contender key -> result. Every contender runs in every placement, with the same clients.

    Each contender makes `cycles` (and `warmup`) scaled by its `cycles_scale` per round."""
    runners: dict[str, _SyncRunner | _AsyncRunner] = {}
    counts: dict[str, tuple[int, int]] = {}  # key -> (cycles, warm-up cycles)
    results: dict[str, dict[str, Uncontended]] = {}
    try:
        for contender, target in rows:
            name = f"bench:uncontended:{contender.key}"
            counts[contender.key] = (scaled(cycles, contender), scaled(warmup, contender))
            if contender.make is not None:
                runners[contender.key] = _SyncRunner(contender.make(target), name)
            elif contender.make_async is not None:
                runners[contender.key] = _AsyncRunner(contender.make_async, target, name)
        for place in places:
            found = results[place.name] = {key: Uncontended(key, counts[key][0]) for key in runners}
            with placed(place, server_pids):
                for key, runner in runners.items():
                    runner.run(counts[key][1])  # connect, load scripts, warm caches, settle on the new cores
                for index in range(rounds):
                    progress(f"uncontended, {place.name}: round {index + 1}/{rounds} "
                             f"({len(runners)} contenders x {cycles} cycles, fewer for the slow ones)")
                    for key, runner in runners.items():
                        gc.collect()
                        n = counts[key][0]
                        client, servers = time.process_time(), servers_cpu_s(server_pids)
                        proxies = servers_cpu_s(proxy_pids) if proxy_pids else math.nan
                        found[key].rounds_us.append(runner.run(n) / n * 1e6)
                        # Only this row's servers work during its round (the others idle), so all of them count.
                        found[key].client_cpu_us.append((time.process_time() - client) / n * 1e6)
                        found[key].server_cpu_us.append((servers_cpu_s(server_pids) - servers) / n * 1e6)
                        if proxy_pids:
                            found[key].proxy_cpu_us.append((servers_cpu_s(proxy_pids) - proxies) / n * 1e6)
    finally:
        for runner in runners.values():
            runner.close()
    return results


# --------------------------------------------------------------------------------------------------- contended

@dataclass(frozen=True)
class ContendedParams:
    workers: int = 8
    duration: float = 5.0
    hold: float = 0.001
    pause: float = 0.0005
    wait: float = 10.0
    settle: float = 0.3  # seconds of running before the measured window opens, and after it closes


@dataclass(frozen=True)
class _WorkerReport:
    index: int
    records: list[tuple[float, float, float]]  # (requested, granted, critical section ended)
    timeouts: int
    error: str | None


@dataclass
class Contended:
    """One contender's contended result, pooled over its runs (each run: fresh processes, same parameters)."""

    key: str
    params: ContendedParams
    runs: int = 0
    acquisitions: int = 0
    per_s: float = math.nan
    runs_per_s: list[float] = field(default_factory=list)
    runs_wait_p99_ms: list[float] = field(default_factory=list)  # each run's own, for targets judged on the median
    runs_longest_ms: list[float] = field(default_factory=list)
    wait_p50_ms: float = math.nan
    wait_p99_ms: float = math.nan
    longest_ms: float = math.nan
    # The longest wait taken apart: the critical sections other workers held while it lasted (their sum, and the
    # longest one), and the rest of it (hand-offs, and the waiter's own way in).
    longest_holds_ms: float = math.nan
    longest_top_hold_ms: float = math.nan
    gap_p50_ms: float = math.nan
    hold_mean_ms: float = math.nan  # measured critical section (the workers ask for `hold`; sleep overshoots)
    outside_mean_ms: float = math.nan  # from a critical section's end to the same worker's next request
    busy_fraction: float = math.nan
    timeouts: int = 0
    overlaps: int = 0
    per_worker: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ContendedRun:
    """The raw outcome of one run: every worker's records, and the window measured (the workers ran `settle` s
    longer on each side)."""

    key: str
    window: tuple[float, float]
    reports: list[_WorkerReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _worker(key: str, target: Target, index: int, name: str, params: ContendedParams,
            ready: Queue[tuple[int, str | None]], go: Queue[tuple[float, float]],
            results: Queue[_WorkerReport]) -> None:
    """One worker process: connect, warm up, report ready, wait for the common start, loop until the end."""
    try:
        make = REGISTRY[key].make
        assert make is not None
        locker = make(target)
        # A name of its own, so it never waits for another worker; the wait covers a fresh Redlock deployment's
        # set-up, which every worker joins at once (see `fresh_nodes`).
        warm = locker.acquire(f"{name}:warm:{index}", WARM_UP_WAIT)
        if warm is None:
            raise RuntimeError(f"warm-up acquire of a free name not granted within {WARM_UP_WAIT} s")
        locker.release(warm)
    except BaseException as exc:
        ready.put((index, f"worker {index} (pid {os.getpid()}): {type(exc).__name__}: {exc}"))
        return
    ready.put((index, None))
    records: list[tuple[float, float, float]] = []
    timeouts = 0
    error: str | None = None
    try:
        start, end = go.get(timeout=120)
        acquire, release, hold, pause, wait = locker.acquire, locker.release, params.hold, params.pause, params.wait
        clock, sleep = time.monotonic, time.sleep
        sleep(max(0.0, start - clock()))
        while True:
            requested = clock()
            if requested >= end:
                break
            handle = acquire(name, wait)
            granted = clock()
            if handle is None:
                timeouts += 1
                continue
            sleep(hold)
            ended = clock()
            release(handle)
            records.append((requested, granted, ended))
            sleep(pause)
    except Exception as exc:
        error = f"worker {index} (pid {os.getpid()}): {type(exc).__name__}: {exc}"
    finally:
        locker.close()
    results.put(_WorkerReport(index, records, timeouts, error))


WARM_UP_WAIT = 5.0
"""Seconds a worker's first acquire (of a free name) may take."""


def fresh_nodes(urls: Sequence[str]) -> None:
    """Empty every Redlock node (FLUSHALL): the deployment is brand new to the workers that start next."""
    for url in urls:
        client = redis.Redis.from_url(url)
        try:
            client.flushall()
        finally:
            client.close()


class _NoAnswer(RuntimeError):
    pass


def _get(source: Queue[T], procs: Sequence[BaseProcess], deadline: float) -> T:
    """The next item, unless every worker died or the deadline passed first (then `_NoAnswer`)."""
    while True:
        try:
            return source.get(timeout=0.5)
        except queue.Empty:
            if not any(proc.is_alive() for proc in procs):
                try:  # the last one may have put its answer just before it exited
                    return source.get(timeout=1.0)
                except queue.Empty:
                    pass
                codes = sorted({proc.exitcode for proc in procs}, key=str)
                raise _NoAnswer(f"every worker exited without answering (exit codes {codes})") from None
            if time.monotonic() > deadline:
                raise _NoAnswer("the workers did not answer in time") from None


def contended_run(contender: Contender, target: Target, params: ContendedParams,
                  progress: Progress = _quiet, run: int = 0) -> ContendedRun:
    """One run: start the workers, let them warm up, start them together, collect what they measured.

    Each run of a contender contends for a name of its own (`run`), so that nothing a run leaves behind (a key a
    Redlock node still holds until its TTL ends) weighs on the next one. Redlock nodes start each run empty, so
    the workers find a fresh deployment and all set it up at once, as a new user's workers do."""
    if target.service == "redlock":
        fresh_nodes(target.urls)
    ctx = multiprocessing.get_context("spawn")
    ready: Queue[tuple[int, str | None]] = ctx.Queue()
    go: Queue[tuple[float, float]] = ctx.Queue()
    results: Queue[_WorkerReport] = ctx.Queue()
    name = f"bench:contended:{contender.key}:{run}"
    out = ContendedRun(contender.key, (0.0, 0.0))
    procs = [ctx.Process(target=_worker, args=(contender.key, target, i, name, params, ready, go, results),
                         name=f"bench-{contender.key}-{i}", daemon=True) for i in range(params.workers)]
    progress(f"contended: {contender.label}: starting {params.workers} processes")
    for proc in procs:
        proc.start()
    reports = out.reports
    try:
        for _ in procs:
            _, problem = _get(ready, procs, time.monotonic() + 120)
            if problem is not None:
                out.errors.append(problem)
        if not out.errors:  # else the window stays empty: everyone who is ready stops at once
            start = time.monotonic() + 0.1
            out.window = (start + params.settle, start + params.settle + params.duration)
            progress(f"contended: {contender.label}: running {params.duration + 2 * params.settle:g} s")
        for _ in procs:  # (an empty window if a worker failed: everyone who is ready stops at once)
            go.put((out.window[0] - params.settle, out.window[1] + params.settle) if out.window[1] else out.window)
        running = params.workers - len(out.errors)
        deadline = time.monotonic() + params.duration + 2 * params.settle + params.wait + 60
        while len(reports) < running:
            reports.append(_get(results, procs, deadline))
    except _NoAnswer as exc:
        out.errors.append(str(exc))
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    return out


def summarise(key: str, params: ContendedParams, runs: Sequence[ContendedRun]) -> Contended:
    """Pool the runs of one contender: counts and durations add up, percentiles are over every sample."""
    out = Contended(key, params, runs=len(runs))
    waits_ms: list[float] = []
    gaps_s: list[float] = []
    holds_s: list[float] = []
    outside_s: list[float] = []  # release + pause: the part of a worker's loop outside acquire and the section
    busy = duration = 0.0
    longest: tuple[float, list[float]] = (-1.0, [])  # the longest wait so far, and the sections held during it
    for run in runs:
        start, end = run.window
        out.errors.extend(run.errors)
        out.errors.extend(report.error for report in run.reports if report.error is not None)
        out.timeouts += sum(report.timeouts for report in run.reports)
        counts = [sum(start <= granted < end for _, granted, _ in report.records) for report in run.reports]
        out.per_worker.extend(counts)
        out.acquisitions += sum(counts)
        if end <= start:
            continue
        duration += end - start
        out.runs_per_s.append(sum(counts) / (end - start))
        records = [record for report in run.reports for record in report.records]
        inside = [record for record in records if start <= record[0] < end]  # requested inside the window
        run_waits_ms = [(granted - requested) * 1e3 for requested, granted, _ in inside]
        waits_ms.extend(run_waits_ms)
        if run_waits_ms:
            out.runs_wait_p99_ms.append(stats.percentile(run_waits_ms, 99))
            out.runs_longest_ms.append(max(run_waits_ms))
        if inside:
            requested, granted, _ = max(inside, key=lambda record: record[1] - record[0])
            if granted - requested > longest[0]:
                longest = granted - requested, [min(e, granted) - max(g, requested) for _, g, e in records
                                                if g < granted and e > requested]
        holds_s.extend(ended - granted for _, granted, ended in inside)
        for report in run.reports:
            outside_s.extend(nxt[0] - cur[2] for cur, nxt in pairwise(report.records) if start <= cur[0] < end)
        sections = [(granted, ended) for _, granted, ended in records]
        out.overlaps += stats.overlaps(sections)  # every section, settling time included: safety has no window
        gaps_s.extend(stats.gaps([(granted, ended) for _, granted, ended in inside]))
        busy += sum(max(0.0, min(b, end) - max(a, start)) for a, b in sections)
    out.per_worker.sort()
    if duration > 0:
        out.per_s = out.acquisitions / duration
        out.busy_fraction = busy / duration
    if waits_ms:
        out.wait_p50_ms = stats.percentile(waits_ms, 50)
        out.wait_p99_ms = stats.percentile(waits_ms, 99)
        out.longest_ms = max(waits_ms)
        out.longest_holds_ms = sum(longest[1]) * 1e3
        out.longest_top_hold_ms = max(longest[1], default=0.0) * 1e3
    if gaps_s:
        out.gap_p50_ms = stats.percentile(gaps_s, 50) * 1e3
    if holds_s:
        out.hold_mean_ms = sum(holds_s) / len(holds_s) * 1e3
    if outside_s:
        out.outside_mean_ms = sum(outside_s) / len(outside_s) * 1e3
    return out


def least_mean_wait_ms(result: Contended) -> float:
    """The shortest mean wait any lock could give these workers (Little's law on the closed loop).

    Each of the N workers loops: wait, hold (h), then release and pause (o). Critical sections never overlap, so
    at most 1/h acquisitions happen per second, and each worker's loop then lasts at least N x h on average:
    mean wait >= N x h - h - o, with h and o as measured in this run. Fair or not, no lock can do better; in a FIFO
    queue nearly every wait is about the mean, so its p99 cannot be below this either."""
    h, o = result.hold_mean_ms, result.outside_mean_ms
    return result.params.workers * h - h - o


def least_p99_ms(least_mean_ms: float, longest_ms: float) -> float:
    """The lowest wait p99 any lock can give when the mean wait is at least `least_mean_ms` and no wait is
    longer than `longest_ms`: at best 99 % of the waits sit at the p99 and the other 1 % at the longest, so
    0.99 x p99 + 0.01 x longest >= the mean. A p99 below this needs waits past `longest_ms` (starvation)."""
    return (least_mean_ms - 0.01 * longest_ms) / 0.99


def most_hand_off_ms(result: Contended, p99_ms: float, longest_ms: float) -> float:
    """The longest hand-off (release to next grant) with which a FIFO lock could still give these workers a wait
    p99 of `p99_ms` with no wait past `longest_ms`. A hand-off of g makes each loop of the queue last N x (h + g),
    so the mean wait is N x (h + g) - h - o; and the mean is at most 0.99 x p99 + 0.01 x longest (least_p99_ms).
    Negative: no lock can, however fast its hand-off."""
    n, h, o = result.params.workers, result.hold_mean_ms, result.outside_mean_ms
    return (0.99 * p99_ms + 0.01 * longest_ms + h + o) / n - h


def most_per_s(result: Contended) -> float:
    """The most acquisitions per second any lock could give these workers: one critical section after another,
    with no hand-off at all (1 / the measured hold)."""
    return 1000.0 / result.hold_mean_ms if result.hold_mean_ms > 0 else math.nan
