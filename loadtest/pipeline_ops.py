"""The benchmark's image operations outside cdiflow: the floor, and the peers' tasks.

Every system runs the very functions cdiflow's workers run (``workflows.image_tasks``) through
``run_task_on_image``, so pixels and labels are identical and only the orchestration differs.
The systems that move images through S3 between tasks (cdiflow's object-store plane, Celery,
Conductor, Temporal) store them in the run's intermediate format (``INTERMEDIATE_FORMATS``;
``raw``, an uncompressed TIFF, by default: the cheapest lossless way).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Final, NamedTuple

from PIL import Image

from orchestrator.objectstore import ObjectStore
from orchestrator.settings import Settings, load_settings
from workflows import image_tasks
from workflows.api import TaskContext, TaskFunction, run_task_on_image
from workflows.imagebuf import RESULT_FORMATS, decode_bytes, encode_image, normalize_mode
from workflows.memory import tune_for_images

__all__ = [
    "DEFAULT_INTERMEDIATE",
    "INTERMEDIATE_FORMATS",
    "OPS",
    "RESULT_FORMAT",
    "FloorRun",
    "apply_op",
    "floor_job",
    "floor_s3_job",
    "load_image",
    "prepare_worker_process",
    "s3_step",
    "store_step",
    "task_store",
    "timed_op",
]

# Every system stores its result image in this format (``workflows.imagebuf.RESULT_FORMATS``).
# *Why JPEG:* photos in, photos out; a lossless PNG of a 6.5-megapixel result costs more CPU
# as the three image tasks together (`cdiflow bench images`), which would bury
# every system's orchestration under an encode the floor does not do.
RESULT_FORMAT: Final = "jpeg"

# How the systems that pass images through S3 store them between tasks. *Why raw by default:*
# a PNG of a 6.6-megapixel photo costs more CPU than the three operations; a peer's users
# would not pay that to pass pixels along, and neither does the headline comparison. ``jpeg``
# is lossy (its pixels differ from everyone else's; results are verified against their own
# reference); ``png`` is what a pipeline that archives every step might choose.
INTERMEDIATE_FORMATS: Final = ("raw", "png", "jpeg")
DEFAULT_INTERMEDIATE: Final = "raw"

OPS: Final[dict[str, TaskFunction]] = {
    "deblur": image_tasks.deblur,
    "denoise": image_tasks.denoise,
    "classify": image_tasks.classify,
}


def apply_op(
    op: str, img: Image.Image, workflow_id: str = "bench"
) -> tuple[Image.Image, dict[str, Any]]:
    """One operation as a worker runs it: ``(image after, task output)``."""
    ctx = TaskContext(task_name=op, workflow_id=workflow_id)
    new, output = run_task_on_image(OPS[op], img, ctx)
    return (new if new is not None else img), output


def timed_op(
    op: str, img: Image.Image, workflow_id: str, carried_ms: float = 0.0
) -> tuple[Image.Image, dict[str, Any], float]:
    """``apply_op`` and the operations' CPU so far: ``carried_ms`` (the earlier steps') plus
    this one's, measured as cdiflow's workers measure a task (this thread's CPU time)."""
    cpu = time.thread_time()
    img, output = apply_op(op, img, workflow_id)
    return img, output, carried_ms + (time.thread_time() - cpu) * 1000.0


@functools.cache
def _settings() -> Settings:
    return load_settings()  # the task process's environment: S3_ENDPOINT_URL and friends


@functools.cache
def task_store() -> ObjectStore:
    """The S3 client of a peer's task process (Celery, Ray, Conductor workers), made once."""
    return ObjectStore(_settings())


def load_image(uri: str) -> Image.Image:
    """GET ``uri`` and decode it within the settings' limits, as a peer's first task does."""
    limits = _settings()
    return decode_bytes(task_store().get(uri, limits.max_input_bytes), limits.max_pixels)


@functools.cache
def prepare_worker_process() -> dict[str, bool]:
    """The image memory settings of cdiflow's workers and the floor
    (``workflows.memory.tune_for_images``), once per process: every peer's task calls this
    first, so every system's workers run with the same settings."""
    return tune_for_images()


def store_step(
    store: ObjectStore,
    key_base: str,
    img: Image.Image,
    *,
    last: bool,
    intermediate: str = DEFAULT_INTERMEDIATE,
) -> str:
    """Store one step's image at ``key_base`` + extension: in ``intermediate`` between
    tasks, the benchmark's result format for the last; its S3 URI."""
    fmt = RESULT_FORMATS[RESULT_FORMAT if last else intermediate]
    uri = store.uri(key_base + fmt.extension)
    store.put(uri, encode_image(img, fmt.pillow), fmt.content_type)
    return uri


def s3_step(
    prefix: str,
    op: str,
    source: str,
    *,
    workflow_id: str,
    step: int,
    last: bool,
    intermediate: str = DEFAULT_INTERMEDIATE,
    carried: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One task of a peer that passes images through S3 (Celery, Conductor, Temporal), as
    cdiflow's object-store plane runs one: GET ``source`` and decode it, run ``op``, encode
    the image and PUT it under ``prefix`` (``results/<workflow>`` for the last step, else
    ``work/<workflow>/<step>``). Returns what the next step is given (``carried``): the
    output URI, the task outputs so far, the operations' CPU so far and ``stored_at``, the
    moment the PUT returned (the last step's is the workflow's "result stored")."""
    prepare_worker_process()
    before = carried or {}
    cpu_so_far = float(before.get("ops_cpu_ms") or 0.0)
    img, output, cpu_ms = timed_op(op, load_image(source), workflow_id, cpu_so_far)
    key = f"{prefix}results/{workflow_id}" if last else f"{prefix}work/{workflow_id}/{step}"
    uri = store_step(task_store(), key, img, last=last, intermediate=intermediate)
    outputs = {**(before.get("outputs") or {}), **output}
    return {"uri": uri, "outputs": outputs, "stored_at": time.time(), "ops_cpu_ms": cpu_ms}


class FloorRun(NamedTuple):
    """One workflow of the floor: when it started and ended (Unix s), the label the operations
    gave, and the CPU time the operations took (ms, this thread's)."""

    started: float
    finished: float
    label: str
    ops_cpu_ms: float


def floor_job(data: bytes, ops: list[str]) -> FloorRun:
    """The compute floor of one workflow: decode, then each operation, in this process.

    No S3, no result encoding: only what every system must do whatever its orchestration.
    """
    started = time.time()
    _, label, cpu_ms = _run_ops(normalize_mode(decode_bytes(data)), ops)
    return FloorRun(started, time.time(), label, cpu_ms)


def floor_s3_job(uri: str, ops: list[str], key_base: str) -> FloorRun:
    """``floor_job`` with a workflow's own I/O: GET ``uri`` and decode it, run each operation,
    encode the result in the benchmark's format and PUT it at ``key_base`` + extension.

    It ends when the result is stored: what every system does per workflow besides
    orchestrating it, so the gap between a system and this is its orchestration.
    """
    started = time.time()
    img, label, cpu_ms = _run_ops(normalize_mode(load_image(uri)), ops)
    store_step(task_store(), key_base, img, last=True)
    return FloorRun(started, time.time(), label, cpu_ms)


def _run_ops(img: Image.Image, ops: list[str]) -> tuple[Image.Image, str, float]:
    """Each operation in turn: the last image, the ``label`` the operations gave, and their
    CPU time in ms (measured as cdiflow's workers measure a task's: the thread's CPU time)."""
    output: dict[str, Any] = {}
    cpu_ms = 0.0
    for op in ops:
        img, step_output, cpu_ms = timed_op(op, img, "bench", cpu_ms)
        output.update(step_output)
    return img, str(output.get("label", "")), cpu_ms
