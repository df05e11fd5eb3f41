"""`python -m fencelock._lab [--quick] ...`: the lab without the `fencelock` command (what `./dev lab` runs)."""

from __future__ import annotations

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
