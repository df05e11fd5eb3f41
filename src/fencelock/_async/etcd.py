"""The etcd backend: locks as etcd's `concurrency.Mutex` keeps them, one lease and one key per acquisition.

Each step is one transaction of `fencelock._etcd.txn`, sent through the gateway client (`etcd_gateway`); the key
layout and what an answer means are in `fencelock._etcd.rules`. How and why: docs/design/etcd.md.
"""

from __future__ import annotations

import os
import threading
from functools import partial

from .._errors import BackendError, never_sent
from .._etcd import txn
from .._etcd.rules import (
    BLOCK_CAP,
    MAX_TXN_OPS,
    SETTLE_READS,
    Kv,
    Settle,
    Verdict,
    fence_key,
    keepalive_suffices,
    lease_seconds,
    lease_too_long,
    lock_key,
    name_dir,
    released,
    retry_after,
    settle,
    verdict,
    version_risk,
)
from .._etcd.url import EtcdTarget
from .._events import emit
from .._logic.admission import Urgency
from .._logic.outcomes import Attempt, Released
from .._logic.timing import Clock, Deadline, lease_clock
from ._concurrency import Call, T, in_background, unless_given_up
from .etcd_gateway import AsyncGateway
from .etcd_operators import AsyncEtcdOperators
from .etcd_waiting import AsyncSharedWatches, Held

SPARE_LEASES = 16
"""Leases a client keeps, per TTL, from acquisitions it released, for its next acquisitions: a spare lease needs a
keep-alive (the leader answers it without a disk write) where a new one needs a grant (a raft write and an fsync).
"""

CLOSE_TIMEOUT = 0.5
"""Seconds `close()` spends at most revoking the spare leases (keyless leases kept for reuse). A stalled or
unreachable server does not make `close()` wait for a request timeout: the leases it did not revoke end by their
TTL. The leases of waiters still queued get up to the URL's timeout first: their keys block the lock for others."""

RENEWAL_BATCH = 1000
"""Leases of one watchdog batch handled together: keep-alive requests, then transactions checking their keys."""

WAITER_REFRESH = 3
"""A waiter refreshes its lease when a `1/WAITER_REFRESH` part of its TTL has passed since the last refresh (not at
every look: with many waiters, those refreshes crowded out every other request). A grant refreshes it once more if
it is older than `BLOCK_CAP`, so its validity counts from no earlier than before (decision
2026-12-05-etcd-many-waiters)."""


