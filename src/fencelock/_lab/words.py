"""The report's words: a timeline in sentences (its text alternative), counts, labels and plurals."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .timeline import Timeline


def secs(t: float) -> str:
    return f"{t:.2f} s"


def fence_text(fence: int | None) -> str:
    return "no fence" if fence is None else f"fence {fence}"


def describe(tl: Timeline) -> list[str]:
    """The picture in sentences: its text alternative."""
    lines: list[str] = []
    for lease in tl.leases:
        line = (f"{lease.worker} held the lock ({fence_text(lease.fence)}) from {secs(lease.start)} "
                f"to {secs(lease.held_until)}")
        if lease.extensions:
            line += f", extended {lease.extensions} time{'s' * (lease.extensions > 1)}"
        line += {"released": ", then released it", "release refused": ", then its release was refused",
                 "lost": ", then learnt it was lost", "open": ""}[lease.ending]
        if lease.past_end and lease.valid_until is not None:
            line += f"; its lease had ended at {secs(lease.valid_until)}"
        lines.append(line + ".")
    for lo, hi in tl.overlaps:
        lines.append(f"Two workers held leases at once from {secs(lo)} to {secs(hi)}.")
    for mark in tl.faults:
        lines.append(f"Fault {mark.label} at {secs(mark.t)} ({mark.worker}): {mark.detail}.")
    words = {"accepted": "accepted", "stale": "STALE but accepted", "rejected": "rejected",
             "unanswered": "got no answer"}
    for w in tl.writes:
        lines.append(f"Write by {w.worker} ({fence_text(w.fence)}) at {secs(w.t)}: {words[w.outcome]}.")
    return lines


def short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def scenario_label(scenario: Mapping[str, Any]) -> str:
    """A scenario's number, with its variant letter when its id has one ("5a")."""
    number, sid = str(scenario["number"]), str(scenario["id"])
    return sid if re.fullmatch(re.escape(number) + r"[a-z]{1,2}", sid) else number


def sentence(text: str) -> str:
    """`text` ending in a full stop, unless it already ends in punctuation."""
    text = text.rstrip()
    return text if not text or text[-1] in ".?!" else text + "."


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def counts_line(counts: Mapping[str, int]) -> str:
    return f"{stale_line(counts)} · {other_counts(counts)}"


def stale_line(counts: Mapping[str, int]) -> str:
    return plural(counts["stale_accepted"], "stale write") + " accepted"


def other_counts(counts: Mapping[str, int]) -> str:
    return " · ".join((f"{counts['stale_rejected']} rejected", plural(counts["overlaps"], "overlap"),
                       plural(counts["lost_updates"], "lost update")))



def expectation(cell: Mapping[str, Any]) -> tuple[str, str]:
    """How a cell's verdict compares with its prediction: (kind, words). Kinds: "match"; "better" (fencelock did
    better than the literature predicts, and why); "boundary" (the prediction held because one of fencelock's
    stated assumptions did not, and which); "differs"; "none" (no verdict)."""
    verdict, expected = cell["verdict"], cell["expected"]
    beyond, boundary = cell.get("beyond"), cell.get("boundary")
    if verdict not in ("SAFE", "UNSAFE"):
        return "none", f"predicted: {expected}"
    if cell["matches_expectation"]:
        if beyond and verdict != expected:
            return "better", f"better than predicted ({expected}): {sentence(beyond)}"
        if boundary:
            return "boundary", f"= as predicted ({expected}), at the edge of an assumption: {sentence(boundary)}"
        return "match", f"= as predicted ({expected})"
    if beyond:
        return "differs", f"≠ predicted SAFE, where fencelock should do better than the {expected} the literature " \
                          f"predicted: {sentence(beyond)}"
    return "differs", f"≠ predicted {expected}"


def alt_text(scenario: Mapping[str, Any], config: Mapping[str, Any], cell: Mapping[str, Any], tl: Timeline) -> str:
    o = tl.outcomes()
    parts = [f"Timeline of scenario {scenario_label(scenario)}, {scenario['title']}, on {config['title']}: "
             f"{cell['verdict']}.",
             f"{plural(len(tl.lanes), 'worker')}, {plural(len(tl.leases), 'lease')}, "
             f"{plural(len(tl.faults), 'fault')}.",
             f"Writes: {o['accepted']} accepted, {o['stale']} stale accepted, {o['rejected']} rejected"
             + (f", {o['unanswered']} without an answer" if o["unanswered"] else "") + "."]
    if tl.overlaps:
        parts.append(f"Two workers held leases at once for {sum(hi - lo for lo, hi in tl.overlaps):.2f} s.")
    return " ".join(parts)

