"""The few things asyncio and threads really do differently. Hand-written twin: `_async/_compat.py`."""

from __future__ import annotations

import time
from typing import TypeVar

T = TypeVar("T")


def shielded(value: T) -> T:
    """A synchronous call has already run to completion when its value is passed here: nothing to shield."""
    return value


def sleep(seconds: float) -> None:
    time.sleep(seconds)
