"""Start and control real ``etcd`` processes for tests: one member, or a cluster of several.

Every member is a genuine ``etcd`` process (Debian's ``etcd-server`` package, 3.4) on free loopback ports, with its
own temporary directory. The caller can pause a member (``SIGSTOP``), resume it, kill it (``SIGKILL``), restart it
on the same ports and data, and ask which member leads. Only the standard library is used (the members' JSON
gateway over ``urllib``), so the harness needs nothing that fencelock's etcd extra brings. Typical use::

    with EtcdCluster(3) as cluster:
        locks = fencelock.connect(cluster.url)         # etcd://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
        leader = cluster.leader()
        cluster.kill(leader)                           # the others elect a new leader
        cluster.restart(leader)

Rules: ports come from binding ``127.0.0.1:0``; each cluster gets its own
``tempfile.mkdtemp`` directory; every wait has a deadline; only processes started here are signalled, by PID;
teardown is SIGKILL (SIGTERM on a last leader waits about 7 s). Members still running when the interpreter exits
are killed by an ``atexit`` hook.

`EtcdServer` is a cluster of one member. `EtcdDeployment` is the `fencelock.testing.deployment.Deployment` that the
conformance suite runs on.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, TypeVar

from .._etcd.rules import name_dir, range_end, retry_after
from .._etcd.url import DEFAULT_TIMEOUT
from ._harness import Harness
from .deployment import Deployment
from .servers._child import ServerProcess, free_port

__all__ = ["EtcdCluster", "EtcdDeployment", "EtcdServer", "find_etcd_binary"]

START_TIMEOUT = 20.0
"""Seconds `start` and `restart` wait for every member to say it is healthy."""

LEADER_TIMEOUT = 15.0
"""Seconds `wait_leader` waits for the members to agree on a leader."""

_INSTALL_HINT = (
    "No etcd binary found. Install it with:\n"
    "  apt-get install -y etcd-server etcd-client   (Debian/Ubuntu, puts etcd on PATH)\n"
    "or point the FENCELOCK_ETCD environment variable at an etcd binary."
)


def find_etcd_binary() -> str:
    """``$FENCELOCK_ETCD``, else ``etcd`` on ``PATH``, else ``/usr/bin/etcd``. Raises RuntimeError saying how to
    install it."""
    env = os.environ.get("FENCELOCK_ETCD")
    if env:
        return env
    found = shutil.which("etcd")
    if found:
        return found
    if os.access("/usr/bin/etcd", os.X_OK):
        return "/usr/bin/etcd"
    raise RuntimeError(_INSTALL_HINT)


def _post(url: str, path: str, body: dict[str, Any], timeout: float,
          context: ssl.SSLContext | None = None) -> dict[str, Any]:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        answer: dict[str, Any] = json.loads(response.read() or b"{}")
        return answer


C = TypeVar("C", bound="EtcdCluster")


class _Member(ServerProcess):
    """One etcd process of a cluster."""

    dir: Path

    def __init__(self, cluster: EtcdCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.name = f"m{index}"
        self.client_port = free_port()
        self.peer_port = free_port()
        self.dir = Path(cluster.dir) / self.name
        self.dir.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"<etcd member {self.name} :{self.client_port}>"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.cluster.tls else 'http'}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def command_line(self) -> list[str]:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.cluster.members)
        return [
            self.cluster.binary, "--name", self.name, "--data-dir", str(self.dir / "data"),
            "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", initial, "--initial-cluster-state", "new",
            "--initial-cluster-token", self.cluster.token,
            "--heartbeat-interval", str(self.cluster.heartbeat_ms),
            "--election-timeout", str(self.cluster.election_ms),
            "--logger", "zap", "--log-outputs", str(self.dir / "etcd.log"),
            *(["--cert-file", self.cluster.tls[0], "--key-file", self.cluster.tls[1]] if self.cluster.tls else []),
        ]

    def log_paths(self) -> tuple[Path, Path]:
        return self.dir / "stdio.log", self.dir / "etcd.log"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.client_url + "/health", timeout=0.5,
                                        context=self.cluster.ssl_context) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False


class EtcdCluster(Harness):
    """`n` etcd members on loopback, started together (one member is a plain single server).

    `heartbeat_ms` and `election_ms` are etcd's `--heartbeat-interval` and `--election-timeout`; the shortest
    lease the members grant is 3/2 of the election timeout, rounded up to whole seconds. `memory=True` puts the
    data directories on /dev/shm (where it exists): etcd's fsync of every write then costs nothing, which
    measures the protocol rather than the disk, and keeps tests quick on a busy machine. `tls=(certfile,
    keyfile)` makes the members serve clients over TLS only, with that certificate (its file is also the CA the
    harness trusts); `url` is then `etcds://...`.
    """

    def __init__(self, n: int = 3, binary: str | None = None, *, heartbeat_ms: int = 100,
                 election_ms: int = 1000, memory: bool = False, tls: tuple[str, str] | None = None) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        self.binary = binary or find_etcd_binary()
        self.tls = tls
        self.ssl_context = ssl.create_default_context(cafile=tls[0]) if tls else None
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        root = "/dev/shm" if memory and os.path.isdir("/dev/shm") else None
        self.dir = tempfile.mkdtemp(prefix="fencelock-etcd-", dir=root)
        self.token = f"fencelock-{uuid.uuid4().hex[:12]}"
        self.members: list[_Member] = []
        self.members = [_Member(self, i) for i in range(n)]
        self._closed = False

    def __repr__(self) -> str:
        return f"<EtcdCluster {','.join(str(m.client_port) for m in self.members)}>"

    @property
    def endpoints(self) -> list[str]:
        """Each member's client URL (``http://127.0.0.1:port``)."""
        return [member.client_url for member in self.members]

    @property
    def url(self) -> str:
        """What `fencelock.connect` takes: ``etcd://127.0.0.1:p1,127.0.0.1:p2,...``."""
        scheme = "etcds" if self.tls else "etcd"
        return f"{scheme}://" + ",".join(f"127.0.0.1:{m.client_port}" for m in self.members)

    def pids(self) -> list[int | None]:
        return [m.pid for m in self.members]

    def start(self: C) -> C:
        """Start every member and wait until each one is healthy (it has a leader). A member whose ports were
        taken between `free_port` and its bind gets new ones, and the members start afresh (three tries)."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        self._live()
        deadline = time.monotonic() + START_TIMEOUT
        for attempt in range(3):
            for member in self.members:
                member.spawn()
            taken = self._wait_healthy(self.members, deadline, new_ports=attempt < 2)
            if not taken:
                break
            for member in self.members:
                member.kill()
                shutil.rmtree(member.dir / "data", ignore_errors=True)
            for member in taken:
                member.client_port, member.peer_port = free_port(), free_port()
        return self

    def _wait_healthy(self, members: list[_Member], deadline: float, *, new_ports: bool = False) -> list[_Member]:
        """Wait until every one of `members` is healthy; with `new_ports`, return at once the members that exited
        because their ports were taken. Any other exit, or the deadline, closes the cluster with RuntimeError."""
        waiting = list(members)
        while True:
            for member in list(waiting):
                if member.exit_code is not None:
                    taken = [m for m in members if m.exit_code is not None and m._port_in_use_logged()]
                    if new_ports and member in taken and time.monotonic() < deadline:
                        return taken
                    self.close()
                    raise RuntimeError(f"etcd member {member.name} exited with code {member.exit_code}\n"
                                       f"{member.log_tail()}")
                if member.healthy():
                    waiting.remove(member)
            if not waiting:
                return []
            if time.monotonic() >= deadline:
                tails = "\n".join(m.log_tail() for m in waiting)
                self.close()
                raise RuntimeError(f"etcd members {[m.name for m in waiting]} not healthy within "
                                   f"{START_TIMEOUT:g} s\n{tails}")
            time.sleep(0.02)

    def request(self, path: str, body: dict[str, Any], member: int | None = None,
                timeout: float = 2.0) -> dict[str, Any]:
        """One JSON gateway request (``/v3/kv/range``, ...), to `member` or to the first running member that
        answers."""
        order = [member] if member is not None else [m.index for m in self.members if m.running and not m.paused]
        error: Exception | None = None
        for index in order:
            try:
                return _post(self.members[index].client_url, path, body, timeout, self.ssl_context)
            except (OSError, ValueError) as exc:
                error = exc
        raise RuntimeError(f"no etcd member answered {path}: {error}")

    def leader(self) -> int:
        """The index of the member that leads now (asked of the running members)."""
        for member in self.members:
            if not member.running or member.paused:
                continue
            try:
                status = _post(member.client_url, "/v3/maintenance/status", {}, 1.0, self.ssl_context)
            except (OSError, ValueError):
                continue
            lead = int(status.get("leader", 0))
            for other in self.members:
                if other.running and self._member_id(other) == lead:
                    return other.index
        raise RuntimeError("no running etcd member knows a leader")

    def _member_id(self, member: _Member) -> int | None:
        if member.paused:
            return None
        try:
            status = _post(member.client_url, "/v3/maintenance/status", {}, 1.0, self.ssl_context)
        except (OSError, ValueError):
            return None
        return int(status["header"]["member_id"])

    def wait_leader(self, timeout: float = LEADER_TIMEOUT, *, other_than: int | None = None) -> int:
        """Wait until the running members agree on a leader (not `other_than`); returns its index."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                index = self.leader()
                if index != other_than:
                    return index
            except RuntimeError:
                pass
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no etcd leader within {timeout:g} s")
            time.sleep(0.05)

    def pause(self, index: int | None = None) -> None:
        """SIGSTOP one member (or all): connections open, nothing answers."""
        for member in self.members if index is None else [self.members[index]]:
            member.pause()

    def resume(self, index: int | None = None) -> None:
        for member in self.members if index is None else [self.members[index]]:
            if member.running:
                member.resume()

    def kill(self, index: int) -> None:
        """SIGKILL one member; its data directory stays for `restart`."""
        self.members[index].kill()

    def restart(self, index: int) -> None:
        """Start a killed member again, on the same ports and data, and wait until it is healthy."""
        member = self.members[index]
        member.kill()
        member.spawn()
        self._wait_healthy([member], time.monotonic() + START_TIMEOUT)

    def close(self) -> None:
        """SIGKILL every member and remove the directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for member in self.members:
            member.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
        self._gone()



class EtcdServer(EtcdCluster):
    """One etcd member. Its election timeout is 500 ms, so that it grants leases of 1 s (3/2 of it, rounded up)."""

    def __init__(self, binary: str | None = None, *, memory: bool = False,
                 tls: tuple[str, str] | None = None) -> None:
        super().__init__(1, binary, heartbeat_ms=50, election_ms=500, memory=memory, tls=tls)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class EtcdDeployment(Deployment):
    """fencelock on etcd (one member or a cluster), for the conformance suite. It owns its members: `close()` stops
    them.

    - `min_ttl` is the shortest lease the members grant (whole seconds: 1 s on an `EtcdServer`, 2 s with etcd's
      default election timeout).
    - `expiry_slack`: a lease's TTL is rounded up to whole seconds (under 1 s more), and the leader looks for
      expired leases every 0.5 s, then commits their revocation.
    - `stall_timeout`: a request to a stalled member fails after the client's 2 s timeout, and an acquire is tried
      again once per member (after short pauses), as long as its `wait` allows: 4 s on one member, 9.25 s on
      three.
    """

    kind = "etcd"
    """"etcd" on one member, "etcd3" on a cluster of three."""
    supports_fair = True
    expiry_slack = 1.0 + 0.5 + 0.3

    def __init__(self, cluster: EtcdCluster, prefix: str = "fencelock") -> None:
        super().__init__(cluster.url)
        self.cluster = cluster
        self.prefix = prefix
        if len(cluster.members) > 1:
            self.kind = f"etcd{len(cluster.members)}"  # "etcd3": a cluster of three members
        self.min_ttl = float(max(1, -(-3 * cluster.election_ms // 2000)))
        # One request per try, each up to the client's timeout, and the pauses between the tries.
        delays: list[float] = []
        while (delay := retry_after(len(delays) + 1, True, len(cluster.members))) is not None:
            delays.append(delay)
        self.stall_timeout = DEFAULT_TIMEOUT * (len(delays) + 1) + sum(delays)

    @classmethod
    def start(cls, n: int = 1, binary: str | None = None, *, memory: bool = True) -> EtcdDeployment:
        """A new deployment: one `EtcdServer` (n=1), or a cluster of `n` members, started and healthy."""
        cluster = EtcdServer(binary, memory=memory) if n == 1 else EtcdCluster(n, binary, memory=memory)
        return cls(cluster.start())

    def close(self) -> None:
        self.cluster.close()

    def _keys(self, name: str, limit: int = 0) -> list[dict[str, Any]]:
        directory = name_dir(self.prefix, name)
        answer = self.cluster.request("/v3/kv/range", {
            "key": _b64(directory), "range_end": _b64(range_end(directory)), "sort_order": "ASCEND",
            "sort_target": "CREATE", "limit": limit})
        found: list[dict[str, Any]] = answer.get("kvs", [])
        return found

    def holder(self, name: str) -> str | None:
        found = self._keys(name, 1)
        return base64.b64decode(found[0].get("value", "")).decode() if found else None

    def steal(self, name: str) -> None:
        """Delete the holder's key (its lease goes on: the holder must notice the key, not the lease)."""
        found = self._keys(name, 1)
        if found:
            self.cluster.request("/v3/kv/deleterange", {"key": found[0]["key"]})

    def pause(self) -> None:
        self.cluster.pause()

    def resume(self) -> None:
        self.cluster.resume()

    def ttl_left(self, name: str) -> float | None:
        """The holder's lease's TTL left, at most. etcd answers in whole seconds, rounded down, so the lease has
        between that and one second more: this is the upper end (0 when the lease or the key is gone)."""
        found = self._keys(name, 1)
        if not found:
            return 0.0
        answer = self.cluster.request("/v3/lease/timetolive", {"ID": int(found[0].get("lease", 0))})
        ttl = int(answer.get("TTL", -1))
        return 0.0 if ttl < 0 else ttl + 1.0

    def leftovers(self, name: str) -> list[str] | None:
        return [base64.b64decode(kv["key"]).decode() for kv in self._keys(name)]

    def queued(self, name: str) -> int | None:
        return max(0, len(self._keys(name)) - 1)
