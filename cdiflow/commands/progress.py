"""The progress display of a run being waited for: a line for each step that ends, from the
run's events, then the outcome (with the traceback of the step that ended it, if any)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import click

from cdiflow.client import Client, Event, WaitTimeout, WorkflowDetail
from cdiflow.client.errors import describe_attempt, failed_task

__all__ = ["follow", "outcome"]

_MARKS = {"task.completed": "done", "task.failed": "FAILED", "task.timed_out": "TIMED OUT",
          "task.cancelled": "cancelled"}  # fmt: skip


def follow(api: Client, workflow_id: str, *, timeout: float | None) -> WorkflowDetail:
    """Print each step's end as it happens; the run's detail once it has finished (the
    client's ``WaitTimeout`` if ``timeout`` passes first)."""
    began = time.monotonic()
    created: datetime | None = None
    for event in api.events(workflow_id, follow=True, timeout=timeout):
        created = created or event.at  # the first event is the run's creation
        line = describe(event, (event.at - created).total_seconds())
        if line:
            click.echo(line)
    if timeout is None:
        return api.wait(workflow_id)
    left = timeout - (time.monotonic() - began)
    if left > 0:
        return api.wait(workflow_id, left)
    run = api.get(workflow_id)
    if not run.finished:
        raise WaitTimeout(workflow_id, timeout)
    return run


def describe(event: Event, since_start_s: float) -> str | None:
    """One line for an event worth showing (``since_start_s`` after the run was created), or
    ``None``."""
    data: dict[str, Any] = event.data
    at = f"{since_start_s:6.2f}s"
    if event.kind in _MARKS:
        attempt = f", attempt {data['attempt']}" if data.get("attempt", 1) != 1 else ""
        error = f": {data['error']}" if data.get("error") else ""
        return f"  {at}  {data.get('ref', '?'):<16} {_MARKS[event.kind]:<9} on " \
               f"{data.get('worker') or '-'}{attempt}{error}"  # fmt: skip
    if event.kind == "workflow.running":
        return f"  {at}  claimed by a scheduler"
    if event.kind == "task.waiting":
        return f"  {at}  {data.get('reason') or 'waiting for a worker'}"
    if event.kind == "task.unblocked":
        return f"  {at}  {data.get('ref', '?'):<16} a worker can take it now"
    return None


def outcome(run: WorkflowDetail) -> str:
    """The last lines: status, time taken, output and result."""
    took = ""
    if run.finished_at is not None:
        took = f" in {(run.finished_at - run.created_at).total_seconds():.2f} s"
    lines = [f"{run.status}{took}: {run.workflow} v{run.workflow_version}, run {run.id}"]
    if run.status_detail:
        lines.append(f"now {run.status_detail}")
    if run.error:
        lines.append(f"error: {run.error}")
    failed = failed_task(run) if run.status != "COMPLETED" else None
    if failed is not None and failed.traceback:
        lines.append(f"{describe_attempt(failed)}:")
        lines.extend(f"  {line}" for line in failed.traceback.rstrip().splitlines())
    shown = {k: v for k, v in (run.output or {}).items() if k != "tasks"}
    if shown:
        lines.append("output: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    if run.result_uri:
        lines.append(f"result: {run.result_uri}")
    return "\n".join(lines)
