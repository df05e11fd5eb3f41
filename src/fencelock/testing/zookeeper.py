"""Start and control a real standalone ZooKeeper server for tests, benchmarks and the lab.

    with ZooKeeperServer() as server:
        locks = fencelock.connect(server.url("/my-test"))   # each test its own chroot
        server.pause()     # SIGSTOP: connections stay open, nothing answers
        server.resume()
        server.kill()      # SIGKILL
        server.restart()   # same port, same data directory: persistent nodes come back

The server runs Debian's `zookeeper` package (3.8, Java 17) as `java ... QuorumPeerMain zoo.cfg`, on a free
loopback port, in a temporary directory of its own with its own `zoo.cfg`. It is ready when the `srvr`
four-letter word answers with its version (`ruok` says `imok` too early). Unless `durable=True`, it writes
its transaction log without fsync (`zookeeper.forceSync=no`), as the Redis test servers run without an AOF:
the tests and benchmarks measure the lock, not the disk. `tickTime` is 100 ms and sessions
may last from 0.2 s to 60 s, so tests can use short TTLs and the default 30 s TTL alike. Only the process
started here is ever signalled, by its PID; an `atexit` hook stops servers still running at exit.

`ZooKeeperDeployment` is the `fencelock.testing.deployment.Deployment` of this server, for the conformance
suite: `holder`, `steal`, `pause` and `resume` go to the server directly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .deployment import Deployment
from .servers._child import ProcessServer

__all__ = ["ZooKeeperDeployment", "ZooKeeperServer", "find_zookeeper"]

START_TIMEOUT = 30.0
"""Seconds `start()` waits for `srvr` to answer (the JVM starts in about 1 s here; a loaded box is slower)."""

TICK_MS = 100
MIN_SESSION_MS = 200
MAX_SESSION_MS = 60_000

_JARS = ("zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-log4j12.jar", "log4j-1.2.jar",
         "netty-handler.jar", "netty-transport.jar", "netty-common.jar", "netty-buffer.jar",
         "netty-resolver.jar", "netty-codec.jar", "netty-transport-native-epoll.jar",
         "netty-transport-native-unix-common.jar", "commons-cli.jar", "commons-io.jar",
         "jackson-databind.jar", "jackson-core.jar", "jackson-annotations.jar", "metrics-core.jar",
         "snappy-java.jar", "audience-annotations.jar")

_INSTALL_HINT = ("No ZooKeeper server found. Install it with `apt-get install -y zookeeper` (Debian/Ubuntu: "
                 "/usr/share/java/zookeeper.jar and a Java runtime), or point FENCELOCK_ZOOKEEPER_JAR at a "
                 "zookeeper.jar whose directory holds its dependencies.")


def find_zookeeper() -> tuple[str, list[str]]:
    """The `java` binary and the class path of a ZooKeeper server; RuntimeError saying how to install it."""
    java = shutil.which("java")
    jar = Path(os.environ.get("FENCELOCK_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))
    if java is None or not jar.is_file():
        raise RuntimeError(_INSTALL_HINT)
    directory = jar.parent
    classpath = [str(jar)] + [str(directory / name) for name in _JARS[1:] if (directory / name).is_file()]
    return java, classpath


def four_letter_word(host: str, port: int, word: str, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter word and return the answer ('' if nothing answered)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(word.encode())
            chunks = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer(ProcessServer):
    """One standalone ZooKeeper server process on a loopback port, with its own directory and zoo.cfg."""

    program = "ZooKeeper"
    awaited = "answer srvr"
    start_timeout = START_TIMEOUT
    poll_first = poll_later = 0.05

    def __init__(self, *, port: int | None = None, name: str = "zookeeper", durable: bool = False,
                 myid: int | None = None, extra_config: Sequence[str] = (), heap_mb: int = 256) -> None:
        """`myid`, `extra_config` (more `zoo.cfg` lines) and `heap_mb` serve ensemble members
        (`fencelock.testing.zookeeper_ensemble`); a standalone server needs none of them."""
        self.java, self.classpath = find_zookeeper()
        self.durable = durable
        self.myid = myid
        self.extra_config = tuple(extra_config)
        self.heap_mb = heap_mb
        super().__init__(port=port, name=name)
        self.config_path = os.path.join(self.dir, "zoo.cfg")
        self.log_path = os.path.join(self.dir, "stdio.log")

    def __repr__(self) -> str:
        return f"<ZooKeeperServer {self.name} {self.host}:{self.port} pid={self.pid}>"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def url(self, chroot: str = "") -> str:
        """`zookeeper://127.0.0.1:<port><chroot>`; give every test a chroot of its own."""
        return f"zookeeper://{self.address}{chroot}"

    def _prepare(self) -> None:
        data = os.path.join(self.dir, "data")
        os.makedirs(data, exist_ok=True)
        with open(self.config_path, "w") as f:
            f.write(f"tickTime={TICK_MS}\ninitLimit=10\nsyncLimit=5\ndataDir={data}\n"
                    f"clientPort={self.port}\nclientPortAddress={self.host}\n"
                    f"minSessionTimeout={MIN_SESSION_MS}\nmaxSessionTimeout={MAX_SESSION_MS}\n"
                    "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr,cons,dump\n"
                    "maxClientCnxns=0\n")
            f.writelines(f"{line}\n" for line in self.extra_config)
        if self.myid is not None:
            with open(os.path.join(data, "myid"), "w") as f:
                f.write(f"{self.myid}\n")

    def command_line(self) -> list[str]:
        return [self.java, f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Dzookeeper.log.dir={self.dir}", "-Dzookeeper.root.logger=INFO,CONSOLE",
                f"-Dzookeeper.forceSync={'yes' if self.durable else 'no'}",
                "-Dlog4j.configuration=file:/etc/zookeeper/conf_example/log4j.properties",
                "-cp", ":".join(["/etc/zookeeper/conf_example", *self.classpath]),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain", self.config_path]

    def log_paths(self) -> tuple[str]:
        return (self.log_path,)

    def _ready(self) -> bool:
        return "Zookeeper version" in four_letter_word(self.host, self.port, "srvr", timeout=0.5)

    def pause(self) -> None:
        """SIGSTOP: connects still succeed (the kernel accepts them), nothing answers, sessions do not expire
        (the server's clock stops with it). Returns once every thread of the JVM has stopped."""
        super().pause()

    def stop(self) -> None:
        """SIGKILL and reap, as `close` and `restart` do (a ZooKeeper server needs no shutdown to keep its data)."""
        self.kill()


class ZooKeeperDeployment(Deployment):
    """The conformance suite's view of a ZooKeeper server: its own chroot on a shared server."""

    kind = "zookeeper"
    supports_fair = True   # every waiter is served in arrival order
    min_ttl = MIN_SESSION_MS / 1000
    """A live client honours any TTL (it deletes its node when the TTL runs out), but a crashed one keeps its node
    for the session timeout, which the server never lets drop below its `minSessionTimeout`."""
    nodes_per_request = 1
    expiry_slack = 0.1
    """The client deletes an unrenewed node when its TTL ends (a thread's timer), and the waiter's watch fires."""
    stall_timeout = 2.0
    """A request to a paused server fails after the URL's `timeout` (2 s by default)."""

    def __init__(self, server: ZooKeeperServer, chroot: str | None = None, prefix: str = "fencelock", *,
                 owns_server: bool = False) -> None:
        self.server = server
        self.chroot = chroot if chroot is not None else f"/fencelock-tests/{uuid.uuid4().hex[:12]}"
        self.prefix = prefix
        self._owns_server = owns_server
        super().__init__(server.url(self.chroot))
        # A chroot exists before its clients use it, as in any ZooKeeper deployment.
        with self.client() as client:
            client.ensure_path(self.chroot)

    @classmethod
    def start(cls) -> ZooKeeperDeployment:
        """A new standalone server of its own, which `close()` stops."""
        return cls(ZooKeeperServer().start(), owns_server=True)

    @property
    def hosts(self) -> str:
        """What a plain kazoo client of this deployment connects to (`host:port`, comma-separated)."""
        return self.server.address

    @contextlib.contextmanager
    def client(self) -> Iterator[Any]:
        """A plain kazoo client for one look behind fencelock's back, stopped afterwards.

        Never kept between looks: kazoo's connection thread draws from the global `random` module, and a
        thread that does so all session long breaks Hypothesis tests running in the same process.
        """
        from kazoo.client import KazooClient
        client = KazooClient(hosts=self.hosts, timeout=10.0)
        client.start(timeout=10)
        try:
            yield client
        finally:
            client.stop()
            client.close()

    def _directory(self, name: str) -> str:
        from fencelock._zk.rules import encode_name, lock_path, root_path
        return lock_path(root_path(self.chroot, encode_name(self.prefix)), name)

    def nodes(self, name: str) -> list[str]:
        """The children of `name`'s queue, holder first (`<token>-<seq>`)."""
        from kazoo.exceptions import NoNodeError

        from fencelock._zk.rules import child_name, queue
        try:
            with self.client() as client:
                children = client.get_children(self._directory(name))
        except NoNodeError:
            return []
        return [child_name(child) for child in queue(children)]

    def holder(self, name: str) -> str | None:
        nodes = self.nodes(name)
        return nodes[0].rpartition("-")[0] if nodes else None

    def steal(self, name: str) -> None:
        from kazoo.exceptions import NoNodeError
        nodes = self.nodes(name)
        if nodes:
            try:
                with self.client() as client:
                    client.delete(f"{self._directory(name)}/{nodes[0]}")
            except NoNodeError:
                pass

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def ttl_left(self, name: str) -> float | None:
        """Seconds until the holder's TTL ends, from its node's last write (None: nobody holds `name`)."""
        from kazoo.exceptions import NoNodeError

        from fencelock._zk.rules import decode_lease, lease_remaining
        nodes = self.nodes(name)
        if not nodes:
            return None
        try:
            with self.client() as client:
                data, stat = client.get(f"{self._directory(name)}/{nodes[0]}")
        except NoNodeError:
            return None
        return lease_remaining(decode_lease(data)[0], stat.mtime, time.time() * 1000.0)

    def leftovers(self, name: str) -> list[str] | None:
        """The ephemeral nodes still queued for `name` (the holder's and the waiters')."""
        return self.nodes(name)

    def queued(self, name: str) -> int | None:
        return max(0, len(self.nodes(name)) - 1)

    def close(self) -> None:
        if self._owns_server:
            self.server.close()
