"""Every error the ``workflows`` package raises, as one tree.

Callers catch ``WorkflowsError`` (or a branch of it) and get a message a person can act on.

    WorkflowsError
    ├── InvalidImage            bytes that are not a usable image, a bad buffer header,
    │                           or a decompression bomb                     (also ValueError)
    ├── InvalidVideo            a file that is not a readable video, a frame of the wrong
    │                           size for its video, a bad frame message     (also ValueError)
    ├── InvalidData             a value no data kind can carry (image, array, bytes, JSON),
    │                           or an object that does not hold its kind    (also ValueError)
    ├── ResultTooLarge          a task's result image does not fit the buffer; carries
    │                           ``needed``/``available`` bytes and the computed result
    ├── InvalidDefinition       a workflow or task definition with problems; carries the
    │                           full ``problems`` list                      (also ValueError)
    └── TaskError               a problem with one task
        ├── TaskLoadError       the task's module exists but cannot be used (import raised)
        │   ├── TaskNotFound    no registered task, module or attribute by that name
        │   │                                                               (also LookupError)
        │   └── TaskNotAllowed  a module outside the deployed task packages, or a callable
        │                       without ``@task`` (``builtins:print``, ``os:system``)
        ├── DuplicateTask       two different functions registered under one name
        ├── NeedsImage          a task that needs pixels in a workflow started without an image
        ├── InputsMismatch      a step's named inputs do not fit its function's parameters
        ├── InvalidTaskResult   the function returned something other than a ``TaskResult``,
        │                       an image or ``None``, or an output that is not JSON
        └── TaskFailed          the task function raised; the original is ``__cause__``

Programming mistakes in the caller (a read-only buffer, an unknown encode format) raise the
built-in ``TypeError``/``ValueError`` instead: they are bugs to fix, not conditions to handle.

Each class carries a stable ``code`` string so a runner can report it over the wire;
``error_from_code`` turns it back into the class.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DuplicateTask",
    "InputsMismatch",
    "InvalidData",
    "InvalidDefinition",
    "InvalidImage",
    "InvalidTaskResult",
    "InvalidVideo",
    "NeedsImage",
    "ResultTooLarge",
    "TaskError",
    "TaskFailed",
    "TaskLoadError",
    "TaskNotAllowed",
    "TaskNotFound",
    "WorkflowsError",
    "error_from_code",
]


class WorkflowsError(Exception):
    """Base of every error raised by the ``workflows`` package."""

    code = "workflows_error"


class InvalidImage(WorkflowsError, ValueError):
    """The bytes or buffer do not hold an image this package can use."""

    code = "invalid_image"


class InvalidVideo(WorkflowsError, ValueError):
    """The file is not a video this package can read, or a frame does not fit its video."""

    code = "invalid_video"


class InvalidData(WorkflowsError, ValueError):
    """A value none of the data kinds can carry, or an object that does not hold its kind."""

    code = "invalid_data"


class ResultTooLarge(WorkflowsError):
    """The result image needs more bytes than the buffer has.

    ``needed`` is the exact buffer size to allocate; ``image`` and ``output`` hold the computed
    result (when known) so the caller can grow the buffer and retry only the write, without
    running the task again.
    """

    code = "result_too_large"

    def __init__(
        self,
        needed: int,
        available: int,
        *,
        image: Any = None,
        output: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            f"result image needs a buffer of {needed} bytes but the buffer has {available}; "
            f"resize the buffer to at least {needed} bytes and write the result again"
        )
        self.needed = needed
        self.available = available
        self.image = image  # PIL.Image.Image | None; Any keeps this module free of Pillow
        self.output: dict[str, Any] = output if output is not None else {}


class InvalidDefinition(WorkflowsError, ValueError):
    """A workflow or task definition is not valid; ``problems`` lists every issue found."""

    code = "invalid_definition"

    def __init__(self, problems: list[str], what: str = "definition") -> None:
        self.problems = list(problems)
        listed = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid {what} ({len(self.problems)} problem(s)):\n{listed}")


class TaskError(WorkflowsError):
    """A problem with one task."""

    code = "task_error"


class TaskLoadError(TaskError):
    """A task's module or attribute exists but cannot be used as a task."""

    code = "task_load_error"


class TaskNotFound(TaskLoadError, LookupError):
    """No registered task, module or module attribute has that name."""

    code = "task_not_found"


class TaskNotAllowed(TaskLoadError):
    """The task path names a module the operator did not deploy tasks in, or a callable that
    is not an ``@task`` function; a retry cannot help."""

    code = "task_not_allowed"


class DuplicateTask(TaskError):
    """A different function is already registered under that task name."""

    code = "duplicate_task"


class NeedsImage(TaskError):
    """A task that needs an image was given none (a dataless workflow); a retry cannot help."""

    code = "needs_image"


class InputsMismatch(TaskError):
    """A step's named inputs do not fit its function's parameters (a required parameter has
    no input, or an input no parameter); a retry cannot help."""

    code = "inputs_mismatch"


class InvalidTaskResult(TaskError):
    """A task function returned something the runner cannot use."""

    code = "invalid_task_result"


class TaskFailed(TaskError):
    """A task function raised; the original exception is chained as ``__cause__``."""

    code = "task_failed"

    def __init__(self, message: str, *, task: str = "", attempt: int = 0) -> None:
        super().__init__(message)
        self.task = task
        self.attempt = attempt


# Only classes that a bare message can rebuild; the others come back as ``WorkflowsError``.
_BY_CODE: dict[str, type[WorkflowsError]] = {
    cls.code: cls
    for cls in (
        WorkflowsError,
        InvalidImage,
        InvalidVideo,
        InvalidData,
        TaskError,
        TaskLoadError,
        TaskNotFound,
        TaskNotAllowed,
        DuplicateTask,
        InputsMismatch,
        InvalidTaskResult,
        TaskFailed,
    )
}


def error_from_code(code: str, message: str) -> WorkflowsError:
    """Rebuild an error reported as ``code``; unknown codes become ``WorkflowsError``.

    ``ResultTooLarge`` and ``InvalidDefinition`` carry structured fields that a message cannot
    restore, so they also come back as ``WorkflowsError`` (with the message intact).
    """
    return _BY_CODE.get(code, WorkflowsError)(message)
