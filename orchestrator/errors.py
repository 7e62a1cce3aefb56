"""Every error the orchestrator raises on purpose, as one tree.

Callers catch ``OrchestratorError`` (or a branch of it) and get a message a person can act on:
what failed, why, and what to change (an environment variable, a log file to read).

    OrchestratorError
    ├── ConfigError       a setting or environment value is not usable      (also ValueError)
    ├── ServiceError      Postgres, Redis or S3 failed to start or is unreachable
    ├── BadHost           a request for a host name the API does not serve (HTTP 400)
    ├── Unauthenticated   a request without a valid API key (HTTP 401)
    ├── Forbidden         a key whose role may not do what it asked (HTTP 403)
    ├── NotFound          no task, workflow definition or workflow by that name or id
    │                     (also LookupError)
    ├── Conflict          the request clashes with the current state: a name already taken,
    │                     a workflow already finished, a task still used by a workflow
    ├── InvalidRequest    well-formed but unacceptable content; carries ``problems``
    │   │                 (also ValueError)
    │   ├── InvalidDefinition   a task or workflow definition with problems
    │   ├── IdempotencyKeyReused  a start whose Idempotency-Key started a run with
    │   │                         another body
    │   ├── S3NotAllowed        an S3 URI outside what the operator allows, or a key that
    │   │                       no store can hold (``..``, control characters)
    │   └── UnsupportedType     an uploaded file of a content type the operator does not
    │                           take (HTTP 415)
    ├── RequestTooLarge   a request body over the API's size limit
    ├── Overloaded        the API has more requests waiting than it can serve soon; carries
    │                     ``retry_after_s`` (HTTP 429 with Retry-After)
    ├── DataError         a workflow's data cannot be had or stored
    │   ├── InputMissing      the input object does not exist in S3
    │   ├── InputTooLarge     the input is over MAX_INPUT_BYTES
    │   └── StorageError      S3 refused or failed a read or write
    │       └── StorageUnavailable  S3 did not answer (no connection, a timeout, a 5xx):
    │                               an outage, which a later try may outlast
    ├── StackError        the local stack (``cdiflow up``) failed to start or stop a piece;
    │   │                 carries ``log_file`` when a log tells why
    │   └── StackRunning      a stack already runs from that data folder
    └── WorkerError       a worker could not run an instruction; carries ``retryable``
        ├── InvalidInstruction  an instruction that is malformed or inconsistent
        │                       (also ValueError)
        ├── TaskStopped         a task the worker stopped before it ended: its run was
        │   │                   cancelled, failed or passed its time limit; carries the
        │   │                   ``status`` to report, ``where`` it was and whether it was
        │   │                   ``stuck`` (it would not stop: the worker's process ends)
        │   └── TaskTimedOut    a task ran past its ``timeout_s``  (also TimeoutError)
        ├── HeldImageLost       the image an earlier task left in the worker is gone
        └── ObjectGone          a CDI object the instruction named does not exist (its
                                minion restarted empty): the run goes again from its input

Each class carries a stable ``code`` string for API responses and logs. Add new branches here,
and to the tree above, rather than raising bare built-in exceptions from library code.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.contract.vocabulary import TaskRunStatus

__all__ = [
    "BadHost",
    "ConfigError",
    "Conflict",
    "DataError",
    "Forbidden",
    "HeldImageLost",
    "IdempotencyKeyReused",
    "InputMissing",
    "InputTooLarge",
    "InvalidDefinition",
    "InvalidInstruction",
    "InvalidRequest",
    "NotFound",
    "ObjectGone",
    "OrchestratorError",
    "Overloaded",
    "RequestTooLarge",
    "S3NotAllowed",
    "ServiceError",
    "StackError",
    "StackRunning",
    "StorageError",
    "StorageUnavailable",
    "TaskStopped",
    "TaskTimedOut",
    "Unauthenticated",
    "UnsupportedType",
    "WorkerError",
]


class OrchestratorError(Exception):
    """Base of every error raised on purpose by the orchestrator."""

    code = "orchestrator_error"


class ConfigError(OrchestratorError, ValueError):
    """A setting or environment value is not usable."""

    code = "config"


class ServiceError(OrchestratorError):
    """A backing service (Postgres, Redis, S3) failed to start or cannot be reached.

    ``service`` names it (``"postgres"``, ``"redis"``, ``"s3"``); ``log_file`` is set when an
    embedded service wrote a log worth reading.
    """

    code = "service"

    def __init__(self, message: str, *, service: str, log_file: Path | None = None) -> None:
        super().__init__(message)
        self.service = service
        self.log_file = log_file


class BadHost(OrchestratorError):
    """The request's Host header names a host this API is not configured to serve."""

    code = "bad_host"


class Unauthenticated(OrchestratorError):
    """The request carries no API key, or one the API does not know (revoked, mistyped)."""

    code = "unauthenticated"


class Forbidden(OrchestratorError):
    """The request's key is valid but its role may not do what was asked."""

    code = "forbidden"


class NotFound(OrchestratorError, LookupError):
    """No ``kind`` (task, workflow definition, workflow) called ``key`` exists.

    ``known`` lists the valid names when there are few enough to help the caller pick one.
    """

    code = "not_found"

    def __init__(self, kind: str, key: object, *, known: Sequence[str] = ()) -> None:
        self.kind = kind
        self.key = str(key)
        self.known = list(known)
        message = f"{kind} {self.key!r} not found"
        if self.known:
            message += f"; known: {', '.join(self.known)}"
        super().__init__(message)


class Conflict(OrchestratorError):
    """The request clashes with the current state (name taken, workflow finished, ...)."""

    code = "conflict"


class InvalidRequest(OrchestratorError, ValueError):
    """A request whose content is not acceptable; ``problems`` lists every issue found."""

    code = "invalid_request"

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


class InvalidDefinition(InvalidRequest):
    """A task or workflow definition with problems (unknown task, duplicate ref, cycle...)."""

    code = "invalid_definition"

    def __init__(self, problems: Sequence[str], what: str = "definition") -> None:
        listed = "; ".join(problems)
        super().__init__(f"invalid {what} ({len(problems)} problem(s)): {listed}", problems)


class IdempotencyKeyReused(InvalidRequest):
    """A start sent with an ``Idempotency-Key`` that this caller used for a run with another
    body: a retry must send the same body, a new start a new key."""

    code = "idempotency_key_reused"

    def __init__(self, key: str, workflow_id: object) -> None:
        problem = (
            f"Idempotency-Key {key!r} already started run {workflow_id} with a different "
            "request body; retry with the same body to get that run, or use a new key for a "
            "new run"
        )
        super().__init__(problem, [problem])
        self.key = key


class S3NotAllowed(InvalidRequest):
    """An S3 URI this installation may not read or write, or one no store can hold."""

    code = "s3_not_allowed"


class UnsupportedType(InvalidRequest):
    """An uploaded file whose content type (detected from its bytes) the operator's upload
    policy (``CDIFLOW_UPLOAD_TYPES``) does not take."""

    code = "unsupported_type"


class RequestTooLarge(OrchestratorError):
    """A request body (or the ``what`` it carries) is larger than ``limit`` bytes."""

    code = "request_too_large"

    def __init__(
        self,
        limit: int,
        *,
        what: str = "request body",
        advice: str = "send a smaller body (pass large data by S3 URI, not inline)",
    ) -> None:
        super().__init__(
            f"{what} is larger than the {limit}-byte limit ({limit / 2**20:.4g} MiB); {advice}"
        )
        self.limit = limit


class Overloaded(OrchestratorError):
    """More requests wait for the API's database connections than it can serve soon: this one
    is refused at once (rather than queued until it times out), to be sent again after
    ``retry_after_s`` seconds."""

    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DataError(OrchestratorError):
    """A workflow's data cannot be read or stored."""

    code = "data_error"


class InputMissing(DataError):
    """The input object does not exist."""

    code = "input_missing"


class InputTooLarge(DataError):
    """The input is larger than the configured limit."""

    code = "input_too_large"


class StorageError(DataError):
    """S3 refused or failed a read or write."""

    code = "storage_error"


class StorageUnavailable(StorageError):
    """S3 did not answer a read or write: no connection, a timeout, or an error of its own
    (5xx) after the client's few quick tries. An outage, not a refusal: a later try may
    outlast it."""

    code = "storage_unavailable"


class StackError(OrchestratorError):
    """The local stack (``cdiflow up``) could not start or stop a piece; ``log_file`` says why."""

    code = "stack"

    def __init__(self, message: str, *, log_file: Path | None = None) -> None:
        super().__init__(message)
        self.log_file = log_file


class StackRunning(StackError):
    """A stack already runs from this data folder (one stack per folder)."""

    code = "stack_running"


class WorkerError(OrchestratorError):
    """A worker could not run an instruction as asked.

    ``retryable`` is False when another attempt with the same instruction cannot succeed.
    """

    code = "worker_error"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class InvalidInstruction(WorkerError, ValueError):
    """An instruction that is malformed or names what a worker cannot act on."""

    code = "invalid_instruction"

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class TaskStopped(WorkerError):
    """A task the worker stopped before it ended (``orchestrator.worker.stopping``): its run
    was cancelled, failed or passed its time limit. ``status`` is what its report says
    (CANCELLED or TIMED_OUT), ``where`` where the task was (a traceback, or ""), ``stuck``
    that it did not end when asked, so the worker must end the process it runs in."""

    code = "task_stopped"

    def __init__(
        self,
        message: str,
        *,
        status: TaskRunStatus,
        where: str = "",
        stuck: bool = False,
        retryable: bool = False,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.status = status
        self.where = where
        self.stuck = stuck


class TaskTimedOut(TaskStopped, TimeoutError):
    """A task function ran past its ``timeout_s`` and was stopped."""

    code = "task_timed_out"

    def __init__(self, task: str, timeout_s: float, *, where: str = "", stuck: bool = False):
        super().__init__(
            f"task {task!r} did not finish within its timeout of {timeout_s:g} s; raise "
            "timeout_s in the task definition if it is genuinely that slow",
            status=TaskRunStatus.TIMED_OUT,
            where=where,
            stuck=stuck,
            retryable=True,
        )
        self.task = task
        self.timeout_s = timeout_s


class HeldImageLost(WorkerError):
    """The image an earlier task of the workflow left in this worker's memory is not there
    (the worker restarted, or dropped it); the scheduler recomputes it from the last object."""

    code = "held_image_lost"

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class ObjectGone(WorkerError):
    """A CDI object the instruction named does not exist: its minion restarted (and came back
    empty) or the object was freed. Not the task's fault, so it costs no attempt: the
    scheduler drives the run again from its input."""

    code = "object_gone"
