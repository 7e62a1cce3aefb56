"""The ``object-store`` data plane: GET the input from S3, run, PUT the output (the baseline).

The output is PUT even when the task left the image unchanged, so the next task always finds
its input at the previous task's ``output_uri``, in the workflow's ``intermediate_format``
(``png`` or ``raw`` keep every plane's pixels identical; ``jpeg`` does not)."""

from __future__ import annotations

import time

from PIL import Image

from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane
from orchestrator.errors import InvalidInstruction, InvalidRequest
from orchestrator.objectstore import ObjectStore, parse_s3_uri
from orchestrator.worker.execution import (
    Execution,
    TaskCall,
    check_common,
    elapsed_ms,
    read_input_file,
)
from orchestrator.worker.plane_parts import PlaneParts
from workflows.binding import IMAGE
from workflows.errors import InvalidImage
from workflows.imagebuf import RESULT_FORMATS, decode_bytes, encode_image

__all__ = ["StorePlane", "check_output", "check_uri", "put_image"]


class StorePlane:
    """Runs ``object-store`` instructions; the S3 client is made on first use only."""

    def __init__(self, parts: PlaneParts) -> None:
        self._store = parts.store
        self.max_input_bytes = parts.max_input_bytes
        self.max_pixels = parts.max_pixels

    @property
    def store(self) -> ObjectStore:
        return self._store()

    def read_file(self, uri: str) -> bytes:
        """A file a task names (``TaskContext.read_file``)."""
        return read_input_file(self.store, uri, self.max_input_bytes)

    def run(self, ins: Instruction, call: TaskCall, exe: Execution) -> None:
        try:
            _check(ins)
            spec = call.load()
            started = time.perf_counter()
            data = self.store.get(ins.input_uri, self.max_input_bytes)
            try:
                img = decode_bytes(data, self.max_pixels)
            except InvalidImage as exc:
                raise InvalidImage(f"{ins.input_uri} is not a usable image: {exc}") from exc
            exe.bytes_in = len(data)
            exe.read_ms = elapsed_ms(started)
            produced = call.run(spec, {IMAGE: img}, exe, self.read_file)
            new_img = produced.image
            if set(produced.objects) - {IMAGE}:
                raise InvalidInstruction(
                    f"task {ins.task!r} returned named outputs "
                    f"({', '.join(sorted(set(produced.objects) - {IMAGE}))}); the object-store "
                    "plane carries one image between tasks: start the run on the cdi plane"
                )
            put_image(self.store, ins, new_img if new_img is not None else img, exe)
        except Exception as exc:
            exe.fail(exc)


def put_image(store: ObjectStore, ins: Instruction, img: Image.Image, exe: Execution) -> None:
    """Encode ``img`` as ``ins.output_format`` and PUT it at ``ins.output_uri``."""
    started = time.perf_counter()
    fmt = RESULT_FORMATS[ins.output_format]
    encoded = encode_image(img, fmt.pillow)
    store.put(ins.output_uri, encoded, content_type=fmt.content_type)
    exe.bytes_out = len(encoded)
    exe.write_ms = elapsed_ms(started)


def _check(ins: Instruction) -> None:
    check_common(ins)
    check_uri(ins, "input_uri", ins.input_uri, DataPlane.OBJECT_STORE)
    check_output(ins, DataPlane.OBJECT_STORE)


def check_output(ins: Instruction, plane: DataPlane) -> None:
    """Raise ``InvalidInstruction`` unless ``output_uri`` and ``output_format`` are usable."""
    if ins.output_format not in RESULT_FORMATS:
        raise InvalidInstruction(
            f"instruction {ins.task_run_id}: output_format {ins.output_format!r} is not one of "
            f"{', '.join(sorted(RESULT_FORMATS))}"
        )
    check_uri(ins, "output_uri", ins.output_uri, plane)


def check_uri(ins: Instruction, name: str, uri: str, plane: DataPlane) -> None:
    """Raise ``InvalidInstruction`` unless ``uri`` (the instruction's ``name``) is an S3 URI."""
    try:
        parse_s3_uri(uri)
    except InvalidRequest as exc:
        raise InvalidInstruction(
            f"instruction {ins.task_run_id} ({plane} plane): {name}: {exc}"
        ) from exc
