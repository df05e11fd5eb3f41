"""The one shape of everything the test harness starts: servers, groups of servers, proxies.

`with Thing() as thing:` starts it (unless it was started already) and closes it at the end; a start that fails
half-way closes what it had started. Whatever is still open when the interpreter exits is closed by one `atexit`
hook, so a test run that stops early leaves no server process or temporary directory behind (this cannot help if
the interpreter itself is SIGKILLed).
"""

from __future__ import annotations

import atexit
from types import TracebackType
from typing import TypeVar

H = TypeVar("H", bound="Harness")

_LIVE: set[Harness] = set()
"""Started (or holding a temporary directory) and not yet closed."""


class Harness:
    """Base of the harness classes: they define `start()` and an idempotent `close()`, and call `_live()` once
    they hold something that must be given back, `_gone()` once they have given it back."""

    def start(self) -> object:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def started(self) -> bool:
        """Whether `with` may skip `start()`; a class whose `start()` must run once says so here."""
        return False

    def __enter__(self: H) -> H:
        if not self.started:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _live(self) -> None:
        _LIVE.add(self)

    def _gone(self) -> None:
        _LIVE.discard(self)


@atexit.register
def _close_live() -> None:
    for thing in list(_LIVE):
        try:
            thing.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass
