"""The data of a run the scheduler follows: each datum a step made, and the CDI objects that
hold them, with who owns each object and how many reads of it are still to come.

A ``Datum`` is inline JSON, one object, or a list of data (a list output, or what a fan-out's
runs made, in order). An ``Obj`` is one CDI object: its owner (the scheduler, or a worker that
kept it), ``pending`` — the reads still to come, reserved by the steps that will read it — and
``readers``, the workers it is shared with now. *How an object moves to a step that reads it*
(``Obj.mode_for``): the last read to come, with nobody reading now, takes the object itself
(transferred, and destroyed by that worker once its task is done: the chain's hand-over);
while more reads are to come, each reader gets a read-only share and the scheduler keeps the
object, destroying it once nothing reads it and no read is left.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cdi import ObjectKey
from workflows.kinds import Kind

__all__ = ["Datum", "Mode", "Obj"]


class Mode(enum.StrEnum):
    """How a step reads an object."""

    OWN = "own"  # the object is handed to its worker, which destroys it after the task
    READ = "read"  # a read-only share; the object stays the scheduler's


@dataclass(frozen=True)
class Datum:
    """One datum a step made (or the run's input): inline JSON, an object, or a list."""

    key: ObjectKey = ObjectKey("")  # the CDI object holding it ("" when inline or a list)
    kind: Kind = Kind.JSON
    value: Any = None  # inline JSON
    items: tuple[Datum, ...] | None = None  # a list of data
    uri: str = ""  # the run's input image, still in S3 (fetched by the step that reads it)

    @property
    def is_object(self) -> bool:
        return bool(self.key)

    def object_keys(self) -> Iterator[ObjectKey]:
        """Every object this datum holds (a list's, in order)."""
        if self.key:
            yield self.key
        for item in self.items or ():
            yield from item.object_keys()

    def describe(self) -> Any:
        """JSON for messages and the task run's record."""
        if self.items is not None:
            return {"items": [i.describe() for i in self.items]}
        if self.key:
            return {"key": self.key, "kind": str(self.kind)}
        if self.uri:
            return {"uri": self.uri, "kind": str(Kind.IMAGE)}
        return {"value": self.value}


@dataclass
class Obj:
    """A CDI object of the run."""

    key: ObjectKey
    kind: Kind
    nbytes: int
    owner: str  # the container that owns it: the scheduler, or a worker that kept it
    # A worker owner's ``started_at`` as the instruction that gave it the object saw it: a
    # worker of the same id with another (or none) may have lost it (``ahead``).
    given: float = 0.0
    pending: int = 0  # reads still to come (reserved by the steps that will read it)
    datum: str = ""  # what it holds, "<step run>.<output>" (for the record of its hand-offs)
    made_by: str | None = None  # the worker that made it (where the data is warm)
    readers: dict[str, int] = field(default_factory=dict)  # worker -> its shared reads out
    # Chain fast path: the owner holds a newer image in memory (token of the task run that
    # made it), computed from this object by ``held_chain`` (step runs to redo if it is lost).
    held: str = ""
    held_chain: tuple[str, ...] = ()
    held_base: tuple[str, str] = ("", "")  # the datum (step run, output) the object was

    def mode_for(self) -> Mode:
        """The mode of the next read: its own if it is the last to come and nobody reads now."""
        return Mode.OWN if self.pending <= 1 and not self.readers else Mode.READ

    def read_done(self, worker: str) -> None:
        """A shared read by ``worker`` was reported."""
        self.read_failed(worker)  # the share is given back either way
        self.pending = max(0, self.pending - 1)

    def read_failed(self, worker: str) -> None:
        """A shared read by ``worker`` failed: it comes again (its reservation stays)."""
        left = self.readers.get(worker, 0) - 1
        if left > 0:
            self.readers[worker] = left
        else:
            self.readers.pop(worker, None)

    @property
    def unused(self) -> bool:
        """No read left to come, nobody reading: the object can go."""
        return self.pending <= 0 and not self.readers
