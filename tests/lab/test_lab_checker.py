"""The lab's checker on hand-made histories, with no server: a write accepted from an older holder once the
resource served a newer one is stale (unguarded, it loses an update) and a guard rejects it; several runs combine
into one verdict; events keep their fields through JSON."""

from __future__ import annotations

from fencelock._lab.history import Event, combine, judge
from fencelock._lab.resource import Resource


def _acq(t: float, who: str, fence: int, lease_end: float | None) -> Event:
    return Event(t, who, "acquire", fence=fence, ok=True, lease_end=lease_end)


def _write(t: float, who: str, fence: int | None, ok: bool, read: int, before: int) -> Event:
    return Event(t, who, "write", fence=fence, ok=ok, read=read, before=before, sent=t - 0.001)


def _rel(t: float, who: str, fence: int, ok: bool = True) -> Event:
    return Event(t, who, "release", fence=fence, ok=ok)


def test_a_paused_holders_write_accepted_after_the_next_holders_is_stale_and_loses_an_update() -> None:
    history = [_acq(0.0, "A", 1, 0.3), Event(0.01, "lab", "fault", ok=True, detail="SIGSTOP A"),
               _acq(0.4, "B", 2, 2.0), _write(0.41, "B", 2, True, 0, 0),
               _write(0.7, "A", 1, True, 0, 1), _rel(0.71, "A", 1, ok=False), _rel(0.8, "B", 2)]
    j = judge(history)
    assert j.verdict == "UNSAFE"
    assert (j.counts.stale_accepted, j.counts.lost_updates, j.counts.overlaps) == (1, 1, 1)
    assert (j.counts.writes, j.counts.faults, j.counts.fence_regressions) == (2, 1, 1)
    assert any("newer holder" in r for r in j.reasons)


def test_the_same_history_through_a_guard_is_safe_and_counts_the_rejection() -> None:
    history = [_acq(0.0, "A", 1, 0.3), _acq(0.4, "B", 2, 2.0), _write(0.41, "B", 2, True, 0, 0),
               _write(0.7, "A", 1, False, 0, 1), _rel(0.71, "A", 1, ok=False), _rel(0.8, "B", 2)]
    j = judge(history)
    assert j.verdict == "SAFE"
    assert (j.counts.stale_accepted, j.counts.stale_rejected, j.counts.lost_updates) == (0, 1, 0)


def test_holders_one_after_the_other_show_no_fault() -> None:
    history = [_acq(0.0, "A", 1, 0.3), _write(0.1, "A", 1, True, 0, 0), _rel(0.2, "A", 1),
               _acq(0.3, "B", 2, 2.0), _write(0.31, "B", 2, True, 1, 1), _rel(0.4, "B", 2)]
    j = judge(history)
    assert j.verdict == "FAULT-MISSED"
    assert j.counts.overlaps == 0
    # A fault that only counts when it is seen to take effect: injected but not observed is still missed.
    assert judge([*history, Event(0.05, "lab", "fault", ok=False)], evidence="fault").verdict == "FAULT-MISSED"
    assert judge([*history, Event(0.05, "lab", "fault", ok=True)], evidence="fault").verdict == "SAFE"


def _read(t: float, who: str, fence: int | None, ok: bool, value: int) -> Event:
    return Event(t, who, "read", fence=fence, ok=ok, before=value)


def test_a_write_after_the_lease_ended_is_stale_once_the_resource_served_the_newer_holder() -> None:
    # A's lease ended at 0.3; B was granted at 0.4 and read at 0.45; A's write lands at 0.5, B writes at 0.6.
    history = [_acq(0.0, "A", 1, 0.3), _acq(0.4, "B", 2, 2.0), _read(0.45, "B", 2, True, 0),
               _write(0.5, "A", 1, True, 0, 0), _write(0.6, "B", 2, True, 0, 1)]
    j = judge(history)
    assert j.verdict == "UNSAFE"
    assert j.counts.stale_accepted == 1
    assert j.counts.lost_updates == 1  # and B, which read before A's write, overwrote it
    assert any("served a newer holder, B (fence 2)" in r for r in j.reasons)


def test_a_late_write_before_the_next_holders_first_access_is_ordered_before_it_not_stale() -> None:
    # The same late write of A, but it lands before B's first access: the resource orders it before B's whole
    # critical section (a guard has seen no higher fence yet, as in Kleppmann's fencing), and B reads its effect.
    history = [_acq(0.0, "A", 1, 0.3), _acq(0.4, "B", 2, 2.0), _write(0.45, "A", 1, True, 0, 0),
               _read(0.5, "B", 2, True, 1), _write(0.6, "B", 2, True, 1, 1), _write(0.7, "A", 1, False, 0, 2)]
    j = judge(history)
    assert j.verdict == "SAFE"
    assert (j.counts.stale_accepted, j.counts.stale_rejected, j.counts.lost_updates) == (0, 1, 0)


