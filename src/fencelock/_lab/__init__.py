"""The fault lab: `fencelock lab` runs the classic lock failures on real servers and checks what happened.

`main(["--quick"])` runs it and returns the exit status; the modules are described in docs/design/lab-report.md.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run the lab with command-line arguments `argv` (without the program name); returns the exit status."""
    from .run import main as run_main

    return run_main(argv)
