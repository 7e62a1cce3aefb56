"""``cdiflow run`` and ``cdiflow workflows ...``: start runs, watch them, act on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cdiflow.client import WorkflowDetail
from cdiflow.commands.common import Target, api_options, echo_json, table, when
from cdiflow.commands.progress import follow, outcome

__all__ = ["run_command", "workflows_group"]

_POLICIES = click.Choice(["affinity", "transfer", "auto"])
_PLANES = click.Choice(["cdi", "object-store"])
_STATUSES = click.Choice(
    ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"], case_sensitive=False
)


def _data(value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--data") from exc
    if not isinstance(data, dict):
        raise click.BadParameter("expected a JSON object", param_hint="--data")
    return data


@click.command("run")
@click.argument("workflow")
@click.option(
    "--input",
    "-i",
    "image",
    default=None,
    metavar="FILE|s3://URI",
    help="The input image: a local file (uploaded through the API) or an S3 URI. "
    "Leave it out for a dataless run.",
)
@click.option(
    "--data", default=None, metavar="JSON", help="JSON object every task gets as ctx.input."
)
@click.option(
    "--policy", type=_POLICIES, default=None, help="Where the tasks run [default: affinity]."
)
@click.option("--data-plane", type=_PLANES, default=None, help="How data moves [default: cdi].")
@click.option(
    "--format",
    "result_format",
    type=click.Choice(["png", "jpeg"]),
    default=None,
    help="How the result is stored [default: png].",
)
@click.option(
    "--version",
    "version",
    type=click.IntRange(min=1),
    default=None,
    help="Run this version of the definition [default: the current one].",
)
@click.option(
    "--wait/--no-wait",
    default=False,
    help="Wait for the run to finish, showing each step as it ends.",
)
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Save the result image here (implies --wait).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Give up waiting after this many seconds (the run goes on).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@api_options
def run_command(
    workflow: str,
    image: str | None,
    data: str | None,
    policy: str | None,
    data_plane: str | None,
    result_format: str | None,
    version: int | None,
    wait: bool,
    out: Path | None,
    timeout: float | None,
    as_json: bool,
    target: Target,
) -> None:
    """Start a run of WORKFLOW on an image, e.g. `cdiflow run image_pipeline -i photo.jpg
    --wait --out result.png`. Exit status 1 when a waited-for run does not complete."""
    wait = wait or out is not None
    with target.client() as api:
        local = _local_or_uri(image)
        if isinstance(local, Path):
            api.definition(workflow)  # a workflow that does not exist is told before an upload
            if not as_json:
                click.echo(f"uploading {image} ...")
        started = api.start(
            workflow,
            local,
            data=_data(data),
            policy=policy,
            data_plane=data_plane,
            result_format=result_format,
            version=version,
        )
        if not wait:
            if as_json:
                echo_json(started)
            else:
                click.echo(
                    f"started {started.workflow} v{started.workflow_version}: run "
                    f"{started.id} ({started.status})"
                )
                click.echo(f"follow it: cdiflow workflows show {started.id} --wait")
            return
        if as_json:
            finished = api.wait(started.id, timeout)
        else:
            click.echo(
                f"started {started.workflow} v{started.workflow_version} "
                f"({started.policy}): run {started.id}"
            )
            finished = follow(api, str(started.id), timeout=timeout)
        if out is not None and finished.status == "COMPLETED":
            api.download_result(finished.id, out)
    _report(finished, as_json, out)


def _local_or_uri(image: str | None) -> str | Path | None:
    if image is None or image.startswith("s3://"):
        return image
    path = Path(image)
    if not path.is_file():
        raise click.BadParameter(f"{image} is not a file (nor an s3:// URI)", param_hint="--input")
    return path


def _report(run: WorkflowDetail, as_json: bool, out: Path | None) -> None:
    if as_json:
        echo_json(run)
    else:
        click.echo(outcome(run))
        if out is not None and run.status == "COMPLETED":
            click.echo(f"saved the result to {out}")
    if run.status != "COMPLETED":
        raise SystemExit(1)


@click.group("workflows")
def workflows_group() -> None:
    """Workflow runs: list, show, follow, cancel, retry, download results."""


@workflows_group.command("list")
@click.option("--status", type=_STATUSES, default=None)
@click.option("--workflow", default=None, help="Only runs of this definition.")
@click.option("--limit", type=click.IntRange(1, 200), default=20, show_default=True)
@click.option("--cursor", default=None, help="Where the page starts (printed under a page).")
@click.option("--json", "as_json", is_flag=True)
@api_options
def list_workflows(
    status: str | None,
    workflow: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
    target: Target,
) -> None:
    """Runs, newest first, a page at a time (the next page: the --cursor printed below)."""
    with target.client() as api:
        page = api.list_workflows(
            status=status.upper() if status else None, workflow=workflow, limit=limit,
            cursor=cursor,
        )  # fmt: skip
    if as_json:
        echo_json(page)
        return
    rows = []
    for run in page.items:
        took = (run.finished_at - run.created_at).total_seconds() if run.finished_at else None
        rows.append(
            (
                str(run.id),
                f"{run.workflow} v{run.workflow_version}",
                run.status,
                run.policy,
                when(run.created_at),
                f"{took:.2f}s" if took else "-",
            )
        )
    click.echo(table(("ID", "WORKFLOW", "STATUS", "POLICY", "CREATED", "TOOK"), rows))
    matching = f"{page.total:,}" if page.total_exact else f"more than {page.total:,}"
    click.echo(f"{len(page.items)} of {matching}")
    if page.next_cursor is not None:
        click.echo(f"older: --cursor {page.next_cursor}")
    if page.prev_cursor is not None:
        click.echo(f"newer: --cursor {page.prev_cursor}")


@workflows_group.command("show")
@click.argument("workflow_id")
@click.option("--wait", is_flag=True, help="Follow the run until it finishes first.")
@click.option("--json", "as_json", is_flag=True)
@api_options
def show_workflow(workflow_id: str, wait: bool, as_json: bool, target: Target) -> None:
    """A run: its status, every task run and the outcome."""
    with target.client() as api:
        run = (
            follow(api, workflow_id, timeout=None)
            if wait and not as_json
            else (api.wait(workflow_id) if wait else api.get(workflow_id))
        )
    if as_json:
        echo_json(run)
        return
    rows = [
        (
            r.ref,
            r.attempt,
            r.status,
            r.worker_id or "-",
            f"{r.run_ms:.1f}" if r.run_ms is not None else "-",
            r.error or "",
        )
        for r in run.task_runs
    ]
    if rows:
        click.echo(table(("STEP", "ATTEMPT", "STATUS", "WORKER", "RUN_MS", "ERROR"), rows))
    click.echo(outcome(run))


@workflows_group.command("cancel")
@click.argument("workflow_id")
@api_options
def cancel_workflow(workflow_id: str, target: Target) -> None:
    """Cancel a pending or running run."""
    with target.client() as api:
        run = api.cancel(workflow_id)
    click.echo(f"run {run.id} is {run.status}")


@workflows_group.command("retry")
@click.argument("workflow_id")
@click.option("--wait", is_flag=True, help="Wait for the new run, showing its steps.")
@api_options
def retry_workflow(workflow_id: str, wait: bool, target: Target) -> None:
    """Start a new run with the input of a failed or cancelled one."""
    with target.client() as api:
        run = api.retry(workflow_id)
        click.echo(f"retrying {workflow_id} as run {run.id}")
        if wait:
            _report(follow(api, str(run.id), timeout=None), False, None)


@workflows_group.command("events")
@click.argument("workflow_id")
@click.option(
    "--follow/--no-follow",
    "following",
    default=False,
    help="Keep printing new events until the run finishes.",
)
@api_options
def workflow_events(workflow_id: str, following: bool, target: Target) -> None:
    """A run's events, oldest first, one JSON object a line."""
    with target.client() as api:
        for event in api.events(workflow_id, follow=following):
            click.echo(json.dumps(event.model_dump(mode="json")))


@workflows_group.command("result")
@click.argument("workflow_id")
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to save the image.",
)
@api_options
def download_result(workflow_id: str, out: Path, target: Target) -> None:
    """Save a completed run's result image."""
    with target.client() as api:
        data = api.download_result(workflow_id, out)
    click.echo(f"saved {len(data)} bytes to {out}")
