"""A lease's life by the local monotonic clock: valid until when, next due, a renewal in flight, held or gone.

`LeaseState` is what the lease and the renewal watchdog share; every change to it is one of its methods, and each
takes the times it needs as arguments. Loss is final: nothing brings a lost or released lease back.

The validity rule: `remaining()` never exceeds what the server keeps, whatever order requests land in there.
- At most one request that sets the key's expiry (a renewal or an extend) is in flight per lease (`take`): a
  second one waits for the first's answer, so they land in the order they were sent.
- A confirmed one counts from its own start, with the TTL it sent (`renewed`, `extended`).
- One that got no answer may still land later, after requests sent since (on another connection, behind a proxy
  or a stalled server): the shortest TTL of those (`unsettled`) bounds every later count, for the lease's life.
- One still on the wire may already be applied: from its sending until its answer settles it, its validity end
  (`bound`) caps every claim, so an extend to a shorter TTL is counted from the moment it may land.
"""

from __future__ import annotations

import enum
import math
from typing import Generic, TypeVar

from .args import RENEW_FRACTION
from .outcomes import Released, State, after_release
from .timing import renewal_retry, validity_end

F = TypeVar("F")


class Tick(enum.Enum):
    """What the watchdog does with a lease that came due."""

    DROP = "drop"      # released or lost: no longer watched
    EXPIRE = "expire"  # its validity ran out before a renewal was confirmed: it is lost now
    RENEW = "renew"    # renew it in this tick's batch, and look again when its validity ends
    WATCH = "watch"    # nothing to send (no renewal, or one in flight): look again when its validity ends


class Renewal(enum.Enum):
    """What a renewal's answer means for the lease."""

    EXTENDED = "extended"    # valid for its TTL counted from the request's start; due again after an interval
    GONE = "gone"            # the server says the key was deleted or taken: the lease is lost
    RETRY = "retry"          # no answer: try again soon, never after the validity ends
    GIVE_BACK = "give_back"  # lost meanwhile, yet the late renewal got through: release that key
    IGNORE = "ignore"        # released (or lost) meanwhile: nothing to do


# Module constants: an Enum member's lookup costs about 80 ns, and these checks run per lease and renewal.
_HELD, _RELEASED, _LOST = State.HELD, State.RELEASED, State.LOST


