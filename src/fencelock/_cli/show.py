"""How the command shows locks and errors: plain columns for people (colour only on a terminal), JSON for scripts."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import click

from .._logic.status import LockStatus


def colour_on(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def paint(text: str, stream: TextIO, **style: Any) -> str:
    return click.style(text, **style) if colour_on(stream) else text


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def describe(status: LockStatus) -> str:
    """One line about one lock, for people."""
    if status.held:
        parts = [f"fence {status.fence}" if status.fence is not None else "no fence",
                 f"expires in {seconds(status.remaining)}" if status.remaining is not None else "no expiry"]
    else:
        parts = ["never locked" if status.fence is None else f"last fence {status.fence}"]
    if status.queued:
        parts.append(f"{status.queued} queued")
    return ", ".join(parts)


def status_line(status: LockStatus) -> str:
    out = sys.stdout
    state = paint("held", out, fg="yellow", bold=True) if status.held else paint("free", out, fg="green")
    return f"{status.name}: {state} ({describe(status)})"


def table(statuses: Sequence[LockStatus]) -> str:
    """Held locks as aligned columns: NAME, FENCE, EXPIRES IN, QUEUED (queue shown only where there is one)."""
    with_queue = any(s.queued is not None for s in statuses)
    header = ["NAME", "FENCE", "EXPIRES IN"] + (["QUEUED"] if with_queue else [])
    rows = [[s.name, "-" if s.fence is None else str(s.fence), seconds(s.remaining)]
            + ([str(s.queued or 0)] if with_queue else []) for s in statuses]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    lines = [paint(line(header), sys.stdout, bold=True)] + [line(row) for row in rows]
    return "\n".join(lines)


def as_json(value: LockStatus | Sequence[LockStatus]) -> str:
    if isinstance(value, LockStatus):
        return json.dumps(value.as_dict())
    return json.dumps([status.as_dict() for status in value])


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def error(reason: str, hint: str | None = None) -> None:
    """The one line an error gets on stderr: the reason, then a hint."""
    err = sys.stderr
    line = f"{paint('fencelock: error:', err, fg='red', bold=True)} {one_line(reason)}"
    if hint:
        line += f" (hint: {hint})"
    click.echo(line, err=True)


def note(text: str) -> None:
    click.echo(f"{paint('fencelock:', sys.stderr, bold=True)} {one_line(text)}", err=True)
