"""A small synchronous client of cdiflow's REST API for the benchmarks' own bookkeeping.

The load test's simulated users talk to the API through locust (``loadtest.locustfile``);
this client starts and follows workflows for ``--quick`` and registers the n-task pipelines.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol, TypeVar

import httpx

from loadtest.images import chain_definition
from loadtest.pipeline_ops import RESULT_FORMAT

__all__ = ["FINISHED", "SYSTEM_MODES", "CdiflowApi", "stamp", "while_busy"]

FINISHED: Final = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})

# Benchmark system name -> (policy, data plane) of the workflow request. The object-store
# baseline places by load ("transfer"), like the shared task queue of an Orkes/Conductor worker.
SYSTEM_MODES: Final[dict[str, tuple[str, str]]] = {
    "affinity": ("affinity", "cdi"),
    "transfer": ("transfer", "cdi"),
    "auto": ("auto", "cdi"),
    "object-store": ("transfer", "object-store"),
}


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
    """Unix seconds of one of the API's ISO 8601 timestamps."""
    return datetime.fromisoformat(text).timestamp()


LONG_POLL_S = 55.0  # how long one request waits for a workflow's end (the API allows 60 s)
TASK_RUNS_PAGE = 1000  # task runs per request (the API's largest page)


def _body(workflow: str, image: str | None, system: str) -> dict[str, Any]:
    policy, plane = SYSTEM_MODES[system]
    return {
        "workflow": workflow,
        "input": {"image": image, "result_format": RESULT_FORMAT} if image else {},
        "policy": policy,
        "data_plane": plane,
    }


class CdiflowApi:
    """``start``, ``detail`` and ``wait`` over one HTTP connection pool (thread-safe), with
    ``api_key`` (an operator's to run workflows; an admin's to register pipelines too)."""

    def __init__(self, base_url: str, api_key: str, timeout: float = 60.0) -> None:
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout,
            limits=limits,
            headers={"Authorization": f"Bearer {api_key}"},
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CdiflowApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, workflow: str, image: str | None, system: str) -> str:
        """Start ``workflow`` on ``image`` (``None``: a dataless run) the way ``system`` runs."""
        reply = self._http.post("/api/workflows", json=_body(workflow, image, system))
        return str(reply.raise_for_status().json()["id"])

    def run(self, workflow: str, image: str | None, system: str) -> dict[str, Any]:
        """Start a workflow and wait for its end in one request (``POST …?wait_s=``), as a
        client that wants the result does: the API does nothing more while the run runs."""
        reply = self._http.post(
            "/api/workflows",
            params={"wait_s": LONG_POLL_S},
            json=_body(workflow, image, system),
            timeout=LONG_POLL_S + 30.0,
        )
        body: dict[str, Any] = reply.raise_for_status().json()
        if body["status"] in FINISHED:
            return body
        return self.wait([str(body["id"])])[str(body["id"])]

    def detail(self, workflow_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """A workflow's detail; with ``wait_s``, once it ends or that many seconds passed."""
        reply = self._http.get(
            f"/api/workflows/{workflow_id}",
            params={"events": 0, "wait_s": wait_s},
            timeout=wait_s + 30.0,
        )
        body: dict[str, Any] = reply.raise_for_status().json()
        return body

    def wait(self, ids: Iterable[str], timeout: float = 300.0) -> dict[str, dict[str, Any]]:
        """Details of every workflow once finished, by the API's long poll (no polling)."""
        done: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        for workflow_id in dict.fromkeys(ids):
            while True:
                left = deadline - time.monotonic()
                body = self.detail(workflow_id, wait_s=max(0.0, min(LONG_POLL_S, left)))
                if body["status"] in FINISHED:
                    done[workflow_id] = body
                    break
                if left <= 0:
                    raise TimeoutError(f"workflow {workflow_id} not finished in {timeout:g} s")
        return done

    def task_runs_within(self, since: float, until: float) -> list[dict[str, Any]]:
        """Every task run that ran, at least in part, within ``[since, until]`` (Unix s), as the
        API lists them (``GET /api/task-runs``), page by page."""
        params: dict[str, Any] = {
            "finished_after": datetime.fromtimestamp(since, UTC).isoformat(),
            "started_before": datetime.fromtimestamp(until, UTC).isoformat(),
            "limit": TASK_RUNS_PAGE,
        }
        runs: list[dict[str, Any]] = []
        while True:
            reply = self._http.get("/api/task-runs", params=params)
            page: list[dict[str, Any]] = reply.raise_for_status().json()
            runs += page
            if len(page) < TASK_RUNS_PAGE:
                return runs
            params["after_id"] = page[-1]["id"]

    def ensure_chain(self, tasks: int) -> str:
        """Register the n-task pipeline unless it exists; return its workflow name."""
        return self.ensure_definition(chain_definition(tasks))

    def ensure_noop_chain(self, tasks: int) -> str:
        """Register ``noop_chain_<n>`` (n no-op steps in a row) unless it exists."""
        name = f"noop_chain_{tasks}"
        steps = [
            {"ref": f"noop{i}", "task": "noop", "depends_on": [f"noop{i - 1}"] if i else []}
            for i in range(tasks)
        ]
        return self.ensure_definition({"name": name, "tasks": steps})

    def ensure_definition(self, definition: dict[str, Any]) -> str:
        """Register a workflow definition unless one of its name exists; return the name."""
        name = str(definition["name"])
        if self._http.get(f"/api/workflow-definitions/{name}").status_code == 200:
            return name
        reply = self._http.post("/api/workflow-definitions", json=definition)
        if reply.status_code not in (201, 409):  # 409: registered meanwhile
            raise RuntimeError(f"definition {name!r} refused ({reply.status_code}): {reply.text}")
        return name

    def ensure_task(self, name: str, module: str, timeout: float = 30.0) -> None:
        """Register (or replace) task ``name`` as ``module``; while no live worker has
        announced it yet (422), ask again, for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self._http.put(f"/api/tasks/{name}", json={"name": name, "module": module})
            if reply.is_success:
                return
            if reply.status_code != 422 or time.monotonic() > deadline:
                raise RuntimeError(f"task {name!r} refused ({reply.status_code}): {reply.text}")
            time.sleep(0.5)
