"""A task's named data on the ``cdi`` plane, apart from the chain's ``image`` (``cdi_plane``):
opening its inputs, writing or storing its outputs, and letting go of what it read.

*Inputs* (``Instruction.inputs``): an object the worker owns (``own``: it was handed over, and
is destroyed once the task has succeeded, or handed back to ``return_to`` when it failed), an
object read through a share (``read``: a read-only mapping, given up afterwards), an inline
JSON value, or a list of those. Values are read-only and map the objects' memory
(``workflows.kinds.read_value``). Several slots of one worker may read one shared object at
once: the share is the worker's (one container), so it is given up only when the last of them
is done (``SharedReads``), and the report says so (``Report.released``): the scheduler shares
the object again with a worker that still has reads of it to come.

*Outputs* the task returned besides ``image``: each that a later step reads
(``Instruction.outputs``) is written into a fresh object (a list output into one per element,
``<key>.<i>``), created with ``return_to`` as recovery container, and then goes where the
image goes (``cdi_hand_back``: kept, handed on to the next step's worker, or back to
``return_to``); at a step whose outputs are the run's results (``store_prefix``) each is
stored in S3 instead. What no step reads is dropped.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import cdi
from cdi import ObjectKey
from orchestrator.contract.messages import Instruction
from orchestrator.errors import InvalidInstruction, ObjectGone, WorkerError
from orchestrator.objectstore import ObjectStore
from orchestrator.worker.execution import Execution, elapsed_ms
from workflows.errors import InvalidData
from workflows.kinds import Kind, encode_file, kind_of, read_value, size_of
from workflows.kinds import write_value as write_kind

__all__ = ["NamedData", "Opened", "SharedReads"]

log = logging.getLogger(__name__)


class SharedReads:
    """The objects this worker reads through shares, counted across its slots: the share is
    given up when the last slot reading it is done."""

    def __init__(self, client: cdi.Client) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._counts: dict[ObjectKey, int] = {}

    def open(self, key: ObjectKey, timeout: float) -> memoryview:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
        try:
            # Waits for a share naming us: the scheduler shares before it sends, or again once
            # a release of ours crossed its sending.
            return self.client.use(key, check=False).read(timeout)
        except BaseException:
            self.close(key)
            raise

    def close(self, key: ObjectKey) -> bool:
        """One slot is done with ``key``; whether the worker gave up its share."""
        with self._lock:
            left = self._counts.get(key, 0) - 1
            if left > 0:
                self._counts[key] = left
                return False
            self._counts.pop(key, None)
            # Inside the lock: a slot opening the key now reads only after this release.
            try:
                self.client.use(key, check=False).release()
            except cdi.CDIError as exc:
                log.warning("could not give up the share of %r: %s", key, exc)
            return True


@dataclass
class Opened:
    """A task's named inputs, open."""

    values: dict[str, Any] = field(default_factory=dict)
    owned: dict[ObjectKey, cdi.CDIObject] = field(default_factory=dict)
    shared: list[ObjectKey] = field(default_factory=list)
    views: dict[ObjectKey, memoryview] = field(default_factory=dict)  # one per object
    nbytes: int = 0


