"""The Celery baseline: the image operations as a chain of tasks, each via S3.

    celery -A loadtest.systems.celery_app worker -c 2      # what CelerySystem starts

Broker and result backend are Redis (``LOADTEST_CELERY_BROKER``, ``LOADTEST_CELERY_BACKEND``);
S3 is reached as cdiflow's workers reach it (``S3_ENDPOINT_URL`` and friends, through
``orchestrator.objectstore.ObjectStore``). Each task GETs its input, decodes it, runs one
operation, encodes its output in the run's intermediate format and PUTs it, exactly like
cdiflow's object-store plane; the chain passes the output URI on. The last task returns
``stored_at``, the moment its PUT returned: the same "result stored" instant cdiflow stamps
as ``finished_at``.

Configured as Celery's documentation advises for long, CPU-bound tasks: a prefork pool of one
process per core (fair scheduling, the default), ``worker_prefetch_multiplier=1`` (no
process holds a task it cannot start), JSON serialisation and the Redis result backend.
"""

from __future__ import annotations

import os
from typing import Any, Final

from celery import Celery, chain  # type: ignore[import-untyped]

from loadtest.pipeline_ops import DEFAULT_INTERMEDIATE, s3_step

__all__ = ["PREFIX", "app", "image_op", "make_app", "ping", "workflow_signature"]

PREFIX: Final = "celery/"  # every object this baseline writes, cleared between points


def make_app(broker: str, backend: str) -> Celery:
    celery = Celery("loadtest", broker=broker, backend=backend, set_as_current=False)
    celery.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # One task at a time per process: a prefetched image task would wait behind another.
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        result_expires=3600,
    )
    return celery


app = make_app(
    os.environ.get("LOADTEST_CELERY_BROKER", "redis://127.0.0.1:6379/14"),
    os.environ.get("LOADTEST_CELERY_BACKEND", "redis://127.0.0.1:6379/15"),
)


def _ping() -> str:
    return "pong"


def _image_op(
    previous: dict[str, Any] | None,
    op: str,
    workflow_id: str,
    step: int,
    last: bool,
    input_uri: str | None = None,
    intermediate: str = DEFAULT_INTERMEDIATE,
) -> dict[str, Any]:
    """One step: ``previous`` is the prior step's return value (None for the first)."""
    source = str(input_uri if previous is None else previous["uri"])
    return s3_step(
        PREFIX, op, source, workflow_id=workflow_id, step=step, last=last,
        intermediate=intermediate, carried=previous,
    )  # fmt: skip


# Registered without decorator syntax: Celery is untyped, and a decorator would erase the
# functions' signatures for the type checker.
ping: Any = app.task(name="loadtest.ping")(_ping)
image_op: Any = app.task(name="loadtest.image_op")(_image_op)


def workflow_signature(
    ops: list[str], workflow_id: str, input_uri: str, intermediate: str = DEFAULT_INTERMEDIATE
) -> Any:
    """The chain for one workflow; ``.apply_async()`` starts it."""
    steps = [
        image_op.s(None, op, workflow_id, i, i == len(ops) - 1, input_uri, intermediate)
        if i == 0
        else image_op.s(op, workflow_id, i, i == len(ops) - 1, None, intermediate)
        for i, op in enumerate(ops)
    ]
    return chain(*steps)
