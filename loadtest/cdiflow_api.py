"""What the benchmarks say to cdiflow's API, through ``cdiflow.client``: each benchmarked
system's policy and data plane, starting and following its runs, registering what they run,
and reading the task runs of a window.

The load test's simulated users talk to the API through locust's own HTTP sessions
(``loadtest.locustfile``), whose requests locust times; they share the words here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol, TypeVar

from cdiflow.client import Client, Conflict, InvalidRequest, NotFound
from cdiflow.client.models import TaskRunInWorkflow, Workflow, WorkflowDetail, has_ended
from loadtest.images import chain_definition
from loadtest.pipeline_ops import RESULT_FORMAT
from orchestrator.contract.vocabulary import WorkflowStatus

__all__ = [
    "FINISHED",
    "LONG_POLL_S",
    "SYSTEM_MODES",
    "connect",
    "ensure_chain",
    "ensure_definition",
    "ensure_noop_chain",
    "ensure_task",
    "latency_ms",
    "run",
    "stamp",
    "start",
    "task_runs_within",
    "unix",
    "wait_all",
    "while_busy",
]

FINISHED: Final = frozenset(str(s) for s in WorkflowStatus if s.finished)

# Benchmark system name -> (policy, data plane) of the workflow request. The object-store
# baseline places by load ("transfer"), like the shared task queue of an Orkes/Conductor worker.
SYSTEM_MODES: Final[dict[str, tuple[str, str]]] = {
    "affinity": ("affinity", "cdi"),
    "transfer": ("transfer", "cdi"),
    "auto": ("auto", "cdi"),
    "object-store": ("transfer", "object-store"),
}

LONG_POLL_S: Final = 55.0  # how long one request waits for a workflow's end (the API allows 60 s)
TASK_RUNS_PAGE: Final = 1000  # task runs per request (the API's largest page)
WAIT_S: Final = 300.0  # the longest a benchmark waits for one run


class _Reply(Protocol):
    @property
    def status_code(self) -> int | None: ...

    @property
    def headers(self) -> Mapping[str, object] | None: ...


R = TypeVar("R", bound=_Reply)


def while_busy(send: Callable[[], R]) -> R:
    """``send()``'s reply, sent again after the API's ``Retry-After`` (whole seconds; 1 if it
    gives none) while it answers 429: at capacity, it did nothing with the request. What
    cdiflow's own client does, for the load tests' users (thousands may start at once)."""
    while True:
        reply = send()
        if reply.status_code != 429:
            return reply
        wait = str((reply.headers or {}).get("Retry-After") or "1").strip()
        time.sleep(float(wait) if wait.isdigit() else 1.0)


def stamp(text: str) -> float:
    """Unix seconds of one of the API's ISO 8601 timestamps (as JSON has it)."""
    return datetime.fromisoformat(text).timestamp()


def unix(moment: datetime | None) -> float:
    """Unix seconds of a moment the client read; ``ValueError`` when there is none (the run
    or step never got that far)."""
    if moment is None:
        raise ValueError("no such moment: the run or step did not get that far")
    return moment.timestamp()


def latency_ms(detail: WorkflowDetail) -> float:
    """An ended run's latency (ms), from its creation to its end."""
    return (unix(detail.finished_at) - unix(detail.created_at)) * 1000


def connect(api_url: str, api_key: str) -> Client:
    """A client of the stack at ``api_url`` with ``api_key`` (an operator's to run workflows;
    an admin's to register them too)."""
    return Client(api_url, api_key=api_key)


def start(
    api: Client, workflow: str, image: str | None, system: str, *, wait_s: float = 0.0
) -> Workflow:
    """Start ``workflow`` on ``image`` (``None``: a dataless run) the way ``system`` runs."""
    policy, plane = SYSTEM_MODES[system]
    result_format = RESULT_FORMAT if image else None
    return api.start(workflow, image, policy=policy, data_plane=plane,
                     result_format=result_format, wait_s=wait_s)  # fmt: skip


def run(api: Client, workflow: str, image: str | None, system: str) -> WorkflowDetail:
    """Start a workflow and wait for its end in one request, as a client that wants the result
    does (the API does nothing more while the run runs); a longer run is waited for."""
    started = start(api, workflow, image, system, wait_s=LONG_POLL_S)
    if isinstance(started, WorkflowDetail) and has_ended(started.status):
        return started
    return api.wait(started.id, WAIT_S)


def wait_all(api: Client, ids: Iterable[str]) -> dict[str, WorkflowDetail]:
    """Each run's detail once it has ended (long polls, no polling)."""
    return {workflow_id: api.wait(workflow_id, WAIT_S) for workflow_id in dict.fromkeys(ids)}


def task_runs_within(api: Client, since: float, until: float) -> list[TaskRunInWorkflow]:
    """Every task run that ran, at least in part, within ``[since, until]`` (Unix s), page by
    page."""
    after, before = datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC)
    runs: list[TaskRunInWorkflow] = []
    while True:
        page = api.task_runs(after, before, after_id=runs[-1].id if runs else 0,
                             limit=TASK_RUNS_PAGE)  # fmt: skip
        runs += page
        if len(page) < TASK_RUNS_PAGE:
            return runs


def ensure_definition(api: Client, definition: dict[str, Any]) -> str:
    """Register a workflow definition unless one of its name exists; return the name."""
    name = str(definition["name"])
    try:
        api.definition(name)
    except NotFound:
        with contextlib.suppress(Conflict):  # registered meanwhile
            api.apply_definition(definition, create=True)
    return name


def ensure_chain(api: Client, tasks: int) -> str:
    """Register the n-task pipeline unless it exists; return its workflow name."""
    return ensure_definition(api, chain_definition(tasks))


def ensure_noop_chain(api: Client, tasks: int) -> str:
    """Register ``noop_chain_<n>`` (n no-op steps in a row) unless it exists."""
    steps = [
        {"ref": f"noop{i}", "task": "noop", "depends_on": [f"noop{i - 1}"] if i else []}
        for i in range(tasks)
    ]
    return ensure_definition(api, {"name": f"noop_chain_{tasks}", "tasks": steps})


def ensure_task(api: Client, name: str, module: str, timeout: float = 30.0) -> None:
    """Register (or replace) task ``name`` as ``module``; while no live worker has announced
    it yet (``InvalidRequest``), ask again, for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            api.register_task(name, module)
            return
        except InvalidRequest:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)
