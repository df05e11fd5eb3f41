"""Start and control a real ZooKeeper ensemble (three members by default) for tests.

    with ZooKeeperEnsemble(3) as ensemble:
        locks = fencelock.connect(ensemble.url("/my-test"))   # every member's client port; a chroot per test
        i = ensemble.leader()      # the index of the member that leads now
        ensemble.kill(i)           # SIGKILL one member; the others elect a new leader
        ensemble.wait_ready()      # the running members serve again, one of them as the leader
        ensemble.restart(i)        # the same ports and data directory: it rejoins as a follower
        ensemble.pause(j), ensemble.resume(j)   # SIGSTOP / SIGCONT one member

Each member is a `fencelock.testing.zookeeper.ZooKeeperServer` (Debian's `zookeeper` 3.8 on Java 17, found the
same way) in a temporary directory of its own, with its `myid` and a `zoo.cfg` that lists every member as
`server.N=127.0.0.1:<quorum port>:<election port>`. Every port is a free loopback port. The timing is the
standalone harness's: `tickTime` 100 ms (so a follower notices a stalled leader within `syncLimit` = 0.5 s) and
sessions from 0.2 s to 60 s. Each JVM's heap is capped at 128 MB, so three fit easily next to everything else.

The ensemble is ready when every running member answers `srvr` with its `Mode:` and exactly one of them says
`leader` (a member that has no quorum answers that it is not serving); every wait has a deadline. Only the
processes started here are ever signalled, by their PIDs; an `atexit` hook stops ensembles still running at exit.

`ZooKeeperEnsembleDeployment` is the conformance suite's view of an ensemble: its own chroot, with `pause()` and
`resume()` stalling every member.
"""

from __future__ import annotations

import re
import signal
import time

from ._harness import Harness
from .servers import free_port
from .zookeeper import START_TIMEOUT, ZooKeeperDeployment, ZooKeeperServer, four_letter_word

__all__ = ["ZooKeeperEnsemble", "ZooKeeperEnsembleDeployment"]

HEAP_MB = 128
"""Each member's JVM heap cap (`-Xmx`)."""


def _mode(answer: str) -> str | None:
    """`leader`, `follower` (or `standalone`) from a `srvr` answer; None when the member does not serve."""
    match = re.search(r"^Mode: (\w+)", answer, re.MULTILINE)
    return match.group(1) if match else None


