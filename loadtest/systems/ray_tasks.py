"""The Ray peer's tasks: each image operation is one call of a remote function.

A workflow is a chain of calls, each given the previous call's ``ObjectRef``. The first GETs
the JPEG from S3 and decodes it; between tasks the decoded pixels travel as a NumPy array
through Ray's shared-memory object store (read zero-copy by the next task); the last encodes
the result (``pipeline_ops.store_step``: the benchmark's result format) and PUTs it,
returning ``stored_at``, the moment its PUT returned, as Celery's last task does. A module
of its own so workers import it by name (the driver runs as ``__main__``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Final

import numpy as np
import ray
from PIL import Image

from loadtest.pipeline_ops import (
    load_image,
    prepare_worker_process,
    store_step,
    task_store,
    timed_op,
)

__all__ = ["PREFIX", "image_step", "submit_chain"]

PREFIX: Final = "ray/"  # every object this peer writes, cleared between points


def _step(
    source: str | dict[str, Any], op: str, workflow_id: str, step: int, last: bool
) -> dict[str, Any]:
    """``source``: the input URI (first step) or the previous step's value."""
    prepare_worker_process()
    if isinstance(source, str):
        img = load_image(source)
        outputs: dict[str, Any] = {}
        carried = 0.0
    else:
        img = Image.fromarray(source["pixels"])  # a read-only view of the shared memory
        outputs = dict(source["outputs"])
        carried = float(source["ops_cpu_ms"])
    img, output, cpu_ms = timed_op(op, img, workflow_id, carried)
    outputs.update(output)
    if not last:
        return {"pixels": np.asarray(img), "outputs": outputs, "ops_cpu_ms": cpu_ms}
    uri = store_step(task_store(), f"{PREFIX}results/{workflow_id}", img, last=True)
    return {
        "uri": uri,
        "outputs": outputs,
        "stored_at": time.time(),
        "step": step,
        "ops_cpu_ms": cpu_ms,
    }


# No retries: a failed task fails its workflow, as in the other systems' benchmark runs.
image_step = ray.remote(max_retries=0)(_step)


def submit_chain(ops: list[str], uri: str) -> ray.ObjectRef[dict[str, Any]]:
    workflow_id = uuid.uuid4().hex
    ref: Any = uri
    for i, op in enumerate(ops):
        ref = image_step.remote(ref, op, workflow_id, i, i == len(ops) - 1)
    return ref  # type: ignore[no-any-return]
