"""``cdiflow run`` and ``cdiflow workflows ...``: start runs, watch them, act on them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args

import click

from cdiflow.client import Client, WorkflowDetail
from cdiflow.client.models import as_data
from cdiflow.commands.common import Target, api_options, echo_json, table, when
from cdiflow.commands.progress import follow, outcome
from orchestrator.contract.vocabulary import CHOSEN_PLANES, Policy, WorkflowStatus
from orchestrator.schemas import WorkflowInput

__all__ = ["data_option", "run_command", "workflows_group"]

# The words the API takes, from its own vocabulary and schema.
_POLICIES = click.Choice([policy.value for policy in Policy])
_PLANES = click.Choice([plane.value for plane in CHOSEN_PLANES])
_STATUSES = click.Choice([status.value for status in WorkflowStatus], case_sensitive=False)
_FORMATS = click.Choice(get_args(WorkflowInput.model_fields["result_format"].annotation))
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a data field a NAME=FILE input fills


def data_option(value: str | None, hint: str = "--data") -> dict[str, Any] | None:
    """A JSON object given on the command line (``None`` when not given)."""
    if value is None:
        return None
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=hint) from exc
    if not isinstance(data, dict):
        raise click.BadParameter("expected a JSON object", param_hint=hint)
    return data


@click.command("run")
@click.argument("workflow")
@click.option(
    "--input",
    "-i",
    "inputs",
    multiple=True,
    metavar="[NAME=]FILE|s3://URI",
    help="The input image: a local file (uploaded through the API) or an S3 URI. NAME=FILE "
    "(repeatable) uploads any other file, a video or a .npy array, and passes its URI as "
    "data field NAME (ar_video reads video=FILE). Leave it out for a dataless run.",
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
    type=_FORMATS,
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
    "--priority",
    type=click.IntRange(-100, 100),
    default=None,
    help="Among waiting runs, higher goes first [default: the definition's].",
)
@click.option("--tag", "tags", multiple=True, help="Label the run (repeatable).")
@click.option(
    "--idempotency-key",
    default=None,
    metavar="KEY",
    help="Running this again with the same key and input answers the same run.",
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
    help="Save the result here: the image result, or the run's only stored result "
    "(implies --wait).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Give up waiting after this many seconds (the run goes on).",
)
@click.option(
    "--time-limit",
    "time_limit",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="The run's own time limit: past it the run ends TIMED_OUT and its running task is "
    "stopped [default: the definition's timeout_s, if any].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@api_options
def run_command(
    workflow: str,
    inputs: tuple[str, ...],
    data: str | None,
    policy: str | None,
    data_plane: str | None,
    result_format: str | None,
    version: int | None,
    priority: int | None,
    tags: tuple[str, ...],
    idempotency_key: str | None,
    wait: bool,
    out: Path | None,
    timeout: float | None,
    time_limit: float | None,
    as_json: bool,
    target: Target,
) -> None:
    """Start a run of WORKFLOW on an image or other files, e.g. `cdiflow run image_pipeline
    -i photo.jpg --wait --out result.png` or `cdiflow run ar_video -i video=people.mp4 --wait
    --out labelled.mp4`. Exit status 1 when a waited-for run does not complete."""
    wait = wait or out is not None
    image, named = _inputs(inputs)
    with target.client() as api:
        if any(isinstance(source, Path) for source in [image, *named.values()]):
            api.definition(workflow)  # a workflow that does not exist is told before an upload
        files = {
            name: _upload(api, source, as_json) if isinstance(source, Path) else source
            for name, source in named.items()
        }
        if isinstance(image, Path):
            image = _upload(api, image, as_json, image=True)
        started = api.start(
            workflow,
            image,
            data=data_option(data),
            files=files,
            policy=policy,
            data_plane=data_plane,
            result_format=result_format,
            version=version,
            priority=priority,
            tags=tags,
            idempotency_key=idempotency_key,
            timeout_s=time_limit,
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
        if out is not None and finished.status == WorkflowStatus.COMPLETED:
            api.save_result(finished.id, out)
    _report(finished, as_json, out)


def _inputs(given: tuple[str, ...]) -> tuple[str | Path | None, dict[str, str | Path]]:
    """The image (``FILE`` or ``s3://URI``) and the named files (``NAME=FILE``) of --input."""
    image: str | Path | None = None
    named: dict[str, str | Path] = {}
    for value in given:
        name, sep, source = value.partition("=")
        if sep and _NAME.fullmatch(name) and not Path(value).is_file():
            if name in named:
                raise click.BadParameter(f"{name}= is given twice", param_hint="--input")
            named[name] = _local_or_uri(source)
        elif image is not None:
            raise click.BadParameter(
                "one image a run; name any other file as NAME=FILE", param_hint="--input"
            )
        else:
            image = _local_or_uri(value)
    return image, named


def _local_or_uri(source: str) -> str | Path:
    if source.startswith("s3://"):
        return source
    path = Path(source)
    if not path.is_file():
        raise click.BadParameter(f"{source} is not a file (nor an s3:// URI)", param_hint="--input")
    return path


def _upload(api: Client, path: Path, as_json: bool, *, image: bool = False) -> str:
    """Upload ``path``: its URI. As the image, it must be one (a workflow's tasks decode it)."""
    if not as_json:
        click.echo(f"uploading {path} ...")
    uploaded = api.upload(path)
    if image and not uploaded.content_type.startswith("image/"):
        raise click.BadParameter(
            f"{path} is {uploaded.content_type}, not an image; pass it as the data field its "
            f"workflow reads, e.g. --input video={path}",
            param_hint="--input",
        )
    return uploaded.uri


def _report(run: WorkflowDetail, as_json: bool, out: Path | None) -> None:
    if as_json:
        echo_json(run)
    else:
        click.echo(outcome(run))
        if out is not None and run.status == WorkflowStatus.COMPLETED:
            click.echo(f"saved the result to {out}")
    if run.status != WorkflowStatus.COMPLETED:
        raise SystemExit(1)


@click.group("workflows")
def workflows_group() -> None:
    """Workflow runs: list, show, follow, cancel, retry, download results."""


@workflows_group.command("list")
@click.option("--status", type=_STATUSES, default=None)
@click.option("--workflow", default=None, help="Only runs of this definition.")
@click.option("--tag", "tags", multiple=True, help="Only runs with this tag (repeatable: all).")
@click.option("--input", "input_", default=None, metavar="JSON", help="JSON the input contains.")
@click.option("--schedule", default=None, help="Only runs this schedule made.")
@click.option("--limit", type=click.IntRange(1, 200), default=20, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@click.option("--json", "as_json", is_flag=True)
@api_options
def list_workflows(
    status: str | None,
    workflow: str | None,
    tags: tuple[str, ...],
    input_: str | None,
    schedule: str | None,
    limit: int,
    offset: int,
    as_json: bool,
    target: Target,
) -> None:
    """Runs, newest first, e.g. `cdiflow workflows list --tag nightly --input
    '{"data": {"camera": 3}}'`."""
    with target.client() as api:
        page = api.list_workflows(
            status=status.upper() if status else None,
            workflow=workflow,
            tags=tags,
            input=data_option(input_, "--input"),
            schedule=schedule,
            limit=limit,
            offset=offset,
        )
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
    click.echo(f"{len(page.items)} of {page.total}")


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


@workflows_group.command("pause")
@click.argument("workflow_id")
@api_options
def pause_workflow(workflow_id: str, target: Target) -> None:
    """Pause a run: what runs finishes, its next steps wait."""
    with target.client() as api:
        run = api.pause(workflow_id)
    click.echo(f"run {run.id} ({run.status}) is paused")


@workflows_group.command("resume")
@click.argument("workflow_id")
@api_options
def resume_workflow(workflow_id: str, target: Target) -> None:
    """Let a paused run go on."""
    with target.client() as api:
        run = api.resume(workflow_id)
    click.echo(f"run {run.id} ({run.status}) goes on")


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
            click.echo(json.dumps(as_data(event)))


@workflows_group.command("result")
@click.argument("workflow_id")
@click.argument("output", required=False)
@click.option(
    "--out",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to save the result.",
)
@api_options
def download_result(workflow_id: str, output: str | None, out: Path, target: Target) -> None:
    """Save a completed run's result: OUTPUT (step.output, as its output's results list them,
    e.g. combine.video), else its image result, else its only stored result."""
    with target.client() as api:
        saved = api.save_result(workflow_id, out, output=output)
    click.echo(f"saved {saved.bytes} bytes ({saved.content_type}) to {saved.path}")