class ZooKeeperEnsemble(Harness):
    """`size` ZooKeeper servers on loopback that form one ensemble."""

    def __init__(self, size: int = 3, *, name: str = "zk-ensemble") -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 2:
            raise ValueError(f"size must be an int of at least 2 (a ZooKeeperServer is one server), got {size!r}")
        self.size = size
        self.name = name
        # server.N=host:quorum:election for every member, the same lines in every zoo.cfg.
        peers = [f"server.{i + 1}=127.0.0.1:{free_port()}:{free_port()}" for i in range(size)]
        self.members: list[ZooKeeperServer] = []
        self._closed = False
        try:
            for i in range(size):
                self.members.append(ZooKeeperServer(name=f"{name}-{i + 1}", myid=i + 1, extra_config=peers,
                                                    heap_mb=HEAP_MB))
        except BaseException:
            self._close_members()
            raise
        self._live()

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.name} {self.address}>"

    @property
    def address(self) -> str:
        """Every member's client address, comma-separated, as kazoo takes them (`127.0.0.1:p1,127.0.0.1:p2,...`)."""
        return ",".join(member.address for member in self.members)

    def url(self, chroot: str = "") -> str:
        """`zookeeper://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3<chroot>`; give every test a chroot of its own."""
        return f"zookeeper://{self.address}{chroot}"

    def pids(self) -> list[int | None]:
        return [member.pid for member in self.members]

    # -- starting, and knowing who leads ----------------------------------------------------------------------

    def start(self) -> ZooKeeperEnsemble:
        """Start every member and wait (at most `START_TIMEOUT`) until the ensemble is ready."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        for member in self.members:
            member.spawn()
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def mode(self, i: int) -> str | None:
        """What member `i` says it is now (`leader`, `follower`), or None: it is down, stopped, or has no quorum."""
        member = self.members[i]
        if not member.running:
            return None
        return _mode(four_letter_word(member.host, member.port, "srvr", timeout=0.5))

    def wait_ready(self, timeout: float = START_TIMEOUT) -> int:
        """Wait until every running member serves and exactly one of them is the leader; return its index.

        Only a quorum can be ready: with a majority of the members down this raises RuntimeError at `timeout`.
        """
        deadline = time.monotonic() + timeout
        while True:
            for member in self.members:
                code = member.exit_code
                if code is not None and code != -signal.SIGKILL:
                    raise RuntimeError(f"{member.name} exited with code {code}\n{member.log_tail()}")
            running = [i for i, member in enumerate(self.members) if member.running]
            modes = {i: self.mode(i) for i in running}
            leaders = [i for i, mode in modes.items() if mode == "leader"]
            if running and all(mode is not None for mode in modes.values()) and len(leaders) == 1:
                return leaders[0]
            if time.monotonic() >= deadline:
                tails = "\n".join(f"--- {self.members[i].name}\n{self.members[i].log_tail(8)}" for i in running)
                raise RuntimeError(f"{self!r} not ready within {timeout:g} s (modes {modes})\n{tails}")
            time.sleep(0.05)

    def leader(self, timeout: float = START_TIMEOUT) -> int:
        """The index of the member that leads, once the running members are ready (see `wait_ready`)."""
        return self.wait_ready(timeout)

    def member_of_session(self, session_id: int) -> int | None:
        """The index of the member that client session `session_id` is connected to now (`cons` lists every
        connection with its `sid`), or None if no member has it."""
        wanted = f"sid=0x{session_id:x},"
        for i, member in enumerate(self.members):
            if member.running and wanted in four_letter_word(member.host, member.port, "cons", timeout=0.5):
                return i
        return None

    # -- faults, one member at a time -------------------------------------------------------------------------

    def kill(self, i: int) -> None:
        """SIGKILL member `i` (and reap it)."""
        self.members[i].kill()

    def pause(self, i: int) -> None:
        """SIGSTOP member `i`: its connections stay open and nothing answers."""
        self.members[i].pause()

    def resume(self, i: int) -> None:
        self.members[i].resume()

    def restart(self, i: int, timeout: float = START_TIMEOUT) -> None:
        """Kill member `i` if it runs, start it again on the same ports and data directory, and wait until the
        running members are ready (the member rejoins: it needs a quorum to serve)."""
        self.members[i].kill()
        self.members[i].spawn()
        self.wait_ready(timeout)

    def pause_all(self) -> None:
        for member in self.members:
            if member.running:
                member.pause()

    def resume_all(self) -> None:
        for member in self.members:
            if member.running:
                member.resume()

    # -- closing ----------------------------------------------------------------------------------------------

    def _close_members(self) -> None:
        for member in self.members:
            member.close()   # SIGKILL, reap, remove its directory

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._gone()
        self._close_members()



class ZooKeeperEnsembleDeployment(ZooKeeperDeployment):
    """The conformance suite's view of an ensemble: a chroot of its own; `pause()` stalls every member."""

    kind = "zookeeper3"

    def __init__(self, ensemble: ZooKeeperEnsemble, chroot: str | None = None, prefix: str = "fencelock", *,
                 owns_ensemble: bool = False) -> None:
        self.ensemble = ensemble
        self._owns_ensemble = owns_ensemble
        # `server` (the standalone deployment's) is the first member; every request below goes to the ensemble.
        super().__init__(ensemble.members[0], chroot, prefix)
        self.target = ensemble.url(self.chroot)

    @classmethod
    def start(cls) -> ZooKeeperEnsembleDeployment:
        """A new three-member ensemble of its own, which `close()` stops."""
        return cls(ZooKeeperEnsemble(3).start(), owns_ensemble=True)

    @property
    def hosts(self) -> str:
        """Every member: a look behind fencelock's back reaches whichever of them serves."""
        return self.ensemble.address

    def pause(self) -> None:
        self.ensemble.pause_all()

    def resume(self) -> None:
        self.ensemble.resume_all()

    def close(self) -> None:
        if self._owns_ensemble:
            self.ensemble.close()