class NamedData:
    """Opens, writes and stores the named data of this worker's instructions."""

    def __init__(
        self,
        client: cdi.Client,
        access_timeout_s: float,
        store: Callable[[], ObjectStore],
    ) -> None:
        self.client = client
        self.access_timeout_s = access_timeout_s
        self.objectstore = store  # made on first use
        self.shares = SharedReads(client)

    # ------------------------------------------------------------------ inputs
    def open(self, ins: Instruction, opened: Opened) -> None:
        """Open every input of ``ins`` into ``opened`` (what opened before a failure is in it,
        for ``close``)."""
        if not isinstance(ins.inputs, dict):
            raise InvalidInstruction(f"instruction {ins.task_run_id}: inputs must be an object")
        for name, given in ins.inputs.items():
            opened.values[name] = self._value(ins, name, given, opened)

    def _value(self, ins: Instruction, name: str, given: Any, opened: Opened) -> Any:
        if not isinstance(given, dict):
            raise InvalidInstruction(f"instruction {ins.task_run_id}: input {name!r} is no object")
        if "value" in given:
            return given["value"]
        if "items" in given:
            items = given["items"]
            if not isinstance(items, list):
                raise InvalidInstruction(f"instruction {ins.task_run_id}: {name!r}.items")
            return [self._value(ins, name, item, opened) for item in items]
        key, kind, mode = given.get("key"), given.get("kind"), given.get("mode")
        if not isinstance(key, str) or kind not in set(Kind) or mode not in ("own", "read"):
            raise InvalidInstruction(
                f"instruction {ins.task_run_id}: input {name!r} needs a key, a kind (one of "
                f"{', '.join(Kind)}) and a mode (own or read), got {given!r}"
            )
        key = ObjectKey(key)
        view = opened.views.get(key)
        if view is None:
            view = self._map(key, mode, opened)
            opened.views[key] = view
            opened.nbytes += len(view)
        try:
            return read_value(view, Kind(kind))
        except InvalidData as exc:
            raise InvalidData(f"input {name!r} (object {key!r}): {exc}") from exc

    def _map(self, key: ObjectKey, mode: str, opened: Opened) -> memoryview:
        try:
            if mode == "read":
                view = self.shares.open(key, self.access_timeout_s)
                opened.shared.append(key)
                return view
            obj = self.client.use(key, check=False)
            view = obj.access(timeout=self.access_timeout_s, populate=True)
            opened.owned[key] = obj
            return view
        except cdi.ObjectNotFound as exc:
            raise ObjectGone(
                f"CDI object {key!r} does not exist (destroyed, or its owner died); the "
                "scheduler must make it again"
            ) from exc
        except cdi.AccessTimeout as exc:
            raise WorkerError(
                f"CDI object {key!r} was not {'shared with' if mode == 'read' else 'given to'} "
                f"{self.client.container_id} within {self.access_timeout_s:g} s"
            ) from exc

    def close(self, ins: Instruction, opened: Opened, *, succeeded: bool, exe: Execution) -> None:
        """Let go of the inputs (their values must be dropped by now): owned ones destroyed
        after a success, else handed back; shares given up."""
        opened.values.clear()
        for key, view in opened.views.items():
            _release_view(view, key)
        opened.views.clear()
        for key, obj in opened.owned.items():
            try:
                if succeeded:
                    obj.destroy()
                elif ins.return_to:
                    obj.transfer(ins.return_to)
                    exe.returned.append(key)
            except cdi.CDIError as exc:
                exe.note(f"could not {'destroy' if succeeded else 'hand back'} {key!r}: {exc}")
        opened.owned.clear()
        for key in opened.shared:
            if self.shares.close(key):
                exe.released.append(key)
        opened.shared.clear()

    # ------------------------------------------------------------------ outputs
    def write(
        self, ins: Instruction, objects: dict[str, Any], exe: Execution
    ) -> list[cdi.CDIObject]:
        """Write each output a later step reads into fresh objects (recorded in ``exe``); the
        objects, for ``cdi_hand_back.hand_outputs``. If this raises, the objects it made are
        destroyed."""
        made: list[cdi.CDIObject] = []
        if not any(ins.outputs.get(name) for name in objects):
            return made
        started = time.perf_counter()
        try:
            for name, value in objects.items():
                key = ins.outputs.get(name)
                if not key:
                    continue  # no step reads it
                if isinstance(value, list):
                    items = [
                        self._write(ObjectKey(f"{key}.{i}"), v, ins, made)
                        for i, v in enumerate(value)
                    ]
                    exe.objects[name] = {"items": items}
                else:
                    exe.objects[name] = self._write(key, value, ins, made)
        except BaseException:
            for obj in made:
                with suppress(cdi.CDIError):
                    obj.destroy()
            exe.objects.clear()
            raise
        exe.write_ms += elapsed_ms(started)
        return made

    def _write(
        self, key: ObjectKey, value: Any, ins: Instruction, made: list[cdi.CDIObject]
    ) -> Any:
        kind = kind_of(value)
        size = size_of(value, kind)
        try:
            obj = self.client.create(key, size, recovery=ins.return_to or None, zeroed=False)
        except cdi.KeyExists as exc:
            raise WorkerError(
                f"output CDI object {key!r} already exists; the scheduler names a fresh key "
                "for every attempt"
            ) from exc
        made.append(obj)
        with obj.view() as buf:
            write_kind(buf, value, kind)
        return {"key": key, "kind": str(kind), "nbytes": size}

    def store(self, ins: Instruction, objects: dict[str, Any], fmt: str, exe: Execution) -> None:
        """Store each output as a result under ``store_prefix`` (recorded in ``exe``)."""
        if not objects:
            return
        store = self.objectstore()
        for name, value in objects.items():
            if isinstance(value, list):
                exe.results[name] = [
                    self._put(store, f"{ins.store_prefix}{name}-{i}", v, fmt, exe)
                    for i, v in enumerate(value)
                ]
            else:
                exe.results[name] = self._put(store, f"{ins.store_prefix}{name}", value, fmt, exe)

    def _put(self, store: ObjectStore, stem: str, value: Any, fmt: str, exe: Execution) -> str:
        started = time.perf_counter()
        kind = kind_of(value)
        data, filetype = encode_file(value, kind, fmt)
        uri = stem + filetype.extension
        store.put(uri, data, content_type=filetype.content_type)
        exe.bytes_out += len(data)
        exe.write_ms += elapsed_ms(started)
        return uri


def _release_view(view: memoryview, key: ObjectKey) -> None:
    try:
        view.release()
    except BufferError:
        gc.collect()  # a cycle (a traceback's frames) may still hold the value
        try:
            view.release()
        except BufferError:
            log.warning("the task still holds input %r: it stays mapped until it lets go", key)
