"""The fault lab: scenarios x lock configurations on real servers, and its HTML report (`report.write_report`).

This file only keeps `fencelock lab` working on a build that has the report but not yet the lab's runner
(`run.py`, from the lab's own branch, whose `__init__.py` replaces this one).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run the lab with command-line arguments `argv` (without the program name); returns the exit status."""
    try:
        run: Any = importlib.import_module(f"{__name__}.run")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.run":
            raise
        if "-h" in argv or "--help" in argv:
            print("usage: fencelock lab [ARGS]...\n\n  The fault lab's runner is not built into this version yet.")
            return 0
        print("fencelock lab: the fault lab's runner is not built into this version yet", file=sys.stderr)
        return 2
    return int(run.main(argv))