class AsyncEtcdBackend(AsyncEtcdOperators):
    """Locks in etcd, one lease and one key per acquisition (see `fencelock._etcd.rules` for the layout)."""

    def __init__(self, target: EtcdTarget, *, prefix: str, clock: Clock = lease_clock) -> None:
        self._gateway = AsyncGateway(target, clock)
        self._target = target
        self._clock = clock  # the client's: every wait here is counted on it
        self._late_calls = 0  # extends and releases under way after close (`_after_close`)
        self._late_lock = threading.Lock()  # (never held across an await)
        self._prefix = prefix
        self.shown = self._gateway.shown
        self.block_cap = BLOCK_CAP
        self.supports_fair = True   # every waiter queues in arrival order; fair=True changes nothing
        self.always_queues = True
        self._held: dict[str, Held] = {}   # by token: the leases of acquisitions in progress or held
        self._spare: dict[int, list[tuple[int, int]]] = {}  # asked TTL: (lease, granted TTL), carrying no key
        self._spare_pid = os.getpid()  # a forked child never shares its parent's spare leases
        self.renewal_requests = 0  # keep-alive requests the watchdog made (for benchmarks)
        self._version_checked = False  # (once per client, after its first grant: `_check_version`)
        self._closed = False
        self._watches = AsyncSharedWatches(self._gateway, prefix, self._held, lambda: self._closed)

    def retry_after(self, exc: BackendError, failures: int) -> float | None:
        return retry_after(failures, self._gateway.transient(exc), self._gateway.endpoints)

    async def _alive(self, lease: int, name: str, urgency: Urgency = Urgency.RENEWAL) -> float | None:
        """Refresh one lease: when the refresh went out (its TTL restarted no earlier); None if the server no longer
        has it."""
        ttls, sent_at = await self._gateway.keepalive([lease], name, urgency)
        return sent_at if ttls[lease] > 0 else None

    async def _refresh(self, held: Held, name: str, urgency: Urgency) -> bool:
        """Refresh an acquisition's lease for an attempt (its validity counts from this sending): False if the
        server no longer has it."""
        sent_at = await self._alive(held.lease, name, urgency)
        if sent_at is None:
            return False
        held.fresh_at = sent_at
        return True

    # ------------------------------------------------------------------------------------------ acquire

    async def try_acquire(self, name: str, token: str, ttl_ms: int, wait: float = 0.0,
                          fair: bool = False) -> Attempt:
        """Join the name's queue (once per acquisition) and report whether we are its head; with `wait` > 0,
        watch our predecessor's key for up to `wait` seconds, then look again.

        Idempotent for one token: a retry after a lost answer finds its own lease and key.
        """
        deadline = Deadline.after(wait, self._clock())
        value = token.encode()
        held, mine, owner, before, revision = await self._join(name, token, ttl_ms)
        state = verdict(mine, value, owner)
        while state is Verdict.WAITING and not deadline.expired(self._clock()):
            if before is None:
                mine, owner, before, revision = await self._look(name, held)
                state = verdict(mine, value, owner)
                if state is not Verdict.WAITING or before is None:
                    break
            held.seen = (mine, owner, before, revision)
            wake = self._watches.watch(name, token, held, before.key, revision)
            woke = await unless_given_up(wake.signal.wait(deadline.remaining(self._clock())))
            if not woke:
                break  # the wait ended with our predecessor still there (or our caller gave up): not granted
            # After a wake-up, look again, our own key first: it may have gone with our lease meanwhile.
            self._watches.unwatch(name, held)
            mine, owner, before, revision = await self._look(name, held)
            state = verdict(mine, value, owner)
        if state is not Verdict.WAITING:
            self._watches.unwatch(name, held)
        # A waiter's lease is refreshed only now and then (`WAITER_REFRESH`): refresh it as it is granted, so its
        # validity counts from no earlier than it did before. Gone: the next attempt queues again.
        if state is Verdict.GRANTED and mine is not None and self._clock() - held.fresh_at > BLOCK_CAP and \
                not await self._refresh(held, name, Urgency.ONGOING):
            return Attempt(False, 0, None)
        if state is Verdict.GRANTED and mine is not None:
            held.granted = True
            if not self._version_checked:
                self._version_checked = True
                in_background(partial(self._check_version, name))
            return Attempt(True, mine.create_revision, None, valid_from=held.fresh_at)
        return Attempt(False, 0, None)

    async def _join(self, name: str, token: str,
                    ttl_ms: int) -> tuple[Held, Kv | None, Kv | None, Kv | None, int]:
        """Our lease, refreshed (or granted), and our key, put if it is absent; then our key, the holder's, and
        (when known) our predecessor's with the revision it was read at."""
        held = self._held.get(token)
        if held is not None:
            # Refresh first: the validity of a lease won now counts from this refresh's sending. The attempt's later
            # requests go ahead of new work (`Urgency.ONGOING`): the lease's TTL runs while they wait their turn.
            due = self._clock() - held.fresh_at >= held.seconds / WAITER_REFRESH
            if due and not await self._refresh(held, name, Urgency.ONGOING):
                self._watches.unwatch(name, held)
                held = None  # our lease ended (we paused, or it was revoked), and took our key: queue again
            elif held.rev and held.wake is not None and held.seen is not None and not held.wake.signal.is_set():
                # Waiting still: the name's shared watch has seen neither our key nor our predecessor's deleted
                # since our last look, so that look still holds (a held lease's grant looks again).
                return (held, *held.seen)
            elif held.rev:
                # Queued already: a look (a read) is enough, unless our key went (an operator removed it).
                mine, owner, before, revision = await self._look(name, held)
                if verdict(mine, token.encode(), owner) is not Verdict.GONE:
                    return held, mine, owner, before, revision
        seconds = lease_seconds(ttl_ms)
        if held is None:
            spare = self._take_spare(seconds)
            if spare is not None:
                held = Held(lock_key(self._prefix, name, spare[0]), spare[0], spare[1], seconds)
                self._held[token] = held
                if not await self._refresh(held, name, Urgency.NEW):
                    held = None  # it ran out while spare
                    del self._held[token]
        if held is None:
            # The lease is ours only once the grant's answer names it; a lost answer leaves an orphan lease with
            # no key on it, which its TTL ends (see `AsyncGateway.grant`).
            # New work: it waits its turn behind the attempts under way; the lease's validity counts from its sending.
            lease, granted_s, sent_at = await self._gateway.grant(seconds, name, Urgency.NEW)
            held = Held(lock_key(self._prefix, name, lease), lease, granted_s, seconds, fresh_at=sent_at)
            self._held[token] = held  # before the put: a retry after a lost answer finds its key by lease and token
        if self._closed:  # close() is revoking its waiters' leases: queue no key that it would miss
            self._held.pop(token, None)
            await self._revoke(held.lease, name)
            raise BackendError(f"this client of {self.shown} is closed", name=name)
        joined = await self._gateway.txn(txn.join(held.key, token, held.lease, name_dir(self._prefix, name)),
                                         "acquire", name, Urgency.ONGOING)
        mine, owner = txn.joined(joined)
        if mine is not None:
            held.rev = mine.create_revision
        return held, mine, owner, None, 0

    async def _look(self, name: str, held: Held) -> tuple[Kv | None, Kv | None, Kv | None, int]:
        """Our key, the holder's, and our predecessor's (the newest key older than ours), at one revision."""
        answer = await self._gateway.txn(txn.look(held.key, name_dir(self._prefix, name), held.rev), "acquire", name,
                                         Urgency.ONGOING)
        return txn.looked(answer, held.rev)

    async def leave(self, name: str, token: str) -> None:
        """A waiter gives up (or was cancelled): revoke its lease, which deletes its key."""
        held = self._held.pop(token, None)
        if held is not None:
            self._watches.unwatch(name, held)
            if held.moving is not None:
                await self._revoke(held.moving[0], name)
            await self._gateway.revoke(held.lease, name)

    # ------------------------------------------------------------------------------------------ release

    async def _after_close(self, call: Call[T]) -> T:
        """A lease granted before close() may still be extended and released (decision 2026-12-03-client-lifetime):
        such calls go through a gateway opened for them, closed again once the last of them is done."""
        with self._late_lock:
            if self._late_calls == 0:
                self._gateway = AsyncGateway(self._target, self._clock)
            self._late_calls += 1
            gateway = self._gateway
        try:
            return await call()
        finally:
            with self._late_lock:
                self._late_calls -= 1
                last = self._late_calls == 0
            if last:
                await gateway.aclose()

    async def release(self, name: str, token: str, fence: int) -> Released:
        """Delete our key if it still holds our token (and fence), recording the fence, in one transaction; then
        keep the lease as a spare (it carries no key now) or revoke it."""
        if self._closed:
            return await self._after_close(partial(self._release, name, token, fence))
        return await self._release(name, token, fence)

    async def _release(self, name: str, token: str, fence: int) -> Released:
        directory = name_dir(self._prefix, name)
        held = self._held.get(token)
        if held is None:  # nothing of ours is left on the server (released, or reported lost before)
            return released(False, txn.taken(await self._gateway.txn(txn.count_newer(directory, fence), "release",
                                                                      name, Urgency.RELEASE)))
        sent_before, held.releasing = held.releasing, True
        body = txn.release(held.key, token, fence, directory, fence_key(self._prefix, name))
        try:
            answer = await self._gateway.txn(body, "release", name, Urgency.RELEASE, again=False)
        except BackendError as exc:
            if never_sent(exc):
                held.releasing = sent_before  # it never left the client: nothing changed on the server
            if not self._gateway.unanswered(exc):
                raise
            # The connection closed before an answer: send it again, as a release whose first sending may have
            # been applied (a key found gone is then judged by the lease, not reported taken).
            sent_before = True
            answer = await self._gateway.txn(body, "release", name, Urgency.RELEASE, again=False)
        self._held.pop(token, None)  # the server answered: the token's work is done either way
        deleted = bool(answer.get("succeeded"))
        if held.moving is not None:  # our key (deleted now, or gone) may have been on it: it carries none now
            await self._revoke(held.moving[0], name)
        if not (deleted and self._keep_spare(held)):
            await self._revoke(held.lease, name)
        return released(deleted, 0 if deleted else txn.taken(answer), sent_before)

    def _take_spare(self, asked: int) -> tuple[int, int] | None:
        if self._spare_pid != os.getpid():
            self._spare, self._spare_pid = {}, os.getpid()
        try:
            return self._spare.get(asked, []).pop()
        except IndexError:
            return None

    def _keep_spare(self, held: Held) -> bool:
        """Keep the lease of a released acquisition (its key is deleted) for a next one, if there is room."""
        if self._closed:  # (released after close: nothing will take it)
            return False
        spare = self._spare.setdefault(held.asked, [])
        if self._spare_pid != os.getpid() or len(spare) >= SPARE_LEASES:
            return False
        spare.append((held.lease, held.seconds))
        return True

    # ------------------------------------------------------------------------------------------ extend

    async def extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        """`lease.extend(ttl=)`: keep our key on its lease, or move it to a lease of the new TTL, longer, or far
        shorter (`lease_too_long`)."""
        if self._closed:
            return await self._after_close(partial(self._extend, name, token, fence, ttl_ms, shrink=True))
        return await self._extend(name, token, fence, ttl_ms, shrink=True)

    async def _extend(self, name: str, token: str, fence: int, ttl_ms: int, *, shrink: bool) -> bool:
        """`shrink`: a caller's new TTL (a renewal only keeps the TTL the lease has: it never moves the key down)."""
        held = self._held.get(token)
        if held is None:
            return False
        if held.moving is not None and await self._settle(name, token, fence, held) is None:
            return False
        if not keepalive_suffices(held.seconds, ttl_ms) or (shrink and lease_too_long(held.asked, ttl_ms)):
            return await self._move(name, token, fence, ttl_ms, held)
        alive = await self._alive(held.lease, name) is not None
        ours = alive and await self._ours(name, [(token, fence, held)]) == [True]
        if not ours:
            await self._lost(name, token, held, alive)
        return ours

    async def _ours(self, name: str, keys: list[tuple[str, int, Held]]) -> list[bool]:
        """Whether each key still holds its token and fence, and is on its lease (one transaction)."""
        answer = await self._gateway.txn(txn.check([held.key for _, _, held in keys]), "extend", name,
                                         Urgency.RENEWAL)
        return txn.still_ours(answer, [(token, fence, held.lease) for token, fence, held in keys])

    async def _lost(self, name: str, token: str, held: Held, lease_alive: bool) -> None:
        """Our key is gone or not ours: forget the acquisition, and end its lease if it still runs."""
        self._held.pop(token, None)
        if lease_alive:
            await self._revoke(held.lease, name)

    async def _move(self, name: str, token: str, fence: int, ttl_ms: int, held: Held) -> bool:
        """Extend past the lease's own TTL, or far below it (`keepalive_suffices`): put our key on a new lease of the
        new TTL (its create revision, the fence, stays), then revoke the old lease. A move whose answer never came is
        settled by reading the key (`_settle`): a lease our key may be on is never revoked."""
        asked = lease_seconds(ttl_ms)
        lease, seconds, _ = await self._gateway.grant(asked, name, Urgency.RENEWAL)
        held.moving = (lease, seconds, asked)  # from the move's sending on, our key may be on it
        try:
            answer = await self._gateway.txn(txn.move(held.key, token, fence, lease, held.version), "extend", name,
                                             Urgency.RENEWAL)
        except BackendError:
            try:
                settled = await self._settle(name, token, fence, held)
            except BackendError:
                raise  # still unknown: the next extend or renewal reads the key again
            if settled is None:
                return False  # gone, or not ours: lost
            if settled:
                return True  # the move was applied: our key is on the new lease
            raise  # it was not, and never will be: the lease is as it was, and the new one is ended
        if not answer.get("succeeded"):
            held.moving = None
            await self._revoke(lease, name)
            await self._lost(name, token, held, True)
            return False
        old, held.lease, held.seconds, held.asked, held.moving = held.lease, lease, seconds, asked, None
        held.version += 1
        await self._revoke(old, name)
        return True

    async def _settle(self, name: str, token: str, fence: int, held: Held) -> bool | None:
        """After a move whose answer never came: learn which lease our key is on (`settle`), and keep that one.
        True: the new one (adopted; the old one is ended); False: the old one (the new one is ended); None: our key
        is gone or is not ours (the acquisition is forgotten, and both leases are ended). A move that may yet land
        is first made void. Unanswered, the outcome stays unknown (BackendError); the next extend settles again."""
        assert held.moving is not None
        lease, seconds, asked = held.moving
        for _ in range(SETTLE_READS):
            [mine] = txn.ranges(await self._gateway.txn(txn.check([held.key]), "extend", name, Urgency.RENEWAL))
            kv = mine[0] if mine else None
            found = settle(kv, token.encode(), fence, held.lease, lease, held.version)
            if found is Settle.GONE:
                held.moving = None
                self._held.pop(token, None)
                await self._revoke(lease, name)
                await self._revoke(held.lease, name)
                return None
            if found is Settle.MOVED:
                assert kv is not None
                old, held.lease, held.seconds, held.asked, held.moving = held.lease, lease, seconds, asked, None
                held.version = kv.version
                await self._revoke(old, name)
                return True
            if found is Settle.UNDECIDED:  # void the move: take its version first (only one of the two applies)
                again = await self._gateway.txn(txn.move(held.key, token, fence, held.lease, held.version),
                                                "extend", name, Urgency.RENEWAL)
                if not again.get("succeeded"):
                    continue  # the move landed just before, or our key went: read again
                held.version += 1
            else:
                assert kv is not None
                held.version = kv.version  # an earlier put again landed, its answer lost
            held.moving = None
            await self._revoke(lease, name)
            return False
        raise BackendError(f"the extend's move on {self.shown} could not be settled: our key changed under every "
                           f"read; extend again", name=name)

    async def extend_many(self, leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
        """The watchdog's batch: one keep-alive request per `KEEPALIVE_BATCH` leases, then one transaction per
        `MAX_TXN_OPS` keys to check that each key is still ours. True extended, False lost, None no answer."""
        results: list[bool | None] = [None] * len(leases)
        plain: list[int] = []
        for i, (name, token, fence, ms) in enumerate(leases):
            held = self._held.get(token)
            if held is None:
                results[i] = False
            elif held.moving is None and keepalive_suffices(held.seconds, ms):
                plain.append(i)
            else:
                try:
                    results[i] = await self._extend(name, token, fence, ms, shrink=False)
                except BackendError:
                    pass
        for start in range(0, len(plain), RENEWAL_BATCH):
            chunk = plain[start:start + RENEWAL_BATCH]
            helds = {i: self._held[leases[i][1]] for i in chunk if leases[i][1] in self._held}
            sent = self._gateway.keepalive_requests
            try:
                ttls, _ = await self._gateway.keepalive([held.lease for held in helds.values()],
                                                        leases[chunk[0]][0])
            except BackendError:
                continue
            finally:
                self.renewal_requests += self._gateway.keepalive_requests - sent
            alive = []
            for i, held in helds.items():
                if ttls[held.lease] > 0:
                    alive.append(i)
                else:
                    results[i] = False
                    await self._lost(leases[i][0], leases[i][1], held, False)
            for first in range(0, len(alive), MAX_TXN_OPS):
                group = alive[first:first + MAX_TXN_OPS]
                try:
                    answers = await self._ours(leases[group[0]][0],
                                               [(leases[i][1], leases[i][2], helds[i]) for i in group])
                except BackendError:
                    continue
                for i, ours in zip(group, answers, strict=True):
                    results[i] = ours
                    if not ours:
                        await self._lost(leases[i][0], leases[i][1], helds[i], True)
        return results

    async def aclose(self) -> None:
        """End the leases of this client's waiters still queued (their keys go with them), within the URL's
        timeout, then the spare leases, within `CLOSE_TIMEOUT` (best effort: their TTL ends the others); then close
        the connections. Leases still held are left to their TTL."""
        self._closed = True
        spare, self._spare = self._spare, {}
        if self._spare_pid == os.getpid():
            now = self._clock()
            waiting = [held.lease for held in list(self._held.values()) if not held.granted]
            await self._revoke_within(waiting, Deadline.after(self._gateway.timeout, now))
            await self._revoke_within([lease for leases in spare.values() for lease, _ in leases],
                                      Deadline.after(CLOSE_TIMEOUT, self._clock()))
        await self._gateway.aclose()

    async def _check_version(self, name: str) -> None:
        """Warn (an "unsafe_version" event) if the server runs an etcd version that may revoke live leases
        (`version_risk`). Best effort, in the background: it never delays or fails a grant."""
        if self._closed:
            return
        risk = version_risk(await self._gateway.server_version())
        if risk is not None:
            emit("unsafe_version", name, "etcd", "acquire", error=f"{self.shown}: {risk}")

    async def _revoke_within(self, leases: list[int], deadline: Deadline) -> None:
        """Revoke `leases` one by one until `deadline`; the first that gets no answer in time ends it (the server
        is stalled or gone: the others end by their TTL)."""
        for lease in leases:
            left = min(deadline.remaining(self._clock()), self._gateway.timeout)
            if left <= 0:
                return
            try:
                await self._gateway.revoke(lease, None, timeout=left)
            except BackendError:
                return
