"""The `fencelock` command: a distributed flock for cron jobs and scripts, and a window into held locks.

The command line is an optional extra, `pip install 'fencelock[cli]'`, which adds click (pure Python, about
100 kB, no dependencies of its own on POSIX). The library stays free of it: most users import fencelock into a
service and never run the command. The `fencelock` console script is declared by the base install all the
same, so that running it without the extra says exactly what to install instead of "command not found".

    fencelock run NAME [--ttl S] [--wait S] -- COMMAND [ARGS...]
    fencelock status NAME [--json]
    fencelock list [PATTERN] [--json]
    fencelock release NAME --force [--yes]
    fencelock lab ... / fencelock bench ...

`python -m fencelock ...` is the same tool.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

MISSING_CLICK = ("fencelock: error: the command line needs the 'cli' extra (click), which is not installed "
                 "(hint: pip install 'fencelock[cli]')")


def main(argv: list[str] | None = None) -> int:
    """Run the command with `argv` (default: `sys.argv[1:]`); returns the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        import click  # noqa: F401
    except ImportError:
        print(MISSING_CLICK, file=sys.stderr)
        return 2  # configuration, as a backend's missing extra (exits.USAGE; not imported here: it needs nothing)
    from .commands import run_cli

    return run_cli(args)


def finish(status: int) -> NoReturn:
    """Exit with `status`. When `fencelock run`'s command died of SIGINT, fencelock dies of SIGINT too (its lock
    is released by then), so that a calling shell stops as it does for any command Ctrl-C ended; shells still show
    130."""
    commands = sys.modules.get("fencelock._cli.commands")
    signum = commands.die_by() if commands is not None else None
    if signum is not None:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:
                pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    sys.exit(status)


def console() -> None:
    """The `fencelock` console script."""
    finish(main())
