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
    "DataPlane",
    "Policy",
    "ResultRetention",
    "TaskRunStatus",
    "WorkflowStatus",
]


class WorkflowStatus(enum.StrEnum):
    """Where a workflow run stands: PENDING until a scheduler claims it, then RUNNING, then
    one of the three finished states, which never change again."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        """True for the terminal states, which never change again."""
        return self in _FINISHED


_FINISHED: Final = frozenset(
    {WorkflowStatus.COMPLETED, WorkflowStatus.FAILED, WorkflowStatus.CANCELLED}
)


class TaskRunStatus(enum.StrEnum):
    """Where one attempt of one step stands. A worker's report ends it as COMPLETED, FAILED
    or TIMED_OUT; the scheduler marks a lost one FAILED, a cancelled run's queued ones
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


class ResultRetention(enum.StrEnum):
    """What pruning a run does to its results in S3 (``orchestrator.retention``)."""

    KEEP = "keep"  # the objects stay; only the run's rows go
    DELETE = "delete"  # the run's result objects go with its rows
