# Generated from _async/redlock_nodes.py by scripts/unasync.py: do not edit, edit that file instead.
"""Redlock's nodes as the backend sees them: who each is (a "yes" counts only from a known, independent master),
and each node's gate (look, heal, mark a new deployment, repair). `RedlockNodes`: a base of `RedlockBackend`,
holding that state; the rules are `fencelock._redis.redlock`'s."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from redis import Redis
from redis.exceptions import ReadOnlyError

from .._errors import BackendError, NotIndependent, QuorumUnavailable
from .._events import emit
from .._redis.keys import fence_match
from .._redis.redlock import (
    GATE_TIMEOUT,
    NEW_DEPLOYMENT,
    NO_ANSWER,
    REPAIR_BATCH,
    UNSURE,
    Answer,
    Gate,
    GateView,
    Identity,
    NodesReport,
    Repair,
    deployment_floor,
    deployment_id,
    deployment_step,
    durable_run,
    live_ttl,
    look_timeout,
    mark_args,
    marked,
    newly_out,
    node_code,
    node_states,
    not_independent,
    plan_heal,
    repair_marks,
    repair_progress,
    repaired,
    required_delay,
    server_error,
    unavailable,
    verdict,
)
from .._redis.request import Held
from .._scripts import REDLOCK_GATE, REDLOCK_MARK
from ._concurrency import Handle, given_up, now, start, wait_first
from ._fanout import fan_out
from .redis_commands import CLIENT_ERRORS, run_script


class RedlockNodes:
    """Who each node is and its gate: a base class of `RedlockBackend`, which sets the attributes declared
    here, then calls `_init_nodes`."""

    _nodes: list[Redis]
    _n: int
    _shown: list[str]
    _prefix: str
    _repair: bool
    _repair_delay_ms: int
    _window_ms: int
    _gate_keys: list[str]
    _ttls: str
    _closed: bool

    def _init_nodes(self, places: list[set[str]] | None) -> None:
        # Who each node is (first contact): until a node said so, no "yes" of its counts (`_codes`, `_views`).
        self._places = places if places is not None else [set() for _ in range(self._n)]
        self._ids: list[Identity | None] = [None] * self._n
        self._roles = [False] * self._n  # its role (master or replica) is known
        self._contacted = False
        self._identifying = False
        self._identifying_now: Handle[None] | None = None  # the identities being asked (`_ask_unknown`)
        self._problem: str | None = None  # two nodes are one server, or one is a replica (`not_independent`)
        self._reported: dict[int, str] = {}  # node -> the state its last node_out event told (`newly_out`)
        self._repairing: set[int] = set()
        self._healing = False
        self._heal_now: Handle[tuple[bool, list[GateView | None]]] | None = None  # (`_shared_heal`)
        self._heal_lock = threading.Lock()

    # -- a yes counts only from a node known to be who it is ----------------------------------------------

    def _codes(self, done: dict[int, Any]) -> dict[int, int]:
        """A release's or extend's codes as they count: a "done" from a node that has not said which server it is
        yet (its acquire reply, or `_identify`) counts as no answer, so that two names of one server can never
        make up a quorum; its "not ours" counts (it can only lower the count)."""
        codes = {i: node_code(reply) for i, reply in done.items()}
        return {i: NO_ANSWER if self._ids[i] is None and code not in (0, -1) else code for i, code in codes.items()}

    def _counted(self, done: dict[int, Any]) -> dict[int, int]:
        """`_codes`, once the identities being asked again (`_reconnecting`) are known, if a "yes" waits for one:
        a node that came back answers who it is as fast as it answered the script, so a release or extend right
        after a fault still counts it (one that does not answer holds nothing up: it has no "yes" to count)."""
        if any(self._ids[i] is None and node_code(reply) in (1, UNSURE) for i, reply in done.items()):
            self._identified()
        return self._codes(done)

    def _identified(self) -> None:
        """Wait, at most a look's timeout, for the identities being asked (`_ask_unknown`)."""
        handle = self._identifying_now
        if handle is not None and not handle.done():
            wait_first([handle], GATE_TIMEOUT)

    def _known_rows(self, done: dict[int, list[int] | None]) -> dict[int, list[int] | None]:
        """A renewal batch's replies as they count (see `_codes`)."""
        return {i: row if row is None or self._ids[i] is not None else [NO_ANSWER if c == 1 else c for c in row]
                for i, row in done.items()}

    # -- nodes that lost their data -------------------------------------------------------------------------

    def _unavailable(self, why: str, name: str, answers: list[Answer],
                     views: list[GateView | None] | None) -> QuorumUnavailable:
        """QuorumUnavailable naming every node, its state and when its quarantine ends (`unavailable`)."""
        text, states, found = unavailable(why, self._shown, answers, views, time.time())
        if not given_up():  # (a cancelled caller's requests were not sent: that says nothing about the nodes)
            changed, self._reported = newly_out(self._reported, states)
            for i in changed:  # once per change of a node's state, not at every retry of a waiter
                emit("node_out", name, "redlock", "acquire", error=states[i].describe())
        return QuorumUnavailable(text, name=name, nodes=tuple(states), retry_in=found.eta)

    def nodes(self) -> NodesReport:
        """Every node's bookkeeping as an operator sees it, read without changing anything, and the verdict."""
        self._contact(GATE_TIMEOUT, None)
        views = self._look(GATE_TIMEOUT, peek=True)
        states = node_states(self._shown, views, time.time(), self._repair_delay_ms / 1000.0)
        return NodesReport(tuple(states), verdict(states, self._n))

    # -- who each node is ---------------------------------------------------------------------------------------

    def _check_independent(self, name: str | None, timeout: float) -> None:
        """Raise `NotIndependent` if the nodes were found not to be independent; ask the others (`_ask_unknown`)."""
        self._ask_unknown(timeout)
        if self._problem is not None:
            raise NotIndependent(self._problem, name=name)

    def _ask_unknown(self, timeout: float) -> None:
        """Ask the nodes whose role is not known yet who they are, in the background (a replica is refused at the
        next request); meanwhile each node's acquire reply says which server it is (`_who_answered`)."""
        if self._problem is None and not all(self._roles) and not self._identifying and not self._closed:
            self._identifying = self._contacted = True
            self._identifying_now = start(partial(self._identify, look_timeout(timeout)))

    def _who_answered(self, answers: list[Answer], done: dict[int, Any]) -> str | None:
        """Learn each node's server from its acquire reply (its run_id), and ask a node that refused as a
        replica (READONLY) who it is; why the nodes are not independent, if they are not (`not_independent`)."""
        for i, answer in enumerate(answers):
            known = self._ids[i]
            if answer.run and (known is None or known.run_id != answer.run):
                self._ids[i] = Identity(answer.run, None if known is None else known.replica_of)
        replicas = [i for i, reply in done.items() if isinstance(reply, ReadOnlyError)]
        if replicas:
            found, _ = fan_out([partial(self._identity, i) for i in replicas], GATE_TIMEOUT,
                                     lambda so_far: len(so_far) == len(replicas))
            for k, i in enumerate(replicas):
                self._ids[i] = found.get(k) or self._ids[i]
                self._roles[i] = self._roles[i] or k in found
        self._problem = self._problem or not_independent(self._shown, self._ids, self._places)
        return self._problem

    def _contact(self, timeout: float, name: str | None) -> None:
        """Before an operator's request: at first contact, and after a node failed (it may reconnect to another
        server: `_reconnecting`), ask the nodes not known who they are (`Identity`) and wait for the answers, so
        that only the replies of distinct masters count (`_codes`, `_views`); else in the background.
        `NotIndependent` names the URLs if they are not independent."""
        if self._problem is None and not all(self._roles) and (not self._contacted or not self._identifying):
            self._contacted = self._identifying = True
            self._identify(look_timeout(timeout))
        self._check_independent(name, timeout)

    def _server_errors(self, done: dict[int, Any]) -> str:
        """The nodes that answered with an error of their own (`server_error`), for a message: they are not down."""
        found = [(i, server_error(reply)) for i, reply in sorted(done.items())]
        return "".join(f"; {self._shown[i]}: server error: {error}" for i, error in found if error is not None)

    @staticmethod
    def _failed(reply: Any) -> bool:
        """No answer, or a network fault (not the server's own error): its next request connects anew. A request
        the client kept (`Held`: it never left the client) says nothing about its node."""
        return reply is None or (isinstance(reply, Exception) and not isinstance(reply, Held)
                                 and server_error(reply) is None)

    def _failures(self, done: dict[int, Any], started: float, timeout: float) -> list[int]:
        """The nodes that failed a request sent at `started`: a network fault, or no answer within `timeout`. A node
        whose reply was still on its way when a quorum settled the request early has not failed."""
        timed_out = now() - started >= timeout
        return [i for i in range(self._n)
                if (timed_out or done.get(i) is not None) and self._failed(done.get(i))]

    def _reconnecting(self, nodes: Iterable[int]) -> None:
        """These nodes failed: their next connection may reach another server (a moved DNS name or virtual IP,
        a replica promoted behind a proxy). Who each is gets asked again (`_ask_unknown`, `_contact`), and until
        then no "yes" of theirs counts (`_codes`); an acquire's reply says at once (`_who_answered`)."""
        for i in nodes:
            self._ids[i], self._roles[i] = None, False

    def _identify(self, timeout: float) -> None:
        """Ask every node whose role is not known yet who it is (`_identity`); nothing once the client is closed."""
        try:
            asked = [i for i in range(self._n) if not self._roles[i] and not self._closed]
            done, _ = fan_out([partial(self._identity, i) for i in asked], timeout,
                                    lambda so_far: len(so_far) == len(asked))
            for k, i in enumerate(asked):
                found = done.get(k)
                if found is not None:
                    self._ids[i], self._roles[i] = found, True
            self._problem = self._problem or not_independent(self._shown, self._ids, self._places)
        finally:
            self._identifying = False

    def _identity(self, i: int) -> Identity | None:
        """Node i's run_id and role, or None if it did not say (`Identity`)."""
        client: Any = self._nodes[i]
        try:
            with client.pipeline(transaction=False) as pipe:
                pipe.info("server")
                pipe.info("replication")
                server, replication = pipe.execute()
        except CLIENT_ERRORS:
            return None
        return Identity.from_info(server, replication)

    # -- gates ----------------------------------------------------------------------------------------------------

    def _durable_run(self, i: int) -> str:
        """Node i's run_id if that very process runs AOF with fsync always (`durable_run`), else ''."""
        client: Any = self._nodes[i]
        try:
            with client.pipeline(transaction=False) as pipe:
                pipe.config_get("appendonly")
                pipe.config_get("appendfsync")
                pipe.info("server")
                appendonly, appendfsync, info = pipe.execute(raise_on_error=False)
        except CLIENT_ERRORS:
            return ""
        if any(isinstance(reply, Exception) for reply in (appendonly, appendfsync, info)):
            return ""  # CONFIG refused (a managed service, an ACL): not known to be durable
        return durable_run(appendonly.get("appendonly"), appendfsync.get("appendfsync"), info)

    def _gate(self, i: int, peek: bool, delay_ms: int | None = None) -> GateView | None:
        """Node i's gate (`redlock_gate.lua`); UNKNOWN if it failed. If its server restarted since, the gate asks
        whether it is durable (`_durable_run`), and is asked again saying so. `delay_ms`: the quarantine to ask for
        (default: this client's repair delay)."""
        durable = "?"
        while True:
            args = [self._repair_delay_ms if delay_ms is None else delay_ms, self._window_ms,
                    secrets.token_hex(16), 1 if peek else 0, durable]
            try:
                raw = run_script(self._nodes[i], REDLOCK_GATE, self._gate_keys, args, name="",
                                       where=self._shown[i])
                view = GateView.decode(raw)
            except (BackendError, ValueError, TypeError):
                return GateView(Gate.UNKNOWN)
            if view.gate is not Gate.RESTARTED or durable != "?":
                return view
            durable = self._durable_run(i)

    def _look(self, timeout: float, peek: bool = False) -> list[GateView | None]:
        done, _ = fan_out([partial(self._gate, i, peek) for i in range(self._n)], look_timeout(timeout),
                                lambda so_far: len(so_far) == self._n)
        return [done.get(i) for i in range(self._n)]

    def _heal(self, timeout: float) -> tuple[bool, list[GateView | None]]:
        """Look at every node's gate and follow `plan_heal`: mark a new deployment, repair what can be repaired.

        Returns whether some node counts again (worth another round now), and the look.
        """
        self._healing = True
        try:
            views = self._look(timeout)
            plan = plan_heal(views, self._n, self._repair, busy=self._repairing)
            if plan.fresh:
                return self._mark_new(views, timeout), views
            if not plan:
                return False, views
            calls = ([partial(self._mark, i, views[i], "plain") for i in plan.plain]
                     + [partial(self._repair_node, r) for r in plan.repairs])
            done, _ = fan_out(calls, look_timeout(timeout) * 2, lambda so_far: len(so_far) == len(calls))
            return any(done.values()), views
        finally:
            self._healing = False

    def _shared_heal(self, timeout: float) -> tuple[bool, list[GateView | None] | None]:
        """The heal an attempt called for: the one already running if there is one. Attempts that meet unready
        nodes at the same time (many waiters of a new client) share it, so its requests and connections stay few.
        A heal not done in time counts as one that healed nothing."""
        with self._heal_lock:  # (threads look at once)
            handle = self._heal_now
            if handle is None or handle.done():
                handle = self._heal_now = start(partial(self._heal, timeout))
        done, _ = wait_first({handle}, look_timeout(timeout) * 4)
        return handle.result() if handle in done else (False, None)

    def _mark_new(self, views: list[GateView | None], timeout: float) -> bool:
        """A new deployment (every node fresh): claim every node for it, then, if every claim held, mark all, with
        one floor (`deployment_floor`)."""
        deployment, floor = deployment_id(views), deployment_floor(views)
        for mode in NEW_DEPLOYMENT:
            calls = [partial(self._mark, i, views[i], mode, deployment, floor) for i in range(self._n)]
            done, _ = fan_out(calls, look_timeout(timeout), lambda so_far: len(so_far) == self._n)
            step = deployment_step(mode, [bool(done.get(i)) for i in range(self._n)])
            if step is not None:
                return step
        return True

    def _mark(self, i: int, view: GateView | None, mode: str, deployment: str = "0", floor: int = 0) -> bool:
        """Claim or mark node i (claim, fresh: a new deployment; plain: repair=False) as `mark_args` says."""
        try:
            code = run_script(self._nodes[i], REDLOCK_MARK, self._gate_keys[:2],
                                    mark_args(view, mode, deployment, floor), name="", where=self._shown[i])
        except BackendError:
            return False
        return marked(int(code))

    def _repair_node(self, repair: Repair) -> bool:
        """Raise node i's hwm to what `repaired` merges from the ready others, then mark it (`repair_marks`)."""
        i = repair.node
        self._repairing.add(i)
        try:
            others, delays = [], []
            for j in repair.sources:
                read = self._read_fences(j)
                if read is not None:
                    others.append((read[0], read[1]))
                    delays.append(read[2])
            merged = repaired(others, self._n, repair.clock)
            if merged is None:
                return False  # not enough ready nodes answered: it stays out, and a later attempt tries again
            delay_ms = round(required_delay(self._repair_delay_ms / 1000.0, delays) * 1000)
            if delay_ms > self._repair_delay_ms:
                # A client with a longer repair delay (so maybe a longer TTL) was granted a lease on the others:
                # the quarantine must last that long. The gate keeps the longest asked for; the mark checks it.
                view = self._gate(i, False, delay_ms)
                if view is None or view.nonce != repair.nonce:
                    return False
            for fence_keys, args in repair_marks(repair, *merged):
                code = int(run_script(self._nodes[i], REDLOCK_MARK, self._gate_keys[:2] + fence_keys, args,
                                            name="", where=self._shown[i]))
                progress = repair_progress(code)
                if progress is not None:
                    return progress
            return True
        except BackendError:
            return False
        finally:
            self._repairing.discard(i)

    def _read_fences(self, j: int) -> tuple[int, dict[str, int], float] | None:
        """A ready node's floor, hwm keys and the longest TTL of a lease there that may still be valid (seconds,
        `live_ttl`). None: it did not count before or after the reads (not ready, or its server restarted since it
        was marked), or failed."""
        client: Any = self._nodes[j]
        before = self._gate(j, True)
        if before is None or before.gate is not Gate.READY:
            return None
        try:
            # Keys as bytes whatever the client's decoding; kept as text that goes back out as the same bytes.
            keys = [key for key in client.scan_iter(match=fence_match(self._prefix).encode("utf-8"),
                                                          count=1000, NEVER_DECODE=True)]
            values: dict[str, int] = {}
            for start in range(0, len(keys), REPAIR_BATCH):
                batch = keys[start:start + REPAIR_BATCH]
                for key, value in zip(batch, client.mget(batch), strict=True):
                    if value is not None:
                        values[bytes(key).decode("utf-8", "surrogateescape")] = int(value)
            with client.pipeline(transaction=False) as pipe:
                pipe.time()
                pipe.zrange(self._ttls, 0, -1, withscores=True)
                (seconds, micros), entries = pipe.execute()
            delay = live_ttl(entries, seconds * 1000 + micros / 1000)
        except CLIENT_ERRORS:
            return None
        after = self._gate(j, True)  # one process throughout: a restart in between would show here
        if after is None or after.gate is not Gate.READY or after.nonce != before.nonce:
            return None
        return before.floor, values, delay
