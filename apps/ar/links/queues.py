"""The queues of the backends whose receivers are servers (REST, gRPC).

A server thread takes each message off the wire and puts it here; the role's own thread takes
it. ``Inbox`` is a detector's: it admits ``depth`` frames until the detector has passed them
on (``done``), so the extractor's next call to a detector with ``depth`` frames in hand waits,
as it waits for a TCP detector's credit or for a CDI object to come back.
``Reorder`` is the combinator's: frames arrive from N detectors in any order and leave in
sequence; one too far ahead of the next waits, so a slow detector cannot make it hoard frames.
"""

from __future__ import annotations

import queue
import threading
from typing import Generic, TypeVar

__all__ = ["Inbox", "Reorder"]

M = TypeVar("M")


class Inbox(Generic[M]):
    def __init__(self, size: int, timeout: float) -> None:
        self._admitted = threading.Semaphore(size)
        self._queue: queue.Queue[M] = queue.Queue()
        self._timeout = timeout

    def put(self, message: M) -> None:
        """Queue ``message``; wait while ``size`` frames are admitted and not yet done."""
        if not self._admitted.acquire(timeout=self._timeout):
            raise TimeoutError(f"the detector took no frame for {self._timeout} s")
        self._queue.put(message)

    def get(self) -> M:
        try:
            return self._queue.get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"no frame arrived for {self._timeout} s") from None

    def done(self) -> None:
        """A frame got from here has been passed on: admit another."""
        self._admitted.release()


class Reorder(Generic[M]):
    def __init__(self, window: int, timeout: float) -> None:
        self._window = window
        self._timeout = timeout
        self._next = 0
        self._waiting: dict[int, M] = {}
        self._changed = threading.Condition()

    def put(self, seq: int, message: M) -> None:
        """Keep ``message`` until frame ``seq`` is taken; wait while it is a window ahead."""
        with self._changed:
            if not self._changed.wait_for(
                lambda: seq < self._next + self._window, timeout=self._timeout
            ):
                raise TimeoutError(f"frame {seq} waited {self._timeout} s for frame {self._next}")
            self._waiting[seq] = message
            self._changed.notify_all()

    def take(self, seq: int) -> M:
        """Frame ``seq``, once it has arrived; frames are taken in order."""
        with self._changed:
            if not self._changed.wait_for(lambda: seq in self._waiting, timeout=self._timeout):
                raise TimeoutError(f"frame {seq} did not arrive within {self._timeout} s")
            message = self._waiting.pop(seq)
            self._next = seq + 1
            self._changed.notify_all()
            return message
