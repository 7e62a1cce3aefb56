"""Every error the client raises, as one tree; API errors are mapped from the API's codes.

    CdiflowError
    ├── ConfigError           no usable API address or key, or a bad argument to a call
    │                         (also ValueError)
    ├── TransportError        the API could not be reached, or stopped answering
    ├── APIError              the API answered with an error: ``status``, ``code``, ``detail``,
    │   │                     ``problems`` (every issue, with a 422) and ``known`` (valid names,
    │   │                     with a 404)
    │   ├── Unauthorized      401: no API key, or a wrong one
    │   ├── Forbidden         403: the key may not do this
    │   ├── NotFound          404: no such task, workflow definition, version or run
    │   │                     (also LookupError)
    │   ├── Conflict          409: clashes with the current state (a name taken, a run that has
    │   │                     finished or not yet, a definition still in use)
    │   ├── RequestTooLarge   413: a body or an upload over the API's limit
    │   ├── InvalidRequest    400, 415 or 422: content the API does not accept (also
    │   │                     ValueError; 415: an upload of a type the operator does not take)
    │   ├── TooManyRequests   429 for longer than the client's ``busy_timeout``: the API is at
    │   │                     capacity; ``retry_after_s`` says when it asked to be tried again
    │   └── ServiceUnavailable  503: Postgres, Redis, S3 or the CDI controller is not answering
    ├── WaitTimeout           a wait ended before the run did (also TimeoutError)
    └── WorkflowFailed        a run that had to complete ended FAILED, CANCELLED or TIMED_OUT;
                              ``workflow`` is its detail, ``traceback`` its failing task's

The messages are the API's own (which say what to change) or say what to check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from cdiflow.client.models import TaskRun, WorkflowDetail

__all__ = [
    "APIError",
    "CdiflowError",
    "ConfigError",
    "Conflict",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "RequestTooLarge",
    "ServiceUnavailable",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "WaitTimeout",
    "WorkflowFailed",
    "api_error",
    "describe_attempt",
    "failed_task",
]


class CdiflowError(Exception):
    """Base of every error the client raises."""


class ConfigError(CdiflowError, ValueError):
    """No usable API address or key, or an argument the client cannot use."""


class TransportError(CdiflowError):
    """The API could not be reached, or stopped answering mid-request."""


class APIError(CdiflowError):
    """The API answered with an error status."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        code: str = "",
        problems: list[str] | None = None,
        known: list[str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.problems = list(problems or [])
        self.known = list(known or [])

    def __str__(self) -> str:
        return f"{self.detail} (HTTP {self.status})"


class Unauthorized(APIError):
    """401: the API wants an API key (``api_key=`` or ``$CDIFLOW_API_KEY``; a local stack's is
    found in its data folder), or another one."""

    def __str__(self) -> str:
        return (
            f"{self.detail} (HTTP 401): pass an API key (api_key=, --api-key or "
            "$CDIFLOW_API_KEY; `cdiflow status --json` shows a local stack's as api_key)"
        )


class Forbidden(APIError):
    """403: the API key may not do this."""


class NotFound(APIError, LookupError):
    """404: no such task, workflow definition, version or run; ``known`` lists valid names."""


class Conflict(APIError):
    """409: the request clashes with the current state."""


class RequestTooLarge(APIError):
    """413: a request body or an upload over the API's limit."""


class InvalidRequest(APIError, ValueError):
    """400, 415 or 422: content the API does not accept; ``problems`` lists every issue."""


class TooManyRequests(APIError):
    """429: the API is at capacity. The client sends a request again after the ``Retry-After``
    the API gives, for up to its ``busy_timeout``; this is raised once that has run out (or
    at once with ``busy_timeout=0``). ``retry_after_s``: the API's last ``Retry-After``."""

    retry_after_s: float = 0.0


class ServiceUnavailable(APIError):
    """503: a service behind the API is not answering; try again shortly."""


class WaitTimeout(CdiflowError, TimeoutError):
    """A wait ended before the run did; the run goes on."""

    def __init__(self, workflow_id: str, waited_s: float) -> None:
        super().__init__(
            f"workflow run {workflow_id} had not finished after {waited_s:g} s; it goes on "
            "running: wait again, or look at it with get()"
        )
        self.workflow_id = workflow_id


class WorkflowFailed(CdiflowError):
    """A run that had to complete ended FAILED, CANCELLED or TIMED_OUT; ``workflow`` is its
    detail, ``traceback`` where its failing task's code raised ("" when no task's code did),
    and the message ends with that traceback."""

    def __init__(self, workflow: WorkflowDetail) -> None:
        reason = f": {workflow.error}" if workflow.error else ""
        failed = failed_task(workflow)
        self.traceback = failed.traceback if failed is not None and failed.traceback else ""
        where = ""
        if failed is not None and self.traceback:
            where = f"\n\n{describe_attempt(failed)} raised:\n{self.traceback.rstrip()}"
        super().__init__(f"workflow run {workflow.id} ended {workflow.status}{reason}{where}")
        self.workflow = workflow


def failed_task(workflow: WorkflowDetail) -> TaskRun | None:
    """The task run that ended ``workflow`` without success: the latest that did not complete
    and says where its code was (a traceback), else the latest that did not complete."""
    unfinished = [r for r in workflow.task_runs if r.status not in ("COMPLETED", "SKIPPED")]
    with_traceback = [r for r in unfinished if r.traceback]
    chosen = with_traceback or unfinished
    return max(chosen, key=lambda r: r.id) if chosen else None


def describe_attempt(run: TaskRun) -> str:
    """``step 'deblur' (task deblur, attempt 2 on worker-1)``."""
    where = f" on {run.worker_id}" if run.worker_id else ""
    return f"step {run.ref!r} (task {run.task}, attempt {run.attempt}{where})"


# The API's stable error codes (``orchestrator.errors``), then the status for anything else.
_BY_CODE: Final[dict[str, type[APIError]]] = {
    "not_found": NotFound,
    "conflict": Conflict,
    "request_too_large": RequestTooLarge,
    "invalid_request": InvalidRequest,
    "invalid_definition": InvalidRequest,
    "unsupported_type": InvalidRequest,
    "overloaded": TooManyRequests,
    "service": ServiceUnavailable,
}
_BY_STATUS: Final[dict[int, type[APIError]]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: RequestTooLarge,
    415: InvalidRequest,
    422: InvalidRequest,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


def api_error(status: int, body: Any, fallback: str) -> APIError:
    """The error for an error response: its JSON ``body`` (the API's ``{detail, code,
    problems, known}``, or FastAPI's validation list) or ``fallback`` for a body it is not."""
    detail, code, problems, known = fallback, "", [], []
    if isinstance(body, dict):
        raw = body.get("detail")
        if isinstance(raw, str):
            detail = raw
        elif isinstance(raw, list):  # FastAPI's own 422: [{loc, msg}, ...]
            problems = [_validation_problem(item) for item in raw]
            detail = "the request is not valid: " + "; ".join(problems)
        code = str(body.get("code") or "")
        problems = [str(p) for p in body.get("problems") or []] or problems
        known = [str(k) for k in body.get("known") or []]
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, APIError)
    return cls(status, detail, code=code, problems=problems, known=known)


def _validation_problem(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(p) for p in item.get("loc", []) if p != "body")
    message = str(item.get("msg", "invalid"))
    return f"{where}: {message}" if where else message
