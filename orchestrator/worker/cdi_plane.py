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
object on. A task that keeps its input beyond its call (or runs on after a timeout) leaves the
object pinned: it is then not handed back, and comes back to its recovery container when this
worker exits.
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

import cdi
from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane, TaskRunStatus
from orchestrator.errors import HeldImageLost, InvalidInstruction, ObjectGone, WorkerError
from orchestrator.objectstore import ObjectStore
from orchestrator.worker.execution import (
    EXIT_MINION_LOST,
    Execution,
    TaskCall,
    check_common,
    elapsed_ms,
    read_input_file,
)
from orchestrator.worker.held import Held, HeldImages
from orchestrator.worker.input_fetch import fetch_into_object
from orchestrator.worker.named_data import NamedData, Opened
from orchestrator.worker.store_plane import check_output, check_uri, put_image
from workflows.binding import IMAGE
from workflows.errors import InvalidImage
from workflows.imagebuf import map_image, required_size, write_image
from workflows.tracebacks import clear_frames

__all__ = ["CdiPlane"]

log = logging.getLogger(__name__)


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

    def __init__(
        self,
        client: cdi.Client,
        access_timeout_s: float,
        held: HeldImages,
        store: Callable[[], ObjectStore],
        *,
        max_input_bytes: int,
        max_pixels: int,
    ) -> None:
        self.client = client
        self.access_timeout_s = access_timeout_s
        self.held = held
        self.store = store  # the S3 store of the input and result, made on first use
        self.max_input_bytes = max_input_bytes
        self.max_pixels = max_pixels
        self.named = NamedData(client, access_timeout_s, store)

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
            _check(ins)
            spec = call.load()
            inputs: dict[str, Any] = {}
            if ins.key:
                after.obj = self._fetch(ins, exe) if ins.input_uri else self._use(ins.key)
                if ins.held:
                    after.source = source = _held_input(ins, entry, self.client.container_id)
                    exe.bytes_in = required_size(source.width, source.height, source.mode)
                    inputs[IMAGE] = _read_only(source)
                else:
                    after.view = self._access(after.obj)
                    inputs[IMAGE] = self._map(after.obj, after.view, exe)
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
                after.obj = self._find(ins.key)  # a failed fetch leaves no object
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
                self._store_results(ins, image, view, objects, exe, shared_image)
                image = shared_image = new = None
            elif exe.status == TaskRunStatus.COMPLETED:
                made = self._write_named(ins, objects, exe)
            objects = {}
            # A new image that still maps the input (the task returned its input) is written,
            # not held: holding it would pin the object.
            pinned = view is not None and not _try_release(view)
            current = new if new is not None else source
            done = exe.status == TaskRunStatus.COMPLETED and not exe.stored
            if done and ins.discard_image:
                current = new = None  # no step reads it: the object goes below
            if obj is not None and current is not None and done:
                obj = self._hold_or_write(ins, obj, current, may_hold=not pinned, exe=exe)
            elif obj is None and new is not None and done:
                obj = self._write_fresh(ins, new, exe)
            current = None
            new = None
            if pinned and view is not None:
                _release_view(view)
            self.named.close(ins, opened, succeeded=exe.status == TaskRunStatus.COMPLETED, exe=exe)
            if (exe.stored or (done and ins.discard_image)) and obj is not None:
                self._destroy_stored(obj, exe)
                obj = None
            if ins.held and exe.status != TaskRunStatus.COMPLETED:
                if obj is not None and source is not None:
                    # The retry needs this task's input, which is only in our memory: write it.
                    obj = self._save_for_retry(ins, obj, source, exe)
                else:
                    exe.held_lost = True  # the scheduler recomputes it from the last object
            self.named.settle(ins, made, exe)
            self._settle(ins, obj, exe)
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

    def _write_fresh(
        self, ins: Instruction, img: Image.Image, exe: Execution
    ) -> cdi.CDIObject | None:
        """A new image of a task that read no image object of its own (none, or a shared
        one): into a fresh object, replacing nothing."""
        try:
            return self._write_output(ins, img, exe)
        except Exception as exc:
            clear_frames(exc)
            exe.fail(exc)
            return None

    def _release(self, entry: Held | None) -> None:
        if entry is not None:
            self.held.release(entry)

    # ------------------------------------------------------------------ steps
    def _fetch(self, ins: Instruction, exe: Execution) -> cdi.CDIObject:
        """The first task: make the workflow's object ``key`` from ``input_uri``."""
        started = time.perf_counter()
        try:
            obj = fetch_into_object(
                self.client,
                self.store(),
                ins.input_uri,
                ins.key,
                recovery=ins.return_to or None,
                max_input_bytes=self.max_input_bytes,
                max_pixels=self.max_pixels,
            )
        except cdi.KeyExists as exc:
            raise WorkerError(
                f"CDI object {ins.key!r} already exists; the scheduler must name a fresh key "
                "for every attempt that fetches the input"
            ) from exc
        exe.read_ms = elapsed_ms(started)
        return obj

    def _use(self, key: str) -> cdi.CDIObject:
        # No round trip to check the key: access() is the next call and reports a missing one.
        return self.client.use(key, check=False)

    def _access(self, obj: cdi.CDIObject) -> memoryview:
        try:
            return obj.access(timeout=self.access_timeout_s, populate=True)  # read in full
        except cdi.ObjectNotFound as exc:
            raise ObjectGone(
                f"CDI object {obj.key!r} does not exist (destroyed, or its owner died with no "
                "recovery container); the scheduler must start this task from its input again"
            ) from exc
        except cdi.AccessTimeout as exc:
            raise WorkerError(
                f"CDI object {obj.key!r} did not become ours ({self.client.container_id}) "
                f"within {self.access_timeout_s:g} s; the scheduler must transfer it to the "
                "worker before pushing the instruction"
            ) from exc

    def _map(self, obj: cdi.CDIObject, view: memoryview, exe: Execution) -> Image.Image:
        """The image mapped over ``view`` (no copy)."""
        started = time.perf_counter()
        try:
            img = map_image(view)
        except InvalidImage as exc:
            raise InvalidImage(f"CDI object {obj.key!r} holds no readable image: {exc}") from exc
        exe.bytes_in = required_size(img.width, img.height, img.mode)
        exe.read_ms += elapsed_ms(started)  # after the fetch's, for a first task
        return img

    def _hold_or_write(
        self,
        ins: Instruction,
        obj: cdi.CDIObject,
        img: Image.Image,
        *,
        may_hold: bool,
        exe: Execution,
    ) -> cdi.CDIObject:
        """After a task: hold ``img`` for the workflow's next task here, or write it into a
        fresh object that replaces ``obj``; the object that now holds the image's base."""
        size = required_size(img.width, img.height, img.mode)
        if (
            ins.hold
            and may_hold
            and self.held.put(obj.key, Held(obj.key, str(ins.task_run_id), img, size))
        ):
            exe.held = True
            exe.bytes_out = size
            return obj
        try:
            return self._replace(ins, obj, img, exe)
        except Exception as exc:
            clear_frames(exc)  # they hold ``img``, which maps the input if the task returned it
            exe.fail(exc)
            return obj

    def _store_results(
        self,
        ins: Instruction,
        img: Image.Image | None,
        view: memoryview | None,
        objects: dict[str, Any],
        exe: Execution,
        shared_image: Image.Image | None,
    ) -> None:
        """A step whose outputs are the run's results: PUT its image (``img``, else the image
        it read) at ``output_uri`` and every other output under ``store_prefix``."""
        try:
            if img is None and view is not None:
                img = map_image(view)
            if img is None:
                img = shared_image
            if ins.output_uri and img is not None:
                put_image(self.store(), ins, img, exe)
                exe.results[IMAGE] = ins.output_uri
            img = None
            if ins.store_prefix:
                self.named.store(ins, objects, ins.output_format, exe)
            exe.stored = True
        except Exception as exc:
            clear_frames(exc)  # they hold ``img``, which may map the input
            exe.fail(exc)

    def _destroy_stored(self, obj: cdi.CDIObject, exe: Execution) -> None:
        """The result is stored: the workflow's last object is of no further use."""
        try:
            self._destroy_input(obj)
        except cdi.MinionUnavailable:
            exe.exit_code = EXIT_MINION_LOST  # the task is done; the worker must still restart

    def _save_for_retry(
        self, ins: Instruction, obj: cdi.CDIObject, source: Image.Image, exe: Execution
    ) -> cdi.CDIObject:
        try:
            return self._replace(ins, obj, source, exe)
        except Exception as exc:
            clear_frames(exc)
            exe.note(f"could not write the held input for the retry: {exc}")
            exe.held_lost = True  # the scheduler recomputes it from ``obj``
            return obj

    def _replace(
        self, ins: Instruction, obj: cdi.CDIObject, img: Image.Image, exe: Execution
    ) -> cdi.CDIObject:
        """Write ``img`` into a fresh object and destroy ``obj``; the fresh object."""
        output = self._write_output(ins, img, exe)
        try:
            self._destroy_input(obj)
        except cdi.MinionUnavailable as exc:
            exe.fail(exc)
        return output

    def _write_output(self, ins: Instruction, img: Image.Image, exe: Execution) -> cdi.CDIObject:
        """Write ``img`` into a fresh ``output_key`` object; if this raises, none is left."""
        if not ins.output_key:
            raise InvalidInstruction(
                f"task {ins.task!r} returned a new image but the instruction names no output_key"
            )
        started = time.perf_counter()
        size = required_size(img.width, img.height, img.mode)
        try:
            out = self.client.create(
                ins.output_key, size, recovery=ins.return_to or None, zeroed=False
            )
        except cdi.KeyExists as exc:
            raise WorkerError(
                f"output CDI object {ins.output_key!r} already exists; the scheduler must name "
                "a fresh output_key for every attempt (and destroy orphans of dead workers)"
            ) from exc
        try:
            with out.view() as buf:
                write_image(buf, img)
        except BaseException:
            with suppress(cdi.CDIError):
                out.destroy()
            raise
        exe.bytes_out = size
        exe.write_ms = elapsed_ms(started)
        return out

    def _destroy_input(self, held: cdi.CDIObject) -> None:
        try:
            held.destroy()
        except cdi.MinionUnavailable:
            raise
        except cdi.CDIError as exc:
            # The output is complete, so the task succeeded; the input merely leaks to us.
            log.error("could not destroy input %r after writing its output: %s", held.key, exc)

    # ------------------------------------------------------------------ hand-back
    def _find(self, key: str) -> cdi.CDIObject | None:
        """The input after an early failure, to keep or hand back; None if there is none."""
        try:
            return self.client.use(key)
        except cdi.CDIError as exc:
            log.warning("input %r cannot be handed back: %s", key, exc)
            return None

    def _settle(self, ins: Instruction, held: cdi.CDIObject | None, exe: Execution) -> None:
        """Keep the current object or hand it to ``return_to``; record which in ``exe``."""
        exe.kept = False
        if exe.stored:
            exe.key = ""  # the result is in S3 and the object destroyed: nothing to hand back
            return
        if held is None:
            # A fetch that failed made no object: the retry fetches again.
            exe.key = "" if ins.input_uri else ins.key
            return
        exe.key = held.key
        # A worker about to exit gives everything back: what it kept would die with it. A
        # failed task gives it back too, so the scheduler can retry elsewhere or clean up.
        if ins.keep and not exe.exit_code and exe.status == TaskRunStatus.COMPLETED:
            exe.kept = True
            return
        if not ins.return_to:
            exe.kept = True
            exe.note(f"the instruction names no return_to, so this worker keeps {held.key!r}")
            return
        started = time.perf_counter_ns()
        try:
            try:
                held.transfer(ins.return_to)
            except cdi.BufferInUse:
                if not exe.exit_code:
                    raise
                # A task thread that overran its timeout still reads the input, and this worker
                # is about to exit: leave it the mapping and hand the object back now.
                held.transfer(ins.return_to, detach=True)
            exe.return_us = (time.perf_counter_ns() - started) / 1000
        except cdi.NotOwner:
            log.warning("%r is not ours to hand back to %s", held.key, ins.return_to)
        except cdi.ObjectNotFound:
            log.warning("%r vanished before it could be handed back", held.key)
        except cdi.MinionUnavailable as exc:
            exe.fail(exc)  # the object died with the minion: the task must run again
            exe.exit_code = EXIT_MINION_LOST
        except cdi.CDIError as exc:
            # E.g. return_to is not registered (a scheduler restarting): it stays with us.
            exe.kept = True
            exe.note(f"could not hand {held.key!r} back to {ins.return_to!r}: {exc}")