class LeaseState(Generic[F]):
    """One lease's state. `renewal` holds the caller's token for the one request in flight that sets the key's
    expiry, a renewal or an extend (None: none is); `unsettled` the shortest TTL of such requests that got no
    answer (inf: none)."""

    __slots__ = ("bound", "due", "lost_reason", "releasing", "renew_every", "renewal", "state", "ttl",
                 "uncertain_at", "unsettled", "valid_until")

    def __init__(self, ttl: float, valid_until: float, renew_every: float | None) -> None:
        self.state = _HELD
        self.ttl = ttl
        self.valid_until = valid_until
        self.renew_every = renew_every  # None: not renewed (or no longer: the holder is releasing it)
        # First due one interval after the grant's request started; without renewal, when the validity ends.
        self.due = valid_until if renew_every is None else valid_until - ttl + renew_every
        self.renewal: F | None = None
        self.lost_reason = ""
        self.uncertain_at: float | None = None  # a release was sent and never answered, at this time
        self.releasing = False  # the holder asked for a release: it claims nothing from then on
        self.unsettled = math.inf
        self.bound = math.inf  # the validity end of the request in flight that may set a shorter TTL (inf: none)

    # -- reading ---------------------------------------------------------------------------------------------

    def remaining(self, now: float) -> float:
        """Seconds of validity left: 0 once released or lost, and from the moment a release is asked for (the server
        may free the lock as soon as the request lands, before its answer comes)."""
        if self.state is not _HELD or self.releasing or self.uncertain_at is not None:
            return 0.0
        return max(0.0, min(self.valid_until, self.bound) - now)

    def is_lost(self, now: float) -> bool:
        """Known lost, or held past its validity (or an unanswered request's shorter one) unrenewed."""
        return self.state is _LOST or (self.state is _HELD and now >= min(self.valid_until, self.bound))

    def early(self, share: float) -> float:
        """How early it may be renewed (`share` of its interval); never early for its end-of-validity check."""
        return 0.0 if self.renew_every is None or self.due >= self.valid_until else self.renew_every * share

    # -- the watchdog ----------------------------------------------------------------------------------------

    def tick(self, now: float) -> Tick:
        """The lease came due at `now`. Unless dropped or expired it is looked at again when its validity ends
        (whatever the network does; a renewal's answer reschedules it sooner)."""
        if self.state is not _HELD:
            return Tick.DROP
        end = min(self.valid_until, self.bound)
        if now >= end:
            return Tick.EXPIRE
        self.due = end
        return Tick.RENEW if self.renew_every is not None and self.renewal is None else Tick.WATCH

    def sending(self, flight: F, ttl: float, sent_at: float) -> None:
        """A renewal of this lease with `ttl` goes out after `sent_at` (`tick` said RENEW, so none was in flight);
        `flight` is what a release or an extend waits on until its answer came. Like an extend (`extending`), it
        caps the claim by its TTL until its answer (never lower in practice: it carries the lease's TTL)."""
        self.renewal = flight
        self.bound = min(self.bound, validity_end(ttl, sent_at))

    def take(self, flight: F) -> F | None:
        """The holder's extend wants to go: None, and `flight` is now the request in flight; or the one already
        in flight (a renewal, another extend), to wait for before asking again."""
        if self.renewal is None:
            self.renewal = flight
            return None
        return self.renewal

    def done(self, flight: F) -> None:
        """The holder's extend `flight` (from `take`) has its outcome: the next request may go."""
        if self.renewal is flight:
            self.renewal = None
            self.bound = math.inf

    def extending(self, ttl: float, sent_at: float) -> None:
        """The holder's extend to `ttl` (its turn taken) goes out at `sent_at`: the server may apply it at any moment
        from now, before its answer comes, so until that answer settles it (`extended`, `extend_unknown`) the lease
        claims no more than this TTL gives."""
        self.bound = min(self.bound, validity_end(ttl, sent_at))
        self.due = min(self.due, self.bound)  # (a watched lease is looked at when it ends: `AsyncWatchdog.reschedule`)

    def _every(self, every: float) -> float:
        """The renewal interval to keep: `every`, but never more than a third of the TTL that is counted (an
        unanswered shorter request bounds every later count), so a renewal always comes well before the end."""
        return min(every, min(self.ttl, self.unsettled) * RENEW_FRACTION)

    def _count(self, ttl: float, sent_at: float) -> None:
        """A confirmed request sent at `sent_at` with `ttl`: valid from its start, for at most the shortest TTL
        that an unanswered earlier request may still set when it lands."""
        self.valid_until = validity_end(min(ttl, self.unsettled), sent_at)

    def _unanswered(self, ttl: float, sent_at: float) -> None:
        """A request with `ttl` got no answer: applied at once, it bounds the validity now; landing later, every
        later count (`_count`)."""
        self.valid_until = min(self.valid_until, validity_end(ttl, sent_at))
        self.unsettled = min(self.unsettled, ttl)

    def renewed(self, extended: bool | None, ttl: float, sent_at: float, now: float) -> Renewal:
        """The renewal sent at `sent_at` with `ttl` was answered at `now`: True extended, False not ours, None no
        answer. The new validity counts from the request's start, however late the answer came."""
        self.renewal = None
        self.bound = math.inf
        if self.state is not _HELD:
            return Renewal.GIVE_BACK if extended and self.state is _LOST else Renewal.IGNORE
        every = self._every(self.renew_every or ttl)
        if extended:
            self._count(ttl, sent_at)
            self.due = min(sent_at + every, self.valid_until)
            return Renewal.EXTENDED
        if extended is False:
            return Renewal.GONE
        self._unanswered(ttl, sent_at)
        self.due = renewal_retry(now, self.valid_until, every)
        return Renewal.RETRY

    # -- the holder ------------------------------------------------------------------------------------------

    def lose(self, reason: str) -> bool:
        """Mark it lost; True the first time only (a lost or released lease stays so)."""
        if self.state is not _HELD:
            return False
        self.state = _LOST
        self.lost_reason = reason
        return True

    def release_asked(self) -> None:
        """The holder is releasing it: no renewal goes out from now on, and it claims no validity, whatever the
        release's outcome (a release that was never sent leaves the key, which its TTL frees: release again)."""
        self.renew_every = None
        self.releasing = True

    def extended(self, ttl: float, sent_at: float, now: float) -> bool:
        """The holder's extend to `ttl`, sent at `sent_at`, was confirmed at `now`; a renewed lease is next due one
        interval after it. False: the confirmation came after that TTL had run out, so it grants nothing (the
        lease is lost)."""
        # The interval is kept while it fits below half the new TTL (as `renew=` must), else a third of it.
        if self.renew_every is not None and self.renew_every >= ttl / 2:
            self.renew_every = ttl * RENEW_FRACTION
        self.ttl = ttl
        self._count(ttl, sent_at)
        self.bound = math.inf
        if self.renew_every is not None:
            # (the watchdog must be told: `AsyncWatchdog.reschedule`)
            self.due = min(sent_at + self._every(self.renew_every), self.valid_until)
        return now < self.valid_until

    def extend_unknown(self, ttl: float, sent_at: float, now: float | None = None) -> None:
        """The holder's extend got no answer (by `now`): the server may have applied it, now or later. A shorter
        TTL then bounds the validity (and every later count); a longer one is not counted until confirmed. A
        renewed lease is due again soon (the watchdog skipped it while the extend was in flight); any other, when
        its validity ends."""
        self._unanswered(ttl, sent_at)
        self.bound = math.inf  # (counted in the validity now)
        if now is None:
            return
        if self.renew_every is not None:
            self.due = renewal_retry(now, self.valid_until, self._every(self.renew_every))
        else:
            self.due = min(self.due, self.valid_until)

    def release_unknown(self, sent_at: float) -> None:
        """A release sent at `sent_at` got no answer: the server may or may not have deleted the key, so a later
        answer of "gone" or "taken" may be this one's doing (`after_release`). A release known never to have left
        the client is not this: it changes nothing."""
        if self.uncertain_at is None:
            self.uncertain_at = sent_at

    def release_answered(self, answer: Released, sent_at: float) -> bool:
        """The server answered a release sent at `sent_at`: True released; False the lease was lost (expired or
        taken) first. UNSURE (a sending of it may have deleted the key) is judged as after an unanswered one."""
        if answer is Released.UNSURE:
            self.release_unknown(sent_at)
        if after_release(answer, self.uncertain_at, min(self.valid_until, self.bound)) is _RELEASED:
            self.state = _RELEASED
            return True
        return False
