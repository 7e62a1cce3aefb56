"""What the controller, the scheduler and the workers agree on, and all they share besides the
database (``orchestrator.db``).

The roles never import each other. They meet in Postgres (the truth, through ``db``) and in
Redis, through what this package defines:

* ``keys``: every Redis key and the heartbeat's fields;
* ``messages``: the ``Instruction`` a scheduler sends a worker and the ``Report`` it gets back;
* ``wakeups``: the scheduler's wake-ups and the announcement that a workflow ended;
* ``vocabulary``: the enums for statuses, policies and data planes, used by the tables, the
  messages, the REST API and the code alike;
* ``alive``: the stamp a scheduler or worker renews as its loop turns, which its supervisor (the
  stack, or a Kubernetes liveness probe) watches.

``wakeups`` (and with it redis-py) is imported when one of its names is first asked for:
the API's clients read the vocabulary through ``orchestrator.schemas`` and talk no Redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from orchestrator.contract import keys
from orchestrator.contract.messages import Instruction, Report
from orchestrator.contract.vocabulary import (
    CHOSEN_PLANES,
    DataPlane,
    Policy,
    TaskRunStatus,
    WorkflowStatus,
)

if TYPE_CHECKING:
    from orchestrator.contract.wakeups import (
        SCHEDULES,
        announce_finished,
        read_wake,
        wake_for_starts,
        wake_scheduler,
    )

__all__ = [
    "CHOSEN_PLANES",
    "SCHEDULES",
    "DataPlane",
    "Instruction",
    "Policy",
    "Report",
    "TaskRunStatus",
    "WorkflowStatus",
    "announce_finished",
    "keys",
    "read_wake",
    "wake_for_starts",
    "wake_scheduler",
]

_WAKEUPS: Final = frozenset({"SCHEDULES", "announce_finished", "read_wake", "wake_scheduler",
                             "wake_for_starts"})  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _WAKEUPS:
        from orchestrator.contract import wakeups

        return getattr(wakeups, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
