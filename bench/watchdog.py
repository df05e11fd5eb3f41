"""The renewal watchdog under load: many renewed leases held by one client, on one Redis.

One run = one process of its own (multiprocessing spawn: it imports the library afresh, and its CPU time is
its alone; the benchmark process only waits meanwhile):

0. warm up: one short renewed lease until its first renewal, so that the server has the renewal script (as
   the server of a client that has run for a while has it);
1. acquire `leases` leases on distinct names, one after another, `wait=0, renew=True`, TTL `ttl` (timed: the
   acquisition phase; renewals already start during it);
2. hold them for `window` seconds doing nothing else, and measure over the window only: the process's CPU time,
   the watchdog threads' own CPU (its timer thread, and the threads that send each tick's batch), the server's
   CPU, leases renewed, renewal script calls, batches (`extend_many` calls: on a single Redis one pipeline each,
   so one round trip each), and how close to its end of validity a lease came before its renewal was sent;
3. with `flush`: SCRIPT FLUSH on the server (what a restart or a failover does to the scripts) and record the
   next batch, which meets NOSCRIPT;
4. count the leases lost (an `on_lost` callback over the whole run, and `lease.lost` at the end), then let the
   main function end WITHOUT releasing anything or closing the client, and time how long the process takes to
   exit: the watchdog is a daemon thread, renewed leases must not keep a process alive. (A spawned process ends
   with `sys.exit()`: the interpreter's whole shutdown, as at the end of a script, not `os._exit()`.)

The window begins and ends at a quiet moment (no batch in flight), so that every batch counted is counted whole:
its script calls and its renewals fall in the same window.

Batches and their CPU are observed from outside the library: the measurement process wraps its own client's
`backend.extend_many` and `watchdog._renew` (instance attributes; nothing in `src/` is changed). The wrappers
add a min() and a sum() over each batch to the CPU measured: well under 1 % of it.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.queues import Queue
from typing import Any, TypeVar

from . import stats

Progress = Callable[[str], None]
T = TypeVar("T")

LEASES = 10_000
TARGET_TTL = 3.0
"""A short TTL: renewals every 1 s, ten times the default's rate (its CPU share is for information)."""
INFO_TTL = 30.0
"""The default TTL, at which the CPU target is judged: renewals every 10 s, so a 10 s window holds one renewal
per lease."""


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class WatchdogParams:
    leases: int = LEASES
    ttl: float = TARGET_TTL
    window: float = 10.0
    flush: bool = False
    """After the window: SCRIPT FLUSH, then record the next batch (it meets NOSCRIPT)."""

    @property
    def renew_every(self) -> float:
        """`renew=True` renews every ttl/3."""
        return self.ttl / 3


def chosen(*, quick: bool, window: float | None = None, leases: int | None = None) -> list[WatchdogParams]:
    """The runs: TTL 3 s over 10 s (quick: 4 s), then TTL 30 s over 10 s. --quick leaves the TTL-30 run out: its
    renewals come every 10 s, so a window short enough for a smoke run would see none of them."""
    n = LEASES if leases is None else leases
    runs = [WatchdogParams(n, TARGET_TTL, window or (4.0 if quick else 10.0), flush=True)]
    if not quick:
        runs.append(WatchdogParams(n, INFO_TTL, window or 10.0))
    return runs


@dataclass
class Batch:
    """One renewal batch the watchdog sent (one `extend_many` call; one pipeline on a single Redis)."""

    sent_at: float      # monotonic
    leases: int
    extended: int       # answered True
    rtt_s: float        # wall time of the extend_many call
    margin_s: float     # smallest validity left on a lease of the batch when it was sent
    calls: int          # renewal script calls it made (backend.renewal_requests across it; exact unless two
                        # batches overlap, which a tick apart they do not)


