"""The words every part of the orchestrator uses for a workflow's state and choices.

One enum per idea, shared by the tables (``db.models``), the messages between scheduler and
workers (``contract.messages``), the REST API's schemas and the code that branches on them.
Each is a ``StrEnum``: a member equals its value (``Policy.AFFINITY == "affinity"``), so a
message read from JSON, whose fields are plain strings, compares as it should.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "CHOSEN_PLANES",
    "CatchUp",
    "DataPlane",
    "DeliveryStatus",
    "Policy",
    "TaskRunStatus",
    "WebhookEvent",
    "WorkflowStatus",
]


class WorkflowStatus(enum.StrEnum):
    """Where a workflow run stands: PENDING until a scheduler claims it, then RUNNING, then
    one of the finished states, which never change again: COMPLETED, FAILED, CANCELLED (by a
    user) or TIMED_OUT (it ran past its ``timeout_s``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"

    @property
    def finished(self) -> bool:
        """True for the terminal states, which never change again."""
        return self in _FINISHED


_FINISHED: Final = frozenset(
    {
        WorkflowStatus.COMPLETED,
        WorkflowStatus.FAILED,
        WorkflowStatus.CANCELLED,
        WorkflowStatus.TIMED_OUT,
    }
)


class TaskRunStatus(enum.StrEnum):
    """Where one attempt of one step stands. A worker's report ends it as COMPLETED, FAILED,
    TIMED_OUT (past its task's ``timeout_s``, or its run's) or CANCELLED (stopped: its run was
    cancelled or ended); the scheduler marks a lost one FAILED, an ended run's queued ones
    CANCELLED, a step on a branch a switch did not choose SKIPPED, and a switch COMPLETED."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    SKIPPED = "SKIPPED"


class Policy(enum.StrEnum):
    """Where a workflow's tasks run (docs/architecture.md, *Placement*)."""

    AFFINITY = "affinity"  # every task on one worker, which keeps the CDI ownership
    TRANSFER = "transfer"  # best worker per task; ownership moves each time
    AUTO = "auto"  # move only when the cost model says moving beats waiting


class DataPlane(enum.StrEnum):
    """How a workflow's image moves between its tasks.

    A workflow is started on ``CDI`` or ``OBJECT_STORE`` (``CHOSEN_PLANES``); ``NONE`` is the
    plane of a dataless run (started without an image), whose tasks get no image at all. The
    scheduler sends each instruction on its run's plane, and the worker picks the code that
    runs it by this value.
    """

    CDI = "cdi"  # shared CDI objects, ownership handed over
    OBJECT_STORE = "object-store"  # every task downloads from and uploads to S3
    NONE = "none"  # no image: only the tasks' JSON travels


# The planes a client may start a workflow on (the REST API accepts no other).
CHOSEN_PLANES: Final = (DataPlane.CDI, DataPlane.OBJECT_STORE)


class CatchUp(enum.StrEnum):
    """What a schedule does with ticks it missed (no scheduler ran, or one fell behind):
    ``SKIP`` runs none later than the schedule's grace, ``LATEST`` one run for the latest of
    them, ``ALL`` a run for every one (docs/architecture.md, *Schedules*)."""

    SKIP = "skip"
    LATEST = "latest"
    ALL = "all"


class WebhookEvent(enum.StrEnum):
    """What a webhook may be told of: a run's end, or a step's (each attempt's) end. The
    values are the kinds of the run's events they mirror."""

    WORKFLOW_COMPLETED = "workflow.completed"
    WORKFLOW_FAILED = "workflow.failed"
    WORKFLOW_CANCELLED = "workflow.cancelled"
    WORKFLOW_TIMED_OUT = "workflow.timed_out"
    TASK_COMPLETED = "task.completed"
    TASK_FAILED = "task.failed"
    TASK_TIMED_OUT = "task.timed_out"


class DeliveryStatus(enum.StrEnum):
    """Where one webhook delivery stands: PENDING until the receiver answers 2xx
    (DELIVERED) or its attempts are spent (FAILED)."""

    PENDING = "PENDING"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"
