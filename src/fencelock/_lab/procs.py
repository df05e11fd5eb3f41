"""The lab's side of its worker processes: start them, send commands, collect their events, pause them.

Workers are reused from cell to cell (a `reset` between cells); one that misbehaved is killed, never reused.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from .history import Event

#: Seconds a command may take before the lab gives up on the worker.
COMMAND_TIMEOUT = 30.0


class WorkerError(RuntimeError):
    pass


class WorkerProc:
    """One worker process and the thread that reads what it says."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen([sys.executable, "-m", "fencelock._lab.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                                     start_new_session=True)
        self.role = "?"
        self.events: list[Event] = []
        self._events_lock = threading.Lock()
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._pending = 0
        self.paused = False
        self.broken = False
        self._reader = threading.Thread(target=self._read, daemon=True, name="fencelock-lab-worker-reader")
        self._reader.start()
        self._stderr: list[str] = []
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True,
                                               name="fencelock-lab-worker-stderr")
        self._stderr_reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "event" in message:
                with self._events_lock:
                    self.events.append(Event.from_json(message["event"]))
            elif "reply" in message:
                self._replies.put(message["reply"])
        self._replies.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr = [*self._stderr[-20:], line.rstrip()]

    def take_events(self) -> list[Event]:
        with self._events_lock:
            out, self.events = self.events, []
        return out

    def peek_events(self) -> list[Event]:
        with self._events_lock:
            return list(self.events)

    def send(self, op: str, **args: Any) -> None:
        """Send a command without waiting for it to finish (`wait_reply` collects the answer)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            self.broken = True
            raise WorkerError(f"worker {self.role} is gone: {exc}; {self.stderr_tail()}") from exc
        self._pending += 1

    def wait_reply(self, timeout: float = COMMAND_TIMEOUT) -> dict[str, Any]:
        try:
            reply = self._replies.get(timeout=timeout)
        except queue.Empty:
            self.broken = True
            raise WorkerError(f"worker {self.role} did not answer within {timeout:g} s") from None
        self._pending -= 1
        if reply is None:
            self.broken = True
            raise WorkerError(f"worker {self.role} exited: {self.stderr_tail()}")
        if reply.get("failed"):
            self.broken = True
            raise WorkerError(f"worker {self.role}: {reply.get('error')}")
        return reply

    def poll_reply(self) -> dict[str, Any] | None:
        """The answer to the command sent last, if it has come (None: still running)."""
        try:
            reply = self._replies.get_nowait()
        except queue.Empty:
            return None
        self._replies.put(reply)
        return self.wait_reply(0.1)

    def call(self, op: str, timeout: float = COMMAND_TIMEOUT, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.wait_reply(timeout)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def stderr_tail(self) -> str:
        return " | ".join(self._stderr[-5:]) or "(no stderr)"

    def kill(self) -> None:
        if self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.proc.kill()
        self.proc.wait(5)
        self._close_pipes()

    def close(self) -> None:
        if self.proc.poll() is None:
            if self.paused:
                self.resume()
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(3)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        self._reader.join(2)
        self._stderr_reader.join(2)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass


class WorkerPool:
    """Idle workers, started ahead of need."""

    def __init__(self, spare: int = 3) -> None:
        self.spare = spare
        self._idle: list[WorkerProc] = []
        self._busy: list[WorkerProc] = []

    def fill(self) -> None:
        while len(self._idle) < self.spare:
            self._idle.append(WorkerProc())

    def take(self, role: str) -> WorkerProc:
        worker = self._idle.pop(0) if self._idle else WorkerProc()
        worker.role = role
        worker.take_events()
        self._busy.append(worker)
        return worker

    def give_back(self) -> None:
        """End a cell: every worker it used is resumed and reset, or killed if it is in doubt."""
        busy, self._busy = self._busy, []
        for worker in busy:
            if worker.paused:
                worker.resume()
            try:
                if worker.broken or worker.proc.poll() is not None:
                    raise WorkerError("broken")
                deadline = time.monotonic() + COMMAND_TIMEOUT
                while worker._pending > 0:
                    worker.wait_reply(max(0.1, deadline - time.monotonic()))
                worker.call("reset", timeout=10.0)
                worker.take_events()
                self._idle.append(worker)
            except WorkerError:
                worker.kill()
        self.fill()

    def close(self) -> None:
        for worker in self._idle + self._busy:
            worker.close()
        self._idle, self._busy = [], []