def test_a_read_is_an_access_that_shuts_out_the_older_holder() -> None:
    # B only read: A's later write is stale (unguarded, it was accepted), and a guard would have refused it.
    history = [_acq(0.0, "A", 1, 0.3), _acq(0.4, "B", 2, 2.0), _read(0.45, "B", 2, True, 0),
               _write(0.5, "A", 1, True, 0, 0)]
    assert judge(history).counts.stale_accepted == 1
    # A refused read does not count as the newer holder being served.
    refused = [_acq(0.0, "A", 1, 0.3), _acq(0.4, "B", 2, 2.0), _read(0.45, "B", 2, False, 0),
               _write(0.5, "A", 1, True, 0, 0)]
    assert judge(refused).counts.stale_accepted == 0


def test_a_lease_that_ended_with_nobody_after_it_is_not_stale() -> None:
    history = [_acq(0.0, "A", 1, 0.3), _write(0.5, "A", 1, True, 0, 0), _rel(0.6, "A", 1, ok=False)]
    assert judge(history).counts.stale_accepted == 0


def test_equal_fences_after_a_failover_are_caught_by_the_grant_order() -> None:
    history = [_acq(0.0, "A", 2, 5.0), _acq(0.1, "B", 2, 5.0), _write(0.2, "B", 2, True, 0, 0),
               _write(0.3, "A", 2, True, 0, 1)]
    j = judge(history)
    assert j.verdict == "UNSAFE"
    assert j.counts.stale_accepted == 1
    assert j.counts.fence_regressions == 0  # the fences alone would not show it


def test_a_write_from_a_worker_that_never_held_the_lock_is_stale() -> None:
    assert judge([_write(0.1, "X", None, True, 0, 0)]).counts.stale_accepted == 1


def test_a_renewing_holder_that_writes_after_it_was_told_its_lease_was_lost_overlaps_and_is_stale() -> None:
    history = [_acq(0.0, "A", 1, None), Event(0.5, "A", "lost", fence=1), _acq(0.6, "B", 2, 3.0),
               _write(0.65, "B", 2, True, 0, 0), _write(0.7, "A", 1, True, 0, 1)]
    j = judge(history)
    assert j.counts.stale_accepted == 1
    assert j.counts.overlaps == 1  # A kept acting as the holder after it was told


def test_a_guarded_resource_checks_the_fence_on_reads_too_and_logs_every_access() -> None:
    resource = Resource(guarded=True)  # its request handler alone: no socket needed
    assert resource.handle({"op": "read", "name": "n", "worker": "B", "fence": 5}) == {"ok": True, "value": 0}
    assert resource.handle({"op": "read", "name": "n", "worker": "A", "fence": 4})["ok"] is False
    assert resource.handle({"op": "write", "name": "n", "worker": "A", "fence": 4, "read": 0})["ok"] is False
    assert resource.handle({"op": "write", "name": "n", "worker": "B", "fence": 5, "read": 0})["ok"] is True
    assert resource.handle({"op": "read", "name": "n"}) == {"ok": True, "value": 1}  # the lab looking: no fence
    assert [(e.kind, e.worker, e.ok) for e in resource.events()] == [
        ("read", "B", True), ("read", "A", False), ("write", "A", False), ("write", "B", True), ("read", "?", True)]
    assert resource.value("n") == 1


def test_several_runs_combine_into_one_verdict() -> None:
    assert combine(["SAFE", "UNSAFE", "SAFE"]) == "UNSAFE"
    assert combine(["SAFE", "FAULT-MISSED"]) == "SAFE"
    assert combine(["FAULT-MISSED"]) == "FAULT-MISSED"
    assert combine(["SAFE", "ERROR"]) == "ERROR"
    assert combine([]) == "SKIPPED"


def test_events_keep_their_fields_through_json() -> None:
    e = Event(10.5, "A", "write", fence=3, ok=False, read=1, before=2, sent=10.25, detail="x")
    raw = e.to_json(origin=10.0)
    assert raw["t"] == 0.5
    assert raw["sent"] == 0.25
    assert Event.from_json(raw, origin=10.0) == e
    assert "read" not in _acq(1.0, "A", 1, 2.0).to_json(0.0)