def _held_input(ins: Instruction, entry: Held | None, worker_id: str | None) -> Image.Image:
    """The image held from task run ``ins.held``; ``HeldImageLost`` if this worker has none."""
    if entry is None or entry.token != ins.held or entry.base != ins.key:
        raise HeldImageLost(
            f"worker {worker_id} holds no image from task run {ins.held} of workflow "
            f"{ins.workflow_id} (it restarted, or had to give it up); the scheduler recomputes "
            f"it from {ins.key!r}"
        )
    return entry.image


def _read_only(img: Image.Image) -> Image.Image:
    """A read-only image over ``img``'s pixels: a task that changes it in place gets a copy
    (as a mapped input does), so a failed attempt cannot alter the image its retry needs."""
    shared = img._new(img.im)
    shared.readonly = 1
    return shared


def _try_release(view: memoryview) -> bool:
    """Release ``view`` if nothing refers to its memory any more."""
    try:
        view.release()
    except BufferError:
        return False
    return True


def _release_view(view: memoryview) -> None:
    """Release the view the mapped input came from; a cycle that still holds the image is
    collected first. If the task kept the image, the view stays and the object stays pinned
    (its transfer or destroy then reports ``BufferInUse``)."""
    try:
        view.release()
    except BufferError:
        gc.collect()
        try:
            view.release()
        except BufferError:
            log.warning(
                "the task still holds its input image (it kept it, or it runs on past its "
                "timeout): the object stays pinned until it lets go"
            )


