"""The Conductor peer's workers: the conductor-python SDK polling the three image tasks.

    python -m loadtest.systems.conductor_worker API_URL THREADS   # what ConductorSystem starts

Each task GETs its input from S3, decodes it, runs one operation, encodes its output
(``pipeline_ops.store_step``: the run's intermediate format between tasks, the benchmark's
result format for the last) and PUTs it, as Celery's tasks and cdiflow's object-store plane
do; it returns the output URI, the labels so far and ``stored_at``, the moment its PUT
returned. S3 settings come from the environment (``S3_ENDPOINT_URL`` and friends).

No ``from __future__ import annotations`` here: the SDK passes the whole ``Task`` only to a
function whose parameter is annotated with the ``Task`` class itself, not a string.
"""

import signal
import sys
from typing import Any, Final

from conductor.client.automator.task_handler import TaskHandler  # type: ignore[import-untyped]
from conductor.client.configuration.configuration import (  # type: ignore[import-untyped]
    Configuration,
)
from conductor.client.http.models.task import Task  # type: ignore[import-untyped]
from conductor.client.worker.worker import Worker  # type: ignore[import-untyped]

from loadtest.pipeline_ops import DEFAULT_INTERMEDIATE, s3_step

__all__ = ["POLL_INTERVAL_MS", "PREFIX", "classify", "deblur", "denoise", "main"]

PREFIX: Final = "conductor/"  # every object this peer writes, cleared between points
# The SDK's default is 100 ms between polls of an empty queue; its polls are long polls
# (the server holds them up to 100 ms), so a short interval costs little when idle.
POLL_INTERVAL_MS: Final = 10


def _image_op(op: str, task: Task) -> dict[str, Any]:
    data: dict[str, Any] = task.input_data
    return s3_step(
        PREFIX,
        op,
        str(data["source"]),
        workflow_id=str(data["workflow_id"]),
        step=int(data["step"]),
        last=bool(data["last"]),
        intermediate=str(data.get("intermediate") or DEFAULT_INTERMEDIATE),
        carried=data,
    )


def deblur(task: Task) -> dict[str, Any]:
    return _image_op("deblur", task)


def denoise(task: Task) -> dict[str, Any]:
    return _image_op("denoise", task)


def classify(task: Task) -> dict[str, Any]:
    return _image_op("classify", task)


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    api_url, threads = argv[0], int(argv[1])
    # The SDK runs one process per task type, each executing up to ``threads`` tasks at once
    # in a thread pool. With ``threads`` = the benchmark's worker count (2 on 2 cores), any
    # single stage can use every core, as Celery's 2 processes can; the three stages
    # together may run more tasks than cores, which only time-shares CPU-bound Pillow work.
    workers = [
        Worker(op.__name__, op, poll_interval=POLL_INTERVAL_MS, thread_count=threads)
        for op in (deblur, denoise, classify)
    ]
    handler = TaskHandler(
        workers=workers,
        configuration=Configuration(server_api_url=api_url),
        scan_for_annotated_workers=False,
        monitor_processes=False,  # a crashed worker shows as failed workflows, not restarts
    )
    signal.signal(signal.SIGTERM, _stop)  # unwind: stop_processes ends the SDK's children
    try:
        handler.start_processes()
        handler.join_processes()
    finally:
        handler.stop_processes()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