@dataclass
class WatchdogResult:
    params: WatchdogParams
    acquire_s: float = math.nan
    window_s: float = math.nan
    cpu_s: float = math.nan              # process CPU over the window (every thread)
    timer_cpu_s: float | None = None     # the watchdog's timer thread ("fencelock-watchdog")
    batch_cpu_s: float | None = None     # the threads that send and apply the batches (`_renew`)
    server_cpu_s: float | None = None    # the Redis server process
    renewals: int = 0                    # locks.watchdog.renewals, over the window
    script_calls: int = 0                # locks.backend.renewal_requests, over the window
    batches: list[Batch] = field(default_factory=list)  # sent within the window
    batches_seen: bool = True            # False: watchdog._renew could not be wrapped (batches unknown)
    flush_batch: Batch | None = None     # the first batch after SCRIPT FLUSH (params.flush)
    lost_events: int = 0                 # on_lost callbacks, whole run (acquisition, window, after the flush)
    lost_at_end: int = 0                 # lease.lost at the end of the window
    heap_entries: int = 0                # watchdog.watching() at the end (stale entries included)
    ended_at: float = math.nan           # monotonic: the end of the process's main function
    exit_s: float | None = None          # end of main -> the process was gone (None: it had to be killed)
    error: str | None = None

    # ------------------------------------------------------------------------------------------- derived

    @property
    def cpu_share(self) -> float:
        """Process CPU as a share of one core, over the window."""
        return self.cpu_s / self.window_s if self.window_s > 0 else math.nan

    def share(self, cpu_s: float | None) -> float:
        return math.nan if cpu_s is None or not self.window_s > 0 else cpu_s / self.window_s

    @property
    def expected_renewals(self) -> float:
        return self.params.leases * self.window_s / self.params.renew_every

    @property
    def calls_per_100(self) -> float:
        """Renewal script calls per 100 leases renewed."""
        return self.script_calls / self.renewals * 100 if self.renewals else math.nan

    @property
    def round_trips(self) -> int:
        """Batches sent in the window: on a single Redis each is one pipeline, one round trip (once the server
        has the script: see `first_batch`)."""
        return len(self.batches)

    @property
    def trips_per_100(self) -> float:
        return self.round_trips / self.renewals * 100 if self.renewals and self.batches_seen else math.nan

    @property
    def lost(self) -> int:
        return max(self.lost_events, self.lost_at_end)

    def as_json(self) -> dict[str, Any]:
        sizes = [b.leases for b in self.batches]
        rtts_ms = [b.rtt_s * 1e3 for b in self.batches]
        return {
            "params": asdict(self.params),
            "acquire_s": self.acquire_s, "window_s": self.window_s,
            "cpu_s": self.cpu_s, "cpu_share": self.cpu_share,
            "timer_cpu_s": self.timer_cpu_s, "batch_cpu_s": self.batch_cpu_s, "server_cpu_s": self.server_cpu_s,
            "renewals": self.renewals, "expected_renewals": self.expected_renewals,
            "script_calls": self.script_calls, "calls_per_100": self.calls_per_100,
            "round_trips": self.round_trips, "trips_per_100": self.trips_per_100,
            "batch_leases": sizes, "batch_rtt_ms_p50": stats.percentile(rtts_ms, 50),
            "batch_rtt_ms_max": max(rtts_ms, default=math.nan),
            "min_margin_s": min((b.margin_s for b in self.batches), default=math.nan),
            "flush_batch": asdict(self.flush_batch) if self.flush_batch is not None else None,
            "lost_events": self.lost_events, "lost_at_end": self.lost_at_end, "heap_entries": self.heap_entries,
            "exit_s": self.exit_s, "error": self.error,
        }


# ---------------------------------------------------------------------------------- the measurement process

