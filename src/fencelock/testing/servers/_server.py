"""One real ``redis-server`` / ``valkey-server`` process: start, pause, kill, restart on the same port and dir."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._harness import Harness
from ._process import _close_clients, _file_size, _Raw, _server_pid, find_server_binary, free_port, server_version

#: Seconds :meth:`RedisServer.start` / :meth:`RedisServer.restart` wait for PING.
START_TIMEOUT = 10.0
#: Seconds :meth:`RedisServer.stop` waits after SIGTERM before it uses SIGKILL.
STOP_TIMEOUT = 2.0


class _StartError(RuntimeError):
    def __init__(self, message: str, *, port_in_use: bool) -> None:
        super().__init__(message)
        self.port_in_use = port_in_use


class RedisServer(Harness):
    """One real redis-server / valkey-server process on a loopback port.

    Args:
        binary: server binary; default :func:`find_server_binary`.
        port: TCP port; default a free port (re-chosen at start if it was taken
            meanwhile). An explicit port is never changed.
        durable: ``True`` runs with ``--appendonly yes --appendfsync always`` so
            that keys and TTLs survive :meth:`kill` + :meth:`restart`; ``False``
            runs with ``--appendonly no`` (a restart comes back empty). RDB
            snapshots are off in both modes (``--save ''``).
        extra_args: more ``--option value`` arguments, appended last (so they
            override the defaults above).
        env: extra environment variables for the server process, on top of
            ``os.environ`` (e.g. ``LD_PRELOAD`` for libfaketime).
        name: label used in the temp dir name, ``repr`` and error messages.

    Attributes:
        host: always ``"127.0.0.1"``.
        port: the TCP port.
        dir: the server's own temporary directory (``--dir``; log file inside).
        binary: path of the server binary.
        version: ``(major, minor, patch)`` of the binary.
    """

    host: str
    port: int
    dir: str

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        durable: bool = False,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        name: str = "redis",
    ) -> None:
        self.binary = binary if binary is not None else find_server_binary()
        self.version = server_version(self.binary)
        self.host = "127.0.0.1"
        self._auto_port = port is None
        self.port = port if port is not None else free_port()
        self.durable = durable
        self.extra_args = tuple(extra_args)
        self.env = dict(env) if env is not None else None
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"fencelock-{name}-")
        self.log_path = os.path.join(self.dir, "server.log")
        self._stdio_path = os.path.join(self.dir, "stdio.log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offsets: tuple[int, ...] = (0, 0)
        self._paused = False
        self._closed = False
        self._clients: list[redis.Redis] = []
        self._live()  # so the atexit hook removes the dir even if never started

    # ------------------------------------------------------------------ info
    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """PID of the running server process, or ``None`` if it is not running."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the process we started is alive (also when paused)."""
        return self.pid is not None

    @property
    def started(self) -> bool:
        return self.running

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume` (or kill/stop)."""
        return self._paused

    @property
    def supports_debug_command(self) -> bool:
        """True if ``--enable-debug-command`` exists (Redis/Valkey 7+)."""
        return self.version >= (7, 0, 0)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self.running else "stopped")
        return f"<RedisServer {self.name} {self.host}:{self.port} {state} pid={self.pid}>"

    def command_line(self) -> list[str]:
        """The argv used to start the server."""
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", self.dir,
            "--logfile", self.log_path,
            "--daemonize", "no",
            "--save", "",
        ]
        if self.durable:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.supports_debug_command:
            args += ["--enable-debug-command", "local"]
        args += list(self.extra_args)
        return args

    def log_tail(self, lines: int = 20) -> str:
        """Last lines of the server log and of its stdout/stderr (for error messages)."""
        parts = []
        for path in (self._stdio_path, self.log_path):
            try:
                with open(path, errors="replace") as f:
                    text = f.read().splitlines()[-lines:]
            except OSError:
                continue
            if text:
                parts.append(f"--- {os.path.basename(path)}\n" + "\n".join(text))
        return "\n".join(parts) or "(no log output)"

    # ------------------------------------------------------------- lifecycle
    def _spawn(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        environ = None
        if self.env is not None:
            environ = dict(os.environ)
            environ.update(self.env)
        self._log_offsets = tuple(_file_size(p) for p in (self._stdio_path, self.log_path))
        with open(self._stdio_path, "ab") as stdio:
            self._proc = subprocess.Popen(
                self.command_line(),
                stdin=subprocess.DEVNULL,
                stdout=stdio,
                stderr=subprocess.STDOUT,
                env=environ,
                cwd=self.dir,
                # Own session: a Ctrl-C aimed at the test runner does not hit the
                # server; the atexit hook / fixtures stop it instead.
                start_new_session=True,
            )
        self._paused = False

    def _wait_ready(self, deadline: float) -> None:
        """Wait until PING answers. Raises RuntimeError on exit or deadline."""
        assert self._proc is not None
        # A server is typically ready ~35 ms after spawn: poll tightly at first
        # (a refused connect costs microseconds), then back off.
        fast_until = time.monotonic() + 1.0
        while True:
            if self._proc.poll() is not None:
                raise _StartError(
                    f"{self.name}: {self.binary} exited with code {self._proc.returncode} "
                    f"before answering PING on port {self.port}\n{self.log_tail()}",
                    port_in_use=self._port_in_use_logged(),
                )
            if self._answers_ping():
                return
            if time.monotonic() >= deadline:
                self._hard_kill()
                raise RuntimeError(
                    f"{self.name}: {self.binary} did not answer PING on port {self.port} "
                    f"within {START_TIMEOUT:g}s\n{self.log_tail()}"
                )
            time.sleep(0.003 if time.monotonic() < fast_until else 0.02)

    def _answers_ping(self) -> bool:
        """True once *our* process (checked by PID) answers PING with +PONG.

        INFO works while an AOF is still loading, PING does not (-LOADING), so
        a durable server counts as ready only when its data is back.
        """
        assert self._proc is not None
        try:
            with _Raw(self.host, self.port, timeout=0.5) as raw:
                if _server_pid(raw) != self._proc.pid:
                    return False  # a stranger holds the port; we will see our exit
                return raw.call("PING") == ("+", b"PONG")
        except (OSError, ValueError):
            return False

    def _port_in_use_logged(self) -> bool:
        """Did the last start attempt fail to bind? (only log output since that spawn)"""
        for path, offset in zip((self._stdio_path, self.log_path), self._log_offsets, strict=True):
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    if b"Address already in use" in f.read():
                        return True
            except OSError:
                pass
        return False

    def _start_with_deadline(self, deadline: float, *, allow_new_port: bool) -> None:
        attempts = 0
        while True:
            attempts += 1
            self._spawn()
            try:
                self._wait_ready(deadline)
                return
            except _StartError as exc:
                if allow_new_port and exc.port_in_use and attempts < 3 and time.monotonic() < deadline:
                    # Someone grabbed our free_port() between probe and bind.
                    self.port = free_port()
                    continue
                raise RuntimeError(str(exc)) from None

    def start(self) -> RedisServer:
        """Spawn the server and wait (at most 10 s) until it answers PING.

        Returns ``self``. Raises :class:`RuntimeError` with the last log lines if
        the process exits early or does not answer in time. If the port was
        chosen automatically and turns out to be taken, a new one is picked.
        """
        deadline = time.monotonic() + START_TIMEOUT
        self._start_with_deadline(deadline, allow_new_port=self._auto_port)
        return self

    def restart(self) -> None:
        """Start the server again on the same port and ``--dir``.

        Meant for after :meth:`kill` or :meth:`stop`; if the server is still
        running it is stopped gracefully first. A durable server reloads its
        AOF (PING answers only once loading is done). Listening sockets use
        ``SO_REUSEADDR``, so connections left in TIME_WAIT do not block the port;
        if another process really holds it, retries until the 10 s deadline.
        """
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self.running:
            self.stop()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self._start_with_deadline(deadline, allow_new_port=False)
                return
            except RuntimeError:
                if not self._port_in_use_logged() or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def pause(self) -> None:
        """Freeze the process with SIGSTOP: connects succeed, commands hang."""
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """Let a paused process run again (SIGCONT)."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def kill(self) -> None:
        """SIGKILL the process and reap it. Nothing is flushed beyond what was fsync'ed."""
        self._hard_kill()

    def stop(self) -> None:
        """Stop the process gracefully; the directory is kept, so :meth:`restart` can follow.

        Fast path: SIGCONT if paused, then ``SHUTDOWN NOSAVE`` on a connection
        whose ``INFO`` reports our PID (the server exits within ~1 ms, while
        SIGTERM is only acted on at the next ``serverCron`` tick, ~100 ms later).
        If that did not end it within 0.5 s: SIGTERM, wait up to 2 s, then
        SIGKILL. Only the process started here is ever signalled. No-op if it
        is not running.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if self._paused:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                self._paused = False
            self._try_shutdown_command(proc)
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._hard_kill()
        self._reaped()

    def _try_shutdown_command(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            with _Raw(self.host, self.port, timeout=0.5) as raw:
                if _server_pid(raw) != proc.pid:
                    return
                try:
                    raw.call("SHUTDOWN", "NOSAVE")
                    return  # any reply means it refused (e.g. NOAUTH): use signals
                except OSError:
                    pass  # success: the server exits without replying
            proc.wait(timeout=0.5)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass

    def close(self) -> None:
        """Stop the process we started (see :meth:`stop`), close clients made by
        :meth:`client`, and remove the temp dir. Idempotent."""
        if self._closed:
            return
        try:
            self.stop()
        finally:
            self._closed = True
            _close_clients(self._clients)
            shutil.rmtree(self.dir, ignore_errors=True)
            self._gone()


    # --------------------------------------------------------------- helpers
    def client(self, **kw: Any) -> redis.Redis:
        """A plain ``redis.Redis`` connected straight to this server.

        Defaults: ``socket_timeout=2``, ``socket_connect_timeout=2`` and **no
        retries** (``Retry(NoBackoff(), 0)``; redis-py's own default retries
        timeouts 3 times, which hides injected faults). Any keyword overrides.
        The client is closed by :meth:`close`.
        """
        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "socket_timeout": 2,
            "socket_connect_timeout": 2,
            "retry": Retry(NoBackoff(), 0),
        }
        kwargs.update(kw)
        c = redis.Redis(**kwargs)
        self._clients.append(c)
        return c

    def _signal(self, sig: signal.Signals) -> None:
        pid = self.pid
        if pid is None:
            raise RuntimeError(f"{self!r} is not running")
        os.kill(pid, sig)

    def _hard_kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.kill()  # SIGKILL also ends a SIGSTOPped process
            except ProcessLookupError:
                pass
            proc.wait()
        self._reaped()

    def _reaped(self) -> None:
        self._paused = False
