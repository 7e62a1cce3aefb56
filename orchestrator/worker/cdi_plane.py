"""The ``cdi`` data plane: the image is a CDI object this worker owns when it pops the instruction.

The input is only ever read, and in place: the task gets a read-only Pillow image mapped over
the object's memory (``map_image``; no copy). A task that produces a new image gets a *fresh*
object (``output_key``, recoverable by ``return_to``), written with one copy, and the input is
destroyed once that object is written. Whatever fails, the object that holds the image is left
intact and is then kept (``keep``) or handed back to ``return_to``, so the scheduler can retry or
clean up.

The mapped input pins the object (no transfer or destroy while it lives), so the worker drops
every reference it holds — the task's own frames in a traceback included — before it hands the
object on. A task that keeps its input beyond its call (or runs on after a timeout) leaves the
object pinned: it is then not handed back, and comes back to its recovery container when this
worker exits.
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import suppress

from PIL import Image

import cdi
from orchestrator.errors import InputMissing, InvalidInstruction, WorkerError
from orchestrator.messages import Instruction
from orchestrator.worker.execution import (
    EXIT_MINION_LOST,
    Execution,
    TaskCall,
    check_common,
    elapsed_ms,
)
from workflows.api import TaskSpec
from workflows.errors import InvalidImage
from workflows.imagebuf import map_image, required_size, write_image
from workflows.tracebacks import clear_frames

__all__ = ["CdiPlane"]

log = logging.getLogger(__name__)


class CdiPlane:
    """Runs ``cdi`` instructions through this worker's CDI client."""

    def __init__(self, client: cdi.Client, access_timeout_s: float) -> None:
        self.client = client
        self.access_timeout_s = access_timeout_s

    def run(self, ins: Instruction, call: TaskCall, exe: Execution) -> None:
        held: cdi.CDIObject | None = None  # the object holding the image now
        view: memoryview | None = None  # the input's memory while the task reads it
        output: cdi.CDIObject | None = None
        try:
            _check(ins)
            spec = call.load()
            held = self._use(ins.key)
            view = self._access(held)
            output = self._run_on(held, view, ins, call, spec, exe)
        except Exception as exc:
            clear_frames(exc)  # its frames hold the mapped input: they must not pin the object
            exe.fail(exc)
            if isinstance(exc, InputMissing):
                held = None  # nothing to keep or hand back
            elif held is None:
                held = self._find(ins.key)
        if view is not None:
            _release(view)
        if output is not None and held is not None:
            try:
                self._destroy_input(held)
            except cdi.MinionUnavailable as exc:
                exe.fail(exc)
            held = output
        self._settle(ins, held, exe)

    # ------------------------------------------------------------------ steps
    def _use(self, key: str) -> cdi.CDIObject:
        # No round trip to check the key: access() is the next call and reports a missing one.
        return self.client.use(key, check=False)

    def _access(self, obj: cdi.CDIObject) -> memoryview:
        try:
            return obj.access(timeout=self.access_timeout_s, populate=True)  # read in full
        except cdi.ObjectNotFound as exc:
            raise InputMissing(
                f"CDI object {obj.key!r} does not exist (destroyed, or its owner died with no "
                "recovery container); the scheduler must start this task from its input again"
            ) from exc
        except cdi.AccessTimeout as exc:
            raise WorkerError(
                f"CDI object {obj.key!r} did not become ours ({self.client.container_id}) "
                f"within {self.access_timeout_s:g} s; the scheduler must transfer it to the "
                "worker before pushing the instruction"
            ) from exc

    def _run_on(
        self,
        held: cdi.CDIObject,
        view: memoryview,
        ins: Instruction,
        call: TaskCall,
        spec: TaskSpec,
        exe: Execution,
    ) -> cdi.CDIObject | None:
        """Run the task on the image mapped over ``view``; the output object, if it made one.
        Every reference to the mapped image is gone when this returns or raises."""
        started = time.perf_counter()
        try:
            img = map_image(view)
        except InvalidImage as exc:
            raise InvalidImage(f"CDI object {held.key!r} holds no readable image: {exc}") from exc
        exe.bytes_in = required_size(img.width, img.height, img.mode)
        exe.read_ms = elapsed_ms(started)
        new_img = call.run(spec, img, exe)
        del img
        if new_img is None:
            return None
        return self._write_output(ins, new_img, exe)

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
        exe.key = held.key if held is not None else ins.key
        exe.kept = False
        if held is None:
            return
        # A worker about to exit gives everything back: what it kept would die with it. A
        # failed task gives it back too, so the scheduler can retry elsewhere or clean up.
        if ins.keep and not exe.exit_code and exe.status == "COMPLETED":
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


def _release(view: memoryview) -> None:
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
    if not isinstance(ins.key, str) or not ins.key:
        raise InvalidInstruction(f"instruction {ins.task_run_id} (cdi plane) names no key")
    if ins.output_key and ins.output_key == ins.key:
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: output_key equals key ({ins.key!r}); the output "
            "must be a fresh object so the input survives a failed attempt"
        )
