"""The ``cdi`` data plane: the image is a CDI object this worker owns when it pops the instruction.

The workflow's first instruction names ``input_uri`` instead: the worker makes the object
``key`` itself from the S3 input (``input_fetch``), with ``return_to`` as recovery container,
and goes on as if it had been handed over.

The input is only ever read, and in place: the task gets a read-only Pillow image mapped over
the object's memory (``map_image``; no copy). A task that produces a new image gets a *fresh*
object (``output_key``, recoverable by ``return_to``), written with one copy, and the input is
destroyed once that object is written. Whatever fails, the object that holds the image is left
intact and is then kept (``keep``) or handed back to ``return_to``, so the scheduler can retry or
clean up.

With ``hold`` the new image is not written at all: the worker keeps it in memory for the
workflow's next task, along with the object it was computed from (``held``), and writes it only
when it must leave the worker (a task without ``hold``, a failure, a full budget). That saves a
copy of the whole image per task under ``affinity``; the price is that a worker's death loses
the held image, which the scheduler then recomputes from the object.

With ``output_uri`` (the workflow's last task) the worker stores the result itself: it encodes
the task's image, PUTs it there and destroys the object, so the last image is never copied into
an object and nothing is handed back. That part runs after the worker's slot has moved on to
its next instruction (``Execution.later``). If the PUT fails the task fails like any other, and
its retry starts from the object (or from the held input, written for it).

Named data besides the image (``Instruction.inputs`` and ``outputs``: other inputs, shared
reads, outputs of any kind) is opened, written, stored and let go by ``named_data``, around the
image's own path here; a ``none``-plane instruction (a run started without an image) is one
with no image object, and touches CDI only for the named data it has.

The mapped input pins the object (no transfer or destroy while it lives), so the worker drops
every reference it holds — the task's own frames in a traceback included — before it hands the
object on. A task that keeps its input beyond its call (or does not stop when asked) leaves the
object pinned: it is then not handed back, and comes back to its recovery container when this
worker exits.

The parts: what an instruction must hold (``cdi_checks``), the image coming in
(``cdi_inputs``) and going out (``cdi_outputs``), the objects it leaves kept, handed on or
handed back (``cdi_hand_back``), and the named data (``named_data``); this module runs them in
order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

import cdi
from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.errors import ObjectGone
from orchestrator.worker.cdi_checks import check_cdi_instruction
from orchestrator.worker.cdi_hand_back import hand_outputs, keep_or_hand_back
from orchestrator.worker.cdi_inputs import (
    ImageInput,
    held_input,
    read_only,
    release_view,
    try_release,
)
from orchestrator.worker.cdi_outputs import ImageOutput
from orchestrator.worker.execution import Execution, TaskCall, read_input_file
from orchestrator.worker.held import Held
from orchestrator.worker.named_data import NamedData, Opened
from orchestrator.worker.plane_parts import PlaneParts
from workflows.binding import IMAGE
from workflows.imagebuf import required_size
from workflows.tracebacks import clear_frames

__all__ = ["CdiPlane"]


@dataclass
class _After:
    """What a task run leaves for the rest of its instruction."""

    obj: cdi.CDIObject | None = None  # the object holding the workflow's image now
    view: memoryview | None = None  # the input's memory while the task reads it
    source: Image.Image | None = None  # the held input, newer than ``obj``
    new: Image.Image | None = None  # the task's new image
    objects: dict[str, Any] = field(default_factory=dict)  # its other named outputs
    opened: Opened = field(default_factory=Opened)  # its named inputs


class CdiPlane:
    """Runs ``cdi`` instructions through this worker's CDI client."""

    def __init__(self, parts: PlaneParts) -> None:
        client, store, held = parts.client, parts.store, parts.held
        self.client = client
        self.held = held
        self.store = store  # the S3 store of the input and result, made on first use
        self.max_input_bytes = parts.max_input_bytes
        self.named = NamedData(client, parts.access_timeout_s, store)
        self.inputs = ImageInput(
            client,
            store,
            parts.access_timeout_s,
            max_input_bytes=parts.max_input_bytes,
            max_pixels=parts.max_pixels,
            cache=parts.input_cache,
            stats=parts.input_stats,
        )
        self.outputs = ImageOutput(client, held, store, self.named)

    def read_file(self, uri: str) -> bytes:
        """A file a task names (``TaskContext.read_file``)."""
        return read_input_file(self.store(), uri, self.max_input_bytes)

    def run(self, ins: Instruction, call: TaskCall, exe: Execution) -> None:
        """Run ``ins``; a last task's result is stored by ``exe.later``, which the worker calls
        once the slot has moved on: S3's round trips need not hold up its next task."""
        # What this worker held from the object this instruction names is its input, or stale.
        entry = self.held.take(ins.key) if isinstance(ins.key, str) and ins.key else None
        try:
            after = self._compute(ins, call, exe, entry)
        except BaseException:
            self._release(entry)
            raise
        # Only what waits for S3 goes later: a result to store.
        stores = bool(ins.output_uri) or bool(ins.store_prefix and after.objects)
        if stores and exe.status == TaskRunStatus.COMPLETED:
            exe.later = functools.partial(self._conclude, ins, exe, after, entry)
        else:
            self._conclude(ins, exe, after, entry)

    def _compute(
        self, ins: Instruction, call: TaskCall, exe: Execution, entry: Held | None
    ) -> _After:
        """Run the task; what it leaves for ``_conclude``."""
        after = _After()
        try:
            check_cdi_instruction(ins)
            spec = call.load()
            inputs: dict[str, Any] = {}
            if ins.key:
                after.obj = (
                    self.inputs.fetch(ins, exe) if ins.input_uri else self.inputs.use(ins.key)
                )
                if ins.held:
                    after.source = source = held_input(ins, entry, self.client.container_id)
                    exe.bytes_in = required_size(source.width, source.height, source.mode)
                    inputs[IMAGE] = read_only(source)
                else:
                    after.view = self.inputs.access(after.obj)
                    inputs[IMAGE] = self.inputs.map(after.obj, after.view, exe)
            self.named.open(ins, after.opened)
            exe.bytes_in += after.opened.nbytes
            inputs.update(after.opened.values)
            produced = call.run(spec, inputs, exe, self.read_file)  # it empties ``inputs``
            if isinstance(produced.objects.get(IMAGE), Image.Image):
                after.new = produced.objects.pop(IMAGE)
            after.objects = produced.objects
        except Exception as exc:
            clear_frames(exc)  # its frames hold the mapped input: they must not pin the object
            exe.fail(exc)
            after.new = None
            after.objects = {}
            lane_missing = after.view is None and after.source is None
            if isinstance(exc, ObjectGone) and ins.key and lane_missing:
                after.obj = None  # nothing to keep or hand back
            elif after.obj is None and ins.key and not ins.input_uri:
                after.obj = self.inputs.find(ins.key)  # a failed fetch leaves no object
        return after

    def _conclude(
        self, ins: Instruction, exe: Execution, after: _After, entry: Held | None
    ) -> None:
        """Store, hold or write the task's outputs, let go of its inputs, then keep or hand
        back the objects."""
        try:
            # Taken out of ``after``, which ``exe.later`` refers to: a reference left there to
            # an image that maps the input would pin the object.
            obj, view, source, new = after.obj, after.view, after.source, after.new
            objects, opened = after.objects, after.opened
            after.obj = after.view = after.source = after.new = None
            after.objects = {}
            sink = bool(ins.output_uri or ins.store_prefix)
            made: list[cdi.CDIObject] = []
            if exe.status == TaskRunStatus.COMPLETED and sink:
                shared = opened.values.get(IMAGE)
                shared_image = shared if isinstance(shared, Image.Image) else None
                shared = None
                image = new if new is not None else source
                self.outputs.store_results(ins, image, view, objects, exe, shared_image)
                image = shared_image = new = None
            elif exe.status == TaskRunStatus.COMPLETED:
                made = self._write_named(ins, objects, exe)
            objects = {}
            # A new image that still maps the input (the task returned its input) is written,
            # not held: holding it would pin the object.
            pinned = view is not None and not try_release(view)
            current = new if new is not None else source
            done = exe.status == TaskRunStatus.COMPLETED and not exe.stored
            if done and ins.discard_image:
                current = new = None  # no step reads it: the object goes below
            if obj is not None and current is not None and done:
                obj = self.outputs.hold_or_write(ins, obj, current, may_hold=not pinned, exe=exe)
            elif obj is None and new is not None and done:
                obj = self.outputs.write_fresh(ins, new, exe)
            current = None
            new = None
            if pinned and view is not None:
                release_view(view)
            self.named.close(ins, opened, succeeded=exe.status == TaskRunStatus.COMPLETED, exe=exe)
            if (exe.stored or (done and ins.discard_image)) and obj is not None:
                self.outputs.destroy_stored(obj, exe)
                obj = None
            # Only a step that may run again needs its input (a stopped run's never does).
            if ins.held and exe.status != TaskRunStatus.COMPLETED and exe.retryable:
                if obj is not None and source is not None:
                    # The retry needs this task's input, which is only in our memory: write it.
                    obj = self.outputs.save_for_retry(ins, obj, source, exe)
                else:
                    exe.held_lost = True  # the scheduler recomputes it from the last object
            hand_outputs(ins, made, exe)
            keep_or_hand_back(ins, obj, exe)
        finally:
            self._release(entry)

    def _write_named(
        self, ins: Instruction, objects: dict[str, Any], exe: Execution
    ) -> list[cdi.CDIObject]:
        try:
            return self.named.write(ins, objects, exe)
        except Exception as exc:
            clear_frames(exc)
            exe.fail(exc)
            return []

    def _release(self, entry: Held | None) -> None:
        if entry is not None:
            self.held.release(entry)