def _check(ins: Instruction) -> None:
    check_common(ins)
    if not isinstance(ins.key, str) or ((ins.input_uri or ins.held) and not ins.key):
        raise InvalidInstruction(f"instruction {ins.task_run_id} (cdi plane) names no key")
    if not isinstance(ins.outputs, dict) or not isinstance(ins.store_prefix, str):
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: outputs must be an object, store_prefix a string"
        )
    if ins.store_prefix:
        check_uri(ins, "store_prefix", ins.store_prefix, DataPlane.CDI)
    if not isinstance(ins.held, str) or not isinstance(ins.hold, bool):
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: held must be a string and hold a boolean"
        )
    if ins.hold and not ins.keep:
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: hold without keep; a worker can hold a new image "
            "only while it keeps the object it was computed from"
        )
    if ins.output_uri:
        if ins.keep:
            raise InvalidInstruction(
                f"instruction {ins.task_run_id}: output_uri with keep; the last task stores "
                "the result and destroys the object, so there is nothing to keep"
            )
        check_output(ins, DataPlane.CDI)
    if ins.input_uri:
        if ins.held:
            raise InvalidInstruction(
                f"instruction {ins.task_run_id}: input_uri with held; a task reads either the "
                "input from S3 (the first) or an image held from the one before"
            )
        check_uri(ins, "input_uri", ins.input_uri, DataPlane.CDI)
    if ins.output_key and ins.output_key == ins.key:
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: output_key equals key ({ins.key!r}); the output "
            "must be a fresh object so the input survives a failed attempt"
        )
