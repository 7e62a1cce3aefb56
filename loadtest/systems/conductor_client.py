"""Conductor's REST API: the definitions the benchmark registers, and the locust backend.

A workflow ``bench_chain_N`` is N SIMPLE tasks cycling deblur, denoise, classify (N = 3:
the image pipeline). Each task is given the previous one's output URI and labels and the
run's intermediate format; the workflow's output carries the last task's ``stored_at``.

A client starts a workflow and waits for its end in one request, Conductor's synchronous
``POST /api/workflow/execute/{name}/{version}?waitForSeconds=`` (the server checks the
workflow every 100 ms and answers once it has ended); one still running after that is
followed by status polls. With more than ``SYNC_MAX_CLIENTS`` clients, each starts its
workflow asynchronously and polls (``loadtest.plan.poll_max_s``: at most ~100 polls a second
from the crowd). *Why:* the server checks every waiting ``execute`` every 100 ms: 5,000
workflow reads a second at 500 clients, more than the workflows themselves cost; a user with
that many in flight would poll gently instead.
"""

from __future__ import annotations

from typing import Any, Final

from loadtest.images import CHAIN_OPS, chain_ops

__all__ = [
    "SYNC_MAX_CLIENTS",
    "ConductorBackend",
    "task_definitions",
    "workflow_definition",
    "workflow_name",
]

# (status, stored_at, error, ops_cpu_ms), as ``loadtest.locustfile.Outcome``.
Outcome = tuple[str, float | None, str, float | None]

OWNER: Final = "bench@cdiflow.invalid"
SYNC_MAX_CLIENTS: Final = 100
FAILED: Final = frozenset({"FAILED", "TIMED_OUT", "TERMINATED"})


def workflow_name(tasks: int) -> str:
    return f"bench_chain_{tasks}"


def task_definitions() -> list[dict[str, Any]]:
    """No retries (a failed task fails its workflow, as everywhere in the benchmark)."""
    return [
        {
            "name": op,
            "retryCount": 0,
            "timeoutSeconds": 600,
            "responseTimeoutSeconds": 600,
            "timeoutPolicy": "TIME_OUT_WF",
            "ownerEmail": OWNER,
        }
        for op in CHAIN_OPS
    ]


def workflow_definition(tasks: int) -> dict[str, Any]:
    steps = []
    for i, op in enumerate(chain_ops(tasks)):
        previous = f"step{i - 1}"
        steps.append(
            {
                "name": op,
                "taskReferenceName": f"step{i}",
                "type": "SIMPLE",
                "inputParameters": {
                    "source": "${workflow.input.image}"
                    if i == 0
                    else f"${{{previous}.output.uri}}",
                    "outputs": {} if i == 0 else f"${{{previous}.output.outputs}}",
                    "ops_cpu_ms": 0.0 if i == 0 else f"${{{previous}.output.ops_cpu_ms}}",
                    "workflow_id": "${workflow.workflowId}",
                    "intermediate": "${workflow.input.intermediate}",
                    "step": i,
                    "last": i == tasks - 1,
                },
            }
        )
    last = f"step{tasks - 1}"
    return {
        "name": workflow_name(tasks),
        "version": 1,
        "schemaVersion": 2,
        "ownerEmail": OWNER,
        "restartable": False,
        "timeoutSeconds": 0,
        "tasks": steps,
        "outputParameters": {
            "stored_at": f"${{{last}.output.stored_at}}",
            "outputs": f"${{{last}.output.outputs}}",
            "ops_cpu_ms": f"${{{last}.output.ops_cpu_ms}}",
        },
    }


class ConductorBackend:
    """Start a workflow by name and wait for its end (locust's HTTP client: its requests show
    in the statistics). ``target.api_url`` is the server's base URL, ``target.workflow`` the
    workflow name."""

    long_poll = False  # past the start's wait, the status GET answers at once: sleep between

    def __init__(self, user: Any, target: Any) -> None:
        from loadtest.locust_http import LONG_POLL_S, http_session  # locust's process only

        self.http = http_session(user, target.api_url, open_loop=bool(target.arrival_rate))
        self.sync = int(target.concurrency) <= SYNC_MAX_CLIENTS
        self.workflow = str(target.workflow)
        self.intermediate = str(target.intermediate)
        self.wait_s = int(LONG_POLL_S)
        self._ended: dict[str, Outcome] = {}  # answered by the start itself

    @staticmethod
    def _check(reply: Any, what: str) -> None:
        if reply.status_code is None or not 200 <= reply.status_code < 300:
            detail = reply.error or (reply.text or "")[:200]
            raise RuntimeError(f"{what}: {reply.status_code} {detail}")

    def start(self, uri: str) -> str:
        given = {"image": uri, "intermediate": self.intermediate}
        if not self.sync:
            path = f"/api/workflow/{self.workflow}"
            reply = self.http.post(path, json=given)
            self._check(reply, f"POST {path}")
            return str(reply.text).strip()
        path = f"/api/workflow/execute/{self.workflow}/1?waitForSeconds={self.wait_s}"
        body = {"name": self.workflow, "version": 1, "input": given}
        reply = self.http.post(path, json=body, name="/api/workflow/execute/[name]/1")
        self._check(reply, f"POST {path}")
        answer = reply.json()
        handle = str(answer.get("targetWorkflowId") or answer["workflowId"])
        status = str(answer.get("targetWorkflowStatus") or answer.get("status") or "")
        if status == "COMPLETED":
            self._ended[handle] = _completed(answer.get("output") or {})
        return handle  # failed or still running: ``poll`` reads the workflow (and its reason)

    def poll(self, handle: str) -> Outcome | None:
        ended = self._ended.pop(handle, None)
        if ended is not None:
            return ended
        path = f"/api/workflow/{handle}?includeTasks=false"
        reply = self.http.get(path, name="/api/workflow/[id]")
        self._check(reply, f"GET {path}")
        body = reply.json()
        status = str(body["status"])
        if status == "COMPLETED":
            return _completed(body["output"])
        if status in FAILED:
            return status, None, str(body.get("reasonForIncompletion") or ""), None
        return None  # RUNNING or PAUSED


def _completed(output: dict[str, Any]) -> Outcome:
    return "COMPLETED", float(output["stored_at"]), "", _number(output.get("ops_cpu_ms"))


def _number(value: Any) -> float | None:
    """A number from a workflow's output, or ``None`` (absent, or not a number)."""
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
