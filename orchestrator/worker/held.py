"""Images a worker holds between consecutive tasks of one workflow, instead of writing them.

Under ``affinity`` the next task of a workflow comes to the same worker, so a task's new image
need not be copied into a fresh CDI object only for that worker to read it back. With
``Instruction.hold`` the worker keeps the image here, keyed by the CDI object it was computed
from (which the worker keeps owning; the next instruction names it as ``key``), with a token
naming the task run that produced it. The next instruction names that token in ``held``; the
image is written to a CDI object only when it must leave the worker (the last task, a failure,
no room here). *Why by object, not by workflow:* the branches of one workflow may run side by
side on one worker, each with its own image.

*Why a budget, and refusal rather than eviction:* the images are private memory the host's
memory limits know nothing about. A full budget makes the worker write the result as before,
which costs one copy; evicting a held image would cost the scheduler a recomputation.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Final

from PIL import Image

from cdi import ObjectKey

__all__ = ["DEFAULT_HOLD_BYTES", "Held", "HeldImages"]

DEFAULT_HOLD_BYTES: Final = 512 * 2**20
# A held image no instruction has asked for within this time belongs to a workflow that went
# elsewhere (its scheduler restarted, say): it is dropped when room is needed.
STALE_AFTER_S: Final = 300.0


@dataclass(frozen=True)
class Held:
    """One workflow's image, newer than the CDI object ``key`` it was computed from."""

    key: ObjectKey  # the CDI object this worker keeps for the workflow
    token: str  # the task run that produced the image (what the next instruction names)
    image: Image.Image
    nbytes: int
    since: float = field(default_factory=time.monotonic)


class HeldImages:
    """At most one held image per base object, within ``max_bytes``; safe across slots."""

    def __init__(self, max_bytes: int = DEFAULT_HOLD_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._held: dict[ObjectKey, Held] = {}
        self._in_use: list[Held] = []  # taken by a running instruction, not yet released
        self._bytes = 0  # of both: the memory the images take

    def take(self, key: ObjectKey) -> Held | None:
        """Remove and return the image held over object ``key``, if any; it counts against
        the budget until ``release``."""
        with self._lock:
            held = self._held.pop(key, None)
            if held is not None:
                self._in_use.append(held)
            return held

    def release(self, held: Held) -> None:
        """A taken image is no longer needed (it was written, or dropped)."""
        with self._lock:
            self._in_use.remove(held)
            self._bytes -= held.nbytes

    def put(self, key: ObjectKey, held: Held) -> bool:
        """Hold ``held`` over object ``key``; False (nothing held) when it does not fit, or
        when that object has a held image already (the same instruction run twice, e.g.
        re-sent after Redis lost its data): the caller then writes the image instead."""
        with self._lock:
            if key in self._held:
                return False
            if self._bytes + held.nbytes > self.max_bytes:
                self._drop_stale()
            if self._bytes + held.nbytes > self.max_bytes:
                return False
            self._held[key] = held
            self._bytes += held.nbytes
            return True

    def usage(self) -> tuple[int, int]:
        """Images held now (between tasks or as a running task's input), and their bytes."""
        with self._lock:
            return len(self._held) + len(self._in_use), self._bytes

    @property
    def nbytes(self) -> int:
        return self.usage()[1]

    def __len__(self) -> int:
        return self.usage()[0]

    def _drop_stale(self) -> None:
        cutoff = time.monotonic() - STALE_AFTER_S
        for key in [k for k, h in self._held.items() if h.since < cutoff]:
            self._bytes -= self._held.pop(key).nbytes
