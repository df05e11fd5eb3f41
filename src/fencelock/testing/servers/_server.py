"""One real ``redis-server`` / ``valkey-server`` process: start, pause, kill, restart on the same port and dir."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._child import ProcessServer
from ._process import _close_clients, _Raw, _server_pid, find_server_binary, server_version

#: Seconds :meth:`RedisServer.start` / :meth:`RedisServer.restart` wait for PING.
START_TIMEOUT = 10.0
#: Seconds :meth:`RedisServer.stop` waits after SIGTERM before it uses SIGKILL.
STOP_TIMEOUT = 2.0


class RedisServer(ProcessServer):
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
    start_timeout = START_TIMEOUT
    stop_timeout = STOP_TIMEOUT
    awaited = "answer PING"

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
        self.program = self.binary
        self.durable = durable
        self.extra_args = tuple(extra_args)
        self.env = dict(env) if env is not None else None
        self._clients: list[redis.Redis] = []
        super().__init__(port=port, name=name)
        self.log_path = os.path.join(self.dir, "server.log")
        self._stdio_path = os.path.join(self.dir, "stdio.log")

    # ------------------------------------------------------------------ info
    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

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

    def log_paths(self) -> tuple[str, str]:
        return self._stdio_path, self.log_path

    def _ready(self) -> bool:
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

    def _ask_to_exit(self, proc: subprocess.Popen[bytes]) -> None:
        """``SHUTDOWN NOSAVE`` on a connection whose ``INFO`` reports our PID: the server exits within ~1 ms, where
        SIGTERM is acted on only at the next ``serverCron`` tick; `stop` falls back to signals after 0.5 s."""
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

    def _release(self) -> None:
        _close_clients(self._clients)

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
