"""`fencelock nodes`: each Redlock node's bookkeeping and the deployment's verdict (registered by commands.py)."""

from __future__ import annotations

import json
import sys

from .._redis.redlock import NodesReport
from . import exits
from .commands import cli
from .options import _connect, json_option, repair_delay_option, url_option
from .show import out, paint, seconds


def nodes_table(report: NodesReport) -> str:
    """One line per node (NODE, STATE, READY, REPAIRABLE IN, COUNTS), then the verdict."""
    header = ["NODE", "STATE", "READY", "REPAIRABLE IN", "COUNTS"]
    rows = [[n.node, n.state, "yes" if n.ready else "no",
             "now" if n.repairable else seconds(n.quarantine_left), n.eta or "-"] for n in report.nodes]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    verdict = paint(report.verdict.text, sys.stdout, fg="green" if report.verdict.available else "yellow")
    lines = [paint(line(header), sys.stdout, bold=True)] + [line(row) for row in rows]
    return "\n".join([*lines, verdict])


@cli.command()
@url_option
@json_option
@repair_delay_option
def nodes(urls: tuple[str, ...], as_json: bool, repair_delay: float | None) -> int:
    """Redlock: show each node (reachable, ready, quarantined until when, repairable) and whether a lock can
    be granted. Reads only: looking does not start a new node's quarantine.

    \b
    Exit status: 0 a lock can be granted now; 69 not (the verdict says why, and until when).

    \b
    Examples:
      fencelock nodes --url redis://a:6379 --url redis://b:6379 --url redis://c:6379
      fencelock nodes --json | jq '.nodes[] | select(.ready | not)'
    """
    with _connect(urls, repair_delay) as locks:
        report = locks.nodes()
    out(json.dumps(report.as_dict()) if as_json else nodes_table(report))
    return 0 if report.verdict.available else exits.BACKEND
