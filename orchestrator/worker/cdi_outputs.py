"""The workflow's image going out on the ``cdi`` plane (``cdi_plane``): held in this worker's
memory for the next task, written into a fresh object that replaces the one it was computed
from, or stored in S3 as the run's result, after which the last object is destroyed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from PIL import Image

import cdi
from orchestrator.contract.messages import Instruction
from orchestrator.errors import InvalidInstruction, WorkerError
from orchestrator.objectstore import ObjectStore
from orchestrator.worker.execution import EXIT_MINION_LOST, Execution, elapsed_ms
from orchestrator.worker.held import Held, HeldImages
from orchestrator.worker.named_data import NamedData
from orchestrator.worker.store_plane import put_image
from workflows.binding import IMAGE
from workflows.imagebuf import map_image, required_size, write_image
from workflows.tracebacks import clear_frames

__all__ = ["ImageOutput"]

log = logging.getLogger(__name__)


class ImageOutput:
    """Holds, writes or stores the image a ``cdi`` instruction leaves, through this worker's
    CDI client."""

    def __init__(
        self,
        client: cdi.Client,
        held: HeldImages,
        store: Callable[[], ObjectStore],
        named: NamedData,
    ) -> None:
        self.client = client
        self.held = held
        self.store = store  # the S3 store of the result, made on first use
        self.named = named  # stores the step's other outputs beside the image

    def hold_or_write(
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

    def write_fresh(
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

    def store_results(
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

    def destroy_stored(self, obj: cdi.CDIObject, exe: Execution) -> None:
        """The result is stored: the workflow's last object is of no further use."""
        try:
            self._destroy_input(obj)
        except cdi.MinionUnavailable:
            exe.exit_code = EXIT_MINION_LOST  # the task is done; the worker must still restart

    def save_for_retry(
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

    def _destroy_input(self, obj: cdi.CDIObject) -> None:
        try:
            obj.destroy()
        except cdi.MinionUnavailable:
            raise
        except cdi.CDIError as exc:
            # The output is complete, so the task succeeded; the input merely leaks to us.
            log.error("could not destroy input %r after writing its output: %s", obj.key, exc)