def _server_cpu(pid: int | None) -> float | None:
    """utime + stime of process `pid`, seconds (Linux /proc; 10 ms resolution), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _thread_clock(name: str) -> int | None:
    """The CPU-time clock of the live thread called `name`, or None."""
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            try:
                return time.pthread_getcpuclockid(thread.ident)
            except (AttributeError, OSError):
                return None
    return None


class _Observer:
    """Wraps one client's `extend_many` and `_renew` to see every batch, and to find quiet moments.

    Both wrappers run in the thread that sends the batch (`_renew` calls `extend_many`): `_renew` is the whole
    batch (send, then reschedule or report each lease), timed on that thread's CPU clock."""

    def __init__(self, locks: Any) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.batches: list[Batch] = []
        self.batch_cpu = 0.0
        self.lost = 0
        self._sending: dict[int, tuple[float, int, int]] = {}  # thread -> (rtt, extended, calls) of its batch
        backend, watchdog = locks.backend, locks.watchdog
        extend_many: Callable[[list[tuple[str, str, int, int]]], list[bool | None]] = backend.extend_many
        renew: Callable[..., None] | None = getattr(watchdog, "_renew", None)

        def observed_extend_many(leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
            calls = getattr(backend, "renewal_requests", 0)
            started = time.perf_counter()
            results = extend_many(leases)
            self._sending[threading.get_ident()] = (time.perf_counter() - started,
                                                    sum(1 for r in results if r is True),
                                                    getattr(backend, "renewal_requests", 0) - calls)
            return results

        def observed_renew(leases: list[Any], *rest: Any) -> None:
            assert renew is not None
            with self.lock:
                self.in_flight += 1
            cpu = time.thread_time()
            sent_at = time.monotonic()
            try:  # (private: if it is renamed, the margin is unknown, the batch still goes out)
                margin = min((lease._valid_until for lease in leases), default=math.inf) - sent_at
            except AttributeError:
                margin = math.nan
            try:
                renew(leases, *rest)
            finally:
                rtt, extended, calls = self._sending.pop(threading.get_ident(), (math.nan, 0, 0))
                with self.lock:
                    self.batches.append(Batch(sent_at, len(leases), extended, rtt, margin, calls))
                    self.batch_cpu += time.thread_time() - cpu
                    self.in_flight -= 1

        setattr(backend, "extend_many", observed_extend_many)  # noqa: B010 (an instance attribute, on purpose)
        if renew is not None:
            setattr(watchdog, "_renew", observed_renew)  # noqa: B010
        self.sees_batches = renew is not None

    def on_lost(self, _: object) -> None:
        self.lost += 1

    def quiet(self, sample: Callable[[], T], limit: float = 2.0) -> T:
        """`sample()` taken while no batch is in flight (or after `limit` seconds of trying)."""
        give_up = time.monotonic() + limit
        while True:
            with self.lock:
                if self.in_flight == 0 or time.monotonic() > give_up:
                    return sample()
            time.sleep(0.001)

    def batches_after(self, count: int, limit: float) -> bool:
        """Wait until more than `count` batches have been sent and answered (False: not within `limit` s)."""
        give_up = time.monotonic() + limit
        while len(self.batches) <= count:
            if time.monotonic() > give_up:
                return False
            time.sleep(0.005)
        return True


def _hold(url: str, params: WatchdogParams, server_pid: int | None, events: Queue[tuple[str, Any]],
          held: list[Any]) -> WatchdogResult:
    """Acquire, hold, measure. The client and every lease go into `held`: the caller keeps them to its end."""
    import fencelock  # in the measurement process only

    result = WatchdogResult(params)
    locks = fencelock.connect(url)
    held.append(locks)
    seen = _Observer(locks)
    prefix = f"bench:watchdog:{params.ttl:g}:{os.getpid()}"
    warm = locks.acquire(f"{prefix}:warm", ttl=0.3, wait=0, renew=True)
    if not seen.batches_after(0, 5.0):
        raise RuntimeError("the warm-up lease was not renewed within 5 s")
    warm.release()
    leases: list[Any] = []
    held.append(leases)
    started = time.monotonic()
    for i in range(params.leases):
        leases.append(locks.acquire(f"{prefix}:{i}", ttl=params.ttl, wait=0, renew=True, on_lost=seen.on_lost))
    result.acquire_s = time.monotonic() - started
    events.put(("acquired", result.acquire_s))

    timer = _thread_clock("fencelock-watchdog")
    watchdog = locks.watchdog
    backend: Any = locks.backend  # renewal_requests: a counter of the Redis backends, not of the Backend protocol

    def sample() -> tuple[float, float, float | None, float | None, int, int, int, float]:
        return (time.monotonic(), time.process_time(),
                time.clock_gettime(timer) if timer is not None else None, _server_cpu(server_pid),
                watchdog.renewals, backend.renewal_requests, len(seen.batches), seen.batch_cpu)

    t0, cpu0, timer0, server0, renewals0, calls0, batches0, batch_cpu0 = seen.quiet(sample)
    time.sleep(params.window)
    t1, cpu1, timer1, server1, renewals1, calls1, batches1, batch_cpu1 = seen.quiet(sample)

    result.window_s = t1 - t0
    result.cpu_s = cpu1 - cpu0
    if timer0 is not None and timer1 is not None:
        result.timer_cpu_s = timer1 - timer0
    result.batches_seen = seen.sees_batches
    if seen.sees_batches:
        result.batch_cpu_s = batch_cpu1 - batch_cpu0
    if server0 is not None and server1 is not None:
        result.server_cpu_s = server1 - server0
    result.renewals = renewals1 - renewals0
    result.script_calls = calls1 - calls0
    with seen.lock:
        result.batches = seen.batches[batches0:batches1]
    if params.flush:
        def flush() -> int:
            backend.client.script_flush()
            return len(seen.batches)

        # At a quiet moment (a batch about to start waits for the observer's lock): the next one meets NOSCRIPT.
        count = seen.quiet(flush)
        if seen.batches_after(count, 2 * params.renew_every + 2.0):
            result.flush_batch = seen.batches[count]
    result.lost_events = seen.lost
    result.lost_at_end = sum(1 for lease in leases if lease.lost)
    result.heap_entries = watchdog.watching()
    return result


def _measure(url: str, params: WatchdogParams, server_pid: int | None, events: Queue[tuple[str, Any]]) -> None:
    """The measurement process's main function. It ends holding every lease, its client open, as a program that
    forgets to release would: the process must exit at once all the same."""
    held: list[Any] = []  # the client and the leases, referenced to the very end
    try:
        result = _hold(url, params, server_pid, events, held)
    except BaseException as exc:
        result = WatchdogResult(params, error=f"pid {os.getpid()}: {type(exc).__name__}: {exc}")
    result.ended_at = time.monotonic()
    events.put(("result", result))
    # The end of main: no release, no close.


# ------------------------------------------------------------------------------------------------ the parent

def watchdog_run(url: str, params: WatchdogParams, *, server_pid: int | None = None,
                 progress: Progress = _quiet) -> WatchdogResult:
    """One run in a fresh process; see the module's docstring."""
    ctx = multiprocessing.get_context("spawn")
    events: Queue[tuple[str, Any]] = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(url, params, server_pid, events),
                       name=f"bench-watchdog-{params.ttl:g}", daemon=True)
    label = f"watchdog, ttl {params.ttl:g} s"
    progress(f"{label}: acquiring {params.leases:,} leases with renew=True in a process of its own")
    proc.start()
    gone = threading.Event()
    gone_at: list[float] = []

    def watch_exit() -> None:  # the moment the process is gone, not the moment we look
        multiprocessing.connection.wait([proc.sentinel])
        gone_at.append(time.monotonic())
        gone.set()

    threading.Thread(target=watch_exit, name="bench-watchdog-exit", daemon=True).start()
    result: WatchdogResult | None = None
    deadline = time.monotonic() + 180 + params.leases / 200 + params.window
    try:
        while result is None:
            try:
                kind, value = events.get(timeout=0.5)
            except queue.Empty:
                if gone.is_set():
                    try:
                        kind, value = events.get(timeout=1.0)
                    except queue.Empty:
                        return WatchdogResult(params, error=f"{proc.name} exited (code {proc.exitcode}) "
                                                            "without an answer")
                elif time.monotonic() > deadline:
                    return WatchdogResult(params, error=f"{proc.name} did not answer in time")
                else:
                    continue
            if kind == "acquired" and params.leases:
                progress(f"{label}: acquired in {value:.1f} s ({params.leases / value:,.0f}/s); "
                         f"holding them {params.window:g} s")
            elif kind == "result":
                result = value
        if gone.wait(10.0):
            result.exit_s = gone_at[0] - result.ended_at
        return result
    finally:
        proc.join(timeout=1.0)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)


