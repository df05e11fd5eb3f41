"""A delay proxy: every byte is forwarded `delay` seconds after it arrived, in order, in each direction.

`./dev bench --latency MS` puts one in front of every server, so that each node behaves as a host of its own on a
LAN. It runs as a process of its own (`python -m bench.delay`), with threads that sleep until each chunk is due
(a timer slack of 1 µs, so a sleep ends within tens of microseconds of its time), and reports how late it
actually forwarded (the proxy's own jitter) and the CPU it used.

    python -m bench.delay --target 127.0.0.1:6379 --delay 0.5     # prints "port N" once it listens
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

_PR_SET_TIMERSLACK = 29


def _fine_timers() -> None:
    """Ask Linux to end our sleeps on time (the default timer slack is 50 µs)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _Lateness:
    """How late chunks were forwarded beyond their due time (seconds), kept as a bounded sample."""

    def __init__(self) -> None:
        self.samples: collections.deque[float] = collections.deque(maxlen=200_000)
        self.count = 0
        self.lock = threading.Lock()

    def add(self, late: float) -> None:
        with self.lock:
            self.samples.append(late)
            self.count += 1


def _pump(source: socket.socket, sink: socket.socket, delay: float, lateness: _Lateness) -> None:
    """Read from `source`; a writer thread sends each chunk to `sink` `delay` s after it arrived."""
    due: collections.deque[tuple[float, bytes]] = collections.deque()
    ready = threading.Condition()
    done = False

    def writer() -> None:
        clock, sleep = time.monotonic, time.sleep
        while True:
            with ready:
                while not due and not done:
                    ready.wait()
                if not due:
                    break
                at, data = due.popleft()
            wait = at - clock()
            if wait > 0:
                sleep(wait)
            lateness.add(clock() - at)
            try:
                sink.sendall(data)
            except OSError:
                break
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            with ready:
                due.append((time.monotonic() + delay, data))
                ready.notify()
    except OSError:
        pass
    finally:
        with ready:
            done = True
            ready.notify()
        thread.join()


def serve(target: tuple[str, int], delay: float, listener: socket.socket, lateness: _Lateness) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            server = socket.create_connection(target)
        except OSError:
            client.close()
            continue
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def both(a: socket.socket = client, b: socket.socket = server) -> None:
            up = threading.Thread(target=_pump, args=(a, b, delay, lateness), daemon=True)
            up.start()
            _pump(b, a, delay, lateness)
            up.join()
            a.close()
            b.close()

        threading.Thread(target=both, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.delay")
    p.add_argument("--target", required=True, help="host:port of the server")
    p.add_argument("--delay", type=float, required=True, help="one-way delay in milliseconds")
    p.add_argument("--report", required=True, help="file to write the lateness figures to on SIGTERM")
    args = p.parse_args(argv)
    host, port = args.target.rsplit(":", 1)
    _fine_timers()
    lateness = _Lateness()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.listen(512)

    def stop(signum: int, frame: FrameType | None) -> None:
        with lateness.lock:
            samples, count = sorted(lateness.samples), lateness.count
        thinned = samples[::max(1, len(samples) // 20_000)]
        Path(args.report).write_text(json.dumps({"chunks": count, "lateness": thinned}))
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"port {listener.getsockname()[1]}", flush=True)
    serve((host, int(port)), args.delay / 1000.0, listener, lateness)
    return 0


@dataclass
class DelayStats:
    """What one proxy measured: chunks forwarded, how late beyond the delay (ms), and its CPU (s)."""

    chunks: int
    late_p50_ms: float
    late_p99_ms: float
    cpu_s: float


class DelayProxy:
    """A `python -m bench.delay` process in front of `host:port`; `port` is where clients connect instead."""

    def __init__(self, host: str, port: int, delay_ms: float, workdir: Path) -> None:
        self.delay_ms = delay_ms
        self._report = workdir / f"delay-{host}-{port}.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.delay", "--target", f"{host}:{port}", "--delay", str(delay_ms),
             "--report", str(self._report)],
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "port":
            self.proc.kill()
            raise RuntimeError(f"the delay proxy for {host}:{port} did not start")
        self.port = int(line[1])

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> DelayStats:
        cpu = self.cpu_s()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)
        found: dict[str, Any] = (json.loads(self._report.read_text()) if self._report.exists()
                                 else {"chunks": 0, "lateness": []})
        late: list[float] = found["lateness"]

        def pct(q: float) -> float:
            return late[min(len(late) - 1, int(q * len(late)))] * 1000.0 if late else 0.0

        return DelayStats(int(found["chunks"]), pct(0.5), pct(0.99), cpu)


if __name__ == "__main__":
    sys.exit(main())
