"""One server process that the harness starts: Redis, ZooKeeper and each etcd member are this, with their own
command line, readiness probe and config files.

`ServerProcess` is the process: spawned in a session of its own with its output in a log file, signalled only by
its PID (`pause`, `resume`, `kill`, `stop`). `ProcessServer` is a server that stands alone: `start` waits for its
probe and picks a new port if the one it chose was taken meanwhile, `restart` reuses port and directory, and
`close` gives everything back.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from .._harness import Harness

#: Seconds `kill` waits for a SIGKILLed process to be reaped.
KILL_TIMEOUT = 10.0

#: Seconds `pause` waits for every thread of the process to stop.
PAUSE_TIMEOUT = 5.0

P = TypeVar("P", bound="ProcessServer")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (bind to port 0).

    The port is released before it is returned, so another process may take it in between; `ProcessServer.start`
    picks a new one in that case when the port was chosen automatically.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _all_threads_stopped(pid: int) -> bool:
    """True when every thread of `pid` is stopped (T; t under a tracer) or gone (Z, X), as /proc reports it."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # gone: nothing runs
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


class StartError(RuntimeError):
    """The process exited before it was ready; `port_in_use` if its log says it could not bind."""

    def __init__(self, message: str, *, port_in_use: bool) -> None:
        super().__init__(message)
        self.port_in_use = port_in_use


