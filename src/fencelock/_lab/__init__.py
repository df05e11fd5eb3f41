"""The fault lab: `fencelock lab` runs the classic lock failures on real servers and checks what happened.

    main(["--quick"])        # the README's first command; returns the exit status

Modules: `configs` (the lock configurations, a registry), `scenarios` (the faults, each a short script),
`worker` / `procs` (the worker processes and the lab's handle on them), `resource` (the guarded or unguarded
counter the workers write to), `history` (events and the checker, pure), `run` (table, JSON), and `report`
(the HTML report with one timeline per cell, from results.json).
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run the lab with command-line arguments `argv` (without the program name); returns the exit status."""
    from .run import main as run_main

    return run_main(argv)