def exit_baseline(url: str) -> float | None:
    """Seconds from the end of main to exit for the same kind of process holding nothing (it imported fencelock
    and made a client, as the runs do): what the runs' exit times are to be read against."""
    return watchdog_run(url, WatchdogParams(0, TARGET_TTL, 0.0)).exit_s


@dataclass
class WatchdogSection:
    runs: list[WatchdogResult] = field(default_factory=list)
    exit_baseline_s: float | None = None
    left_out: list[str] = field(default_factory=list)  # runs this selection does not make, and why

    @property
    def errors(self) -> list[str]:
        return [f"ttl {r.params.ttl:g} s: {r.error}" for r in self.runs if r.error is not None]

    def as_json(self) -> dict[str, Any]:
        return {"runs": [r.as_json() for r in self.runs], "exit_baseline_s": self.exit_baseline_s,
                "left_out": self.left_out}


def watchdog_section(url: str, runs: Sequence[WatchdogParams], *, server_pid: int | None = None,
                     quick: bool = False, progress: Progress = _quiet) -> WatchdogSection:
    out = WatchdogSection([watchdog_run(url, params, server_pid=server_pid, progress=progress) for params in runs])
    if quick:
        out.left_out.append(f"ttl {INFO_TTL:g} s (for information): not run with --quick (renewals every "
                            f"{INFO_TTL / 3:g} s)")
    progress("watchdog: the exit of a process holding nothing, for comparison")
    out.exit_baseline_s = exit_baseline(url)
    return out