class ServerProcess:
    """One process: `pid`, `running`, `paused`, `exit_code`, `log_tail()` and the signals.

    A subclass sets `name` and `dir` (the working directory) and gives `command_line()` and `log_paths()` (the
    first one receives the process's stdout and stderr); `env` adds environment variables.
    """

    name: str
    dir: str | os.PathLike[str]
    env: Mapping[str, str] | None = None
    #: Seconds `stop` waits after SIGTERM before it uses SIGKILL.
    stop_timeout = 2.0
    _proc: subprocess.Popen[bytes] | None = None
    _paused = False
    _closed = False
    _log_offsets: tuple[int, ...] = ()

    def command_line(self) -> list[str]:
        """The argv that starts the process."""
        raise NotImplementedError

    def log_paths(self) -> Sequence[str | os.PathLike[str]]:
        """The process's log files; the first one receives its stdout and stderr."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """Write what the process reads at start (config files); called before every spawn."""

    @property
    def pid(self) -> int | None:
        """PID of the running process, or None if it is not running."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the process started here is alive (also when paused)."""
        return self.pid is not None

    @property
    def paused(self) -> bool:
        """True between `pause` and `resume` (or kill/stop)."""
        return self._paused

    @property
    def exit_code(self) -> int | None:
        """The return code of the last process started, once it has ended (negative: killed by that signal)."""
        return None if self._proc is None else self._proc.poll()

    def spawn(self) -> None:
        """Start the process without waiting for it to serve."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        self._prepare()
        paths = [os.fspath(p) for p in self.log_paths()]
        self._log_offsets = tuple(_file_size(p) for p in paths)
        environ = None if self.env is None else {**os.environ, **self.env}
        with open(paths[0], "ab") as stdio:
            # Own session: a Ctrl-C aimed at the test runner does not hit the server; the harness stops it.
            self._proc = subprocess.Popen(self.command_line(), stdin=subprocess.DEVNULL, stdout=stdio,
                                          stderr=subprocess.STDOUT, env=environ, cwd=self.dir,
                                          start_new_session=True)
        self._paused = False

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines of each log file (for error messages)."""
        paths = [Path(p) for p in self.log_paths()]
        parts = []
        for path in paths:
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            if text:
                parts.append("\n".join(text) if len(paths) == 1 else f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts) or "(no log output)"

    def _port_in_use_logged(self) -> bool:
        """Did the last spawn fail to bind? (only the log output since that spawn is read)"""
        for path, offset in zip(self.log_paths(), self._log_offsets, strict=False):
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    if b"address already in use" in f.read().lower():
                        return True
            except OSError:
                pass
        return False

    def _signal(self, sig: signal.Signals) -> None:
        pid = self.pid
        if pid is None:
            raise RuntimeError(f"{self!r} is not running")
        os.kill(pid, sig)

    def pause(self) -> None:
        """Freeze the process with SIGSTOP: connects succeed (the kernel accepts them), nothing answers. Returns once
        every thread of it has stopped (a signal is delivered asynchronously; a Go or Java server's other threads may
        answer one more request meanwhile)."""
        self._signal(signal.SIGSTOP)
        self._paused = True
        pid = self.pid
        deadline = time.monotonic() + PAUSE_TIMEOUT
        while pid is not None and not _all_threads_stopped(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self!r}: not every thread stopped within {PAUSE_TIMEOUT} s of SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        """Let a paused process run again (SIGCONT)."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def kill(self) -> None:
        """SIGKILL the process (paused or not) and reap it; nothing is flushed beyond what was fsync'ed."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(KILL_TIMEOUT)
        self._paused = False

    def stop(self) -> None:
        """Stop the process gracefully (SIGCONT if paused, `_ask_to_exit`, then SIGTERM and after `stop_timeout`
        SIGKILL); its directory is kept. No-op if it is not running."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if self._paused:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                self._paused = False
            self._ask_to_exit(proc)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._paused = False

    def _ask_to_exit(self, proc: subprocess.Popen[bytes]) -> None:
        """A faster way out than SIGTERM, tried first by `stop` (the server's own shutdown command)."""


class ProcessServer(ServerProcess, Harness):
    """A server process that stands alone on ``host:port`` in a temporary directory of its own.

    A subclass gives `_ready()` (the probe), `program` and `awaited` (for messages: "redis-server", "answer
    PING"), `start_timeout`, and may release more in `_release()`.
    """

    program = "server"
    awaited = "answer"
    #: Seconds `start` and `restart` wait for the probe.
    start_timeout = 10.0
    #: Seconds between probes during the first second, and after it.
    poll_first, poll_later = 0.003, 0.02

    def __init__(self, *, port: int | None, name: str) -> None:
        self.host = "127.0.0.1"
        self._auto_port = port is None
        self.port = port if port is not None else free_port()
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"fencelock-{name}-")
        self._live()  # so the atexit hook removes the dir even if never started

    def _ready(self) -> bool:
        raise NotImplementedError

    def _release(self) -> None:
        """Give back what the server holds besides its process and directory (clients made for tests)."""

    @property
    def started(self) -> bool:
        return self.running

    def start(self: P) -> P:
        """Spawn the server and wait (at most `start_timeout`) until its probe answers; returns `self`.

        RuntimeError with the last log lines if it exits early or does not answer in time. A port chosen here and
        taken before the first start is chosen again; an explicit port, or one served on once, is never changed."""
        self._start_until(time.monotonic() + self.start_timeout, allow_new_port=self._auto_port)
        return self

    def restart(self) -> None:
        """Start again on the same port and directory (after `kill` or `stop`; a running server is stopped first).

        If the port is still held (by another process: listening sockets use SO_REUSEADDR), tries again until
        `start_timeout`."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self.running:
            self.stop()
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                self._start_until(deadline, allow_new_port=False)
                return
            except RuntimeError:
                if not self._port_in_use_logged() or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        """Stop the process (see `stop`), release what it holds and remove its directory. Idempotent."""
        if self._closed:
            return
        try:
            self.stop()
        finally:
            self._closed = True
            self._release()
            shutil.rmtree(self.dir, ignore_errors=True)
            self._gone()

    def _start_until(self, deadline: float, *, allow_new_port: bool) -> None:
        attempts = 0
        while True:
            attempts += 1
            self.spawn()
            try:
                self._wait_ready(deadline)
                self._auto_port = False  # clients know this port now: a later start keeps it
                return
            except StartError as exc:
                if allow_new_port and exc.port_in_use and attempts < 3 and time.monotonic() < deadline:
                    self.port = free_port()  # someone took our free_port() between probe and bind
                    continue
                raise RuntimeError(str(exc)) from None

    def _wait_ready(self, deadline: float) -> None:
        """Wait until `_ready()`: StartError if the process exits, RuntimeError (it is killed) at `deadline`."""
        assert self._proc is not None
        fast_until = time.monotonic() + 1.0
        while True:
            if self._proc.poll() is not None:
                raise StartError(f"{self.name}: {self.program} exited with code {self._proc.returncode} before it "
                                 f"could {self.awaited} on port {self.port}\n{self.log_tail()}",
                                 port_in_use=self._port_in_use_logged())
            if self._ready():
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(f"{self.name}: {self.program} did not {self.awaited} on port {self.port} within "
                                   f"{self.start_timeout:g} s\n{self.log_tail()}")
            time.sleep(self.poll_first if time.monotonic() < fast_until else self.poll_later)
