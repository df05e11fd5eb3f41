"""The verdict table `fencelock lab` prints, fitted to the terminal's width."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping
from typing import Any

__all__ = ["cut", "table"]

MIN_TITLE = 24          # the scenario column is never narrower than this; below it, one block per scenario
MARKS = {"SAFE": "SAFE", "UNSAFE": "UNSAFE", "SKIPPED": "-", "ERROR": "ERROR", "FAULT-MISSED": "MISSED"}
KEY = ("SAFE: no stale write accepted and no update lost, with the fault shown to have taken effect. UNSAFE n: n "
       "stale writes accepted. MISSED: the fault did not take effect. -: not applicable or not available here. "
       "!: differs from the prediction. +: better than the literature predicts (why below).")


def cut(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its longest run of whole words that fits, then an ellipsis."""
    if len(text) <= limit:
        return text
    if limit < 2:
        return "…"[:limit]
    head = text[: limit - 1]
    if text[limit - 1] != " " and " " in head:
        head = head[: head.rfind(" ")]
    return head.rstrip(" ,;:-") + "…"


def _mark(cell: Mapping[str, Any] | None) -> str:
    if cell is None:
        return ""
    v = cell["verdict"]
    mark = MARKS[v]
    if v == "UNSAFE" and cell["counts"]["stale_accepted"]:
        mark += f" {cell['counts']['stale_accepted']}"
    if v != "SKIPPED" and not cell["matches_expectation"]:
        mark += " !"
    elif v == "SAFE" and cell.get("beyond"):
        mark += " +"
    return mark


def table(results: Mapping[str, Any], width: int | None = None) -> str:
    """The scenario x configuration verdicts, the key, and what differs; no line longer than `width` (default:
    the terminal's) unless a single word is."""
    width = max(shutil.get_terminal_size().columns if width is None else width, 20)
    configs = list(results["configs"])
    cells = {(c["scenario"], c["config"]): c for c in results["cells"]}
    marks = {(s["id"], c["id"]): _mark(cells.get((s["id"], c["id"]))) for s in results["scenarios"]
             for c in configs}
    columns = [max(len(c["id"]), *(len(marks[(s["id"], c["id"])]) for s in results["scenarios"])) + 2
               for c in configs]
    labels = [f"{s['id']}  {s['title']}" for s in results["scenarios"]]
    title = min(width - sum(columns), max([len("scenario"), *map(len, labels)]))
    lines: list[str] = []
    if title >= MIN_TITLE:
        head = f"{'scenario':<{title}}" + "".join(f"{c['id']:>{w}}" for c, w in zip(configs, columns, strict=True))
        lines += [head, "-" * len(head)]
        for s, label in zip(results["scenarios"], labels, strict=True):
            lines.append(f"{cut(label, title):<{title}}" + "".join(
                f"{marks[(s['id'], c['id'])]:>{w}}" for c, w in zip(configs, columns, strict=True)))
    else:                                                          # too narrow for a grid: a block per scenario
        for s, label in zip(results["scenarios"], labels, strict=True):
            lines.append(cut(label, width))
            entries = [f"{c['id']}: {marks[(s['id'], c['id'])]}" for c in configs if marks[(s["id"], c["id"])]]
            row = "   "
            for entry in entries:
                if len(row) > 3 and len(row) + 2 + len(entry) > width:
                    lines.append(row.rstrip())
                    row = "   "
                row += ("" if len(row) == 3 else "  ") + entry
            lines.append(row.rstrip())
    lines.append("")
    lines += textwrap.wrap(KEY, width)
    for c in configs:
        if not c["available"]:
            lines += textwrap.wrap(f"{c['id']}: {c['why_unavailable']}", width, subsequent_indent="  ")
    better = [c for c in results["cells"] if c["verdict"] == "SAFE" and c.get("beyond") and c["matches_expectation"]]
    if better:
        lines.append("")
        lines += textwrap.wrap("+ where fencelock does better than the literature predicts:", width)
        for c in better:
            lines += textwrap.wrap(f"{c['scenario']} x {c['config']}: predicted {c['expected']}, SAFE: {c['beyond']}",
                                   width, initial_indent="  ", subsequent_indent="    ")
    edge = [c for c in results["cells"] if c["verdict"] == c["expected"] and c.get("boundary")
            and c["matches_expectation"]]
    if edge:
        lines.append("")
        lines += textwrap.wrap("Where the literature's prediction holds because a stated assumption does not:", width)
        for c in edge:
            lines += textwrap.wrap(f"{c['scenario']} x {c['config']}: {c['verdict']}: {c['boundary']}", width,
                                   initial_indent="  ", subsequent_indent="    ")
    differ = [c for c in results["cells"] if c["verdict"] != "SKIPPED" and not c["matches_expectation"]]
    if differ:
        lines.append("")
        lines += textwrap.wrap("Where reality differs from the prediction:", width)
        for c in differ:
            wanted = f"SAFE (the literature: {c['expected']}; {c['beyond']})" if c.get("beyond") else c["expected"]
            lines += textwrap.wrap(f"{c['scenario']} x {c['config']}: expected {wanted}, got {c['verdict']}: "
                                   f"{c['note']}", width, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)
