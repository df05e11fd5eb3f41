"""How the command shows locks and errors: plain columns for people (colour only on a terminal), JSON for scripts.

Nothing here raises for a stream that is closed, None, full or whose reader went away: a note or an error that
cannot be written is dropped (what fencelock does next, such as stopping a command, must not depend on it), and
the output that was asked for (`out`) raises `OutputFailed`, which the command turns into its exit status.
"""

from __future__ import annotations

import json
import os
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any, TextIO

import click

from .._logic.status import LockStatus
from .exits import BROKEN_PIPE, OUTPUT

_quiet = {"on": False}


def be_quiet(quiet: bool = True) -> None:
    """With `quiet`, `note` says nothing (`-q`): errors are still written."""
    _quiet["on"] = quiet


class OutputFailed(Exception):
    """stdout could not be written: `status` is what to exit with (its reader went away: 141, else 74)."""

    def __init__(self, reason: str, status: int) -> None:
        super().__init__(reason)
        self.status = status


def colour_on(stream: TextIO | None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    try:
        return stream is not None and stream.isatty() and not os.environ.get("NO_COLOR")
    except (OSError, ValueError, AttributeError):  # closed, or no real stream
        return False


def printable(text: str) -> str:
    """`text` with control and other unprintable characters escaped (\\n, \\t, \\x1b): a name shown on a
    terminal cannot move the cursor, change colours or forge a line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or unicodedata.category(ch) == "Zs" else
                   ch.encode("unicode_escape").decode("ascii") for ch in text)


def paint(text: str, stream: TextIO | None, **style: Any) -> str:
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
    return f"{printable(status.name)}: {state} ({describe(status)})"


def table(statuses: Sequence[LockStatus]) -> str:
    """Held locks as aligned columns: NAME, FENCE, EXPIRES IN, QUEUED (queue shown only where there is one)."""
    with_queue = any(s.queued is not None for s in statuses)
    header = ["NAME", "FENCE", "EXPIRES IN"] + (["QUEUED"] if with_queue else [])
    rows = [[printable(s.name), "-" if s.fence is None else str(s.fence), seconds(s.remaining)]
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


def say(line: str) -> None:
    """Write one line to stderr, or drop it if stderr cannot take it (closed, None, full, broken)."""
    try:
        click.echo(line, err=True)
    except Exception:
        pass


def error(reason: str, hint: str | None = None) -> None:
    """The one line an error gets on stderr: the reason, then a hint."""
    line = f"{paint('fencelock: error:', sys.stderr, fg='red', bold=True)} {one_line(reason)}"
    if hint:
        line += f" (hint: {hint})"
    say(line)


def note(text: str) -> None:
    """One line about what fencelock does (nothing with -q)."""
    if not _quiet["on"]:
        say(f"{paint('fencelock:', sys.stderr, bold=True)} {one_line(text)}")


def out(text: str) -> None:
    """Write the output that was asked for to stdout; raises `OutputFailed` if it cannot be written."""
    stream = sys.stdout
    if stream is None:
        raise OutputFailed("stdout is closed", OUTPUT)
    try:
        click.echo(text, file=stream)
    except BrokenPipeError:
        _drop_stdout()
        raise OutputFailed("the reader of stdout went away", BROKEN_PIPE) from None
    except (OSError, ValueError) as exc:
        _drop_stdout()
        reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)
        raise OutputFailed(f"stdout could not be written: {reason}", OUTPUT) from None


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
