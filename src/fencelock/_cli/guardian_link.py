"""fencelock run's end of its guardian process (`guardian.py`): start it, tell it the lease's news, hear what it did."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

from .exits import KILL_WAIT, POLL, OnLost
from .show import note

GUARDIAN = Path(__file__).with_name("guardian.py")
TITLE = "fencelock run-guardian"  # the guardian's argv[0]: what `ps` shows of it


class _Guardian:
    """fencelock's end of the guardian (see `guardian.py`): starts it, writes it lines, reads what it did to the
    group, reaps it. Never raises: without a guardian, `run` still works, only without the backstop."""

    def __init__(self, on_lost: OnLost, grace: float, run_id: str, titled: bool = True) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None
        self._back: int | None = None
        self._pending = b""
        self.failure = ""  # why there is no guardian although one is needed (then the command must not start)
        self.exited = False  # it ended without answering
        if on_lost is OnLost.IGNORE or not sys.executable:
            return  # nothing to stop, whatever happens to fencelock
        read, write = os.pipe()  # every end non-inheritable: the command never holds one
        back_read, back_write = os.pipe()
        try:
            # `ps` shows `fencelock run-guardian ...`: argv[0] is a title, the interpreter is `executable`
            argv = [TITLE if titled else sys.executable, "-E", "-s", str(GUARDIAN), on_lost.value, repr(grace),
                    run_id]
            self.proc = subprocess.Popen(argv, executable=sys.executable, stdin=read, stdout=back_write,
                                         start_new_session=True)
        except OSError as exc:
            self.failure = f"it could not be started ({exc})"
            os.close(write)
            os.close(back_read)
            return
        finally:
            os.close(read)
            os.close(back_write)
        os.set_blocking(write, False)  # a guardian that stopped reading never holds fencelock up
        os.set_blocking(back_read, False)
        self._pipe, self._back = write, back_read

    def tell(self, line: str) -> None:
        if self._pipe is None:
            return
        try:
            os.write(self._pipe, f"{line}\n".encode())
        except BlockingIOError:
            pass  # its pipe is full: it is not reading; the next line may get through
        except OSError:
            os.close(self._pipe)
            self._pipe = None
            pid = self.proc.pid if self.proc is not None else "?"
            note(f"the guardian (pid {pid}) is gone; if fencelock dies now, the command runs on")

    def wait_ready(self, timeout: float) -> list[str]:
        """Wait up to `timeout` seconds for the guardian's `ready` (its answer to the first `valid` line); sets
        `failure` if none came. Returns the other lines read meanwhile."""
        if self.proc is None or self._back is None:
            return []
        deadline = time.monotonic() + timeout
        said: list[str] = []
        while True:
            lines = self.answers()
            if "ready" in lines:
                return said + [line for line in lines if line != "ready"]
            said += lines
            left = deadline - time.monotonic()
            if self._back is None or self.proc.poll() is not None or left <= 0:
                code = self.proc.poll()
                self.exited = code is not None
                self.failure = (f"it exited with status {code} without answering" if code is not None else
                                f"it did not answer within {timeout:g} s")
                return said
            select.select([self._back], [], [], min(left, POLL))

    def answers(self) -> list[str]:
        """The lines the guardian wrote since the last look: `stop K` (it sent SIGTERM; SIGKILL due at K), `kill`."""
        if self._back is None:
            return []
        while True:
            try:
                data = os.read(self._back, 65536)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                os.close(self._back)
                self._back = None
                break
            self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        return [line.decode(errors="replace").strip() for line in lines]

    def close(self, done: bool) -> list[str]:
        """Tell it `done` (nothing of the group runs) if so, close the pipe (end of file), and reap it. Returns
        what it said it did that was not read yet."""
        if done:
            self.tell("done")
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=1.0 if done else KILL_WAIT + 1.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        said = self.answers()  # all of it: the guardian has exited
        if self._back is not None:
            os.close(self._back)
            self._back = None
        return said
