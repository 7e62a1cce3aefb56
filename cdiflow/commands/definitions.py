"""``cdiflow tasks ...`` and ``cdiflow definitions ...``: register what the workers run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml

from cdiflow.client.models import Definition, DefinitionVersion, as_data, definition_body
from cdiflow.commands.common import Target, api_options, echo_json, table, when
from cdiflow.commands.graph import Graph

__all__ = ["definitions_group", "tasks_group"]


@click.group("tasks")
def tasks_group() -> None:
    """Task definitions: the functions workers can run."""


@tasks_group.command("register")
@click.argument("module", metavar="MODULE:FUNCTION")
@click.option("--name", default=None, help="Task name [default: the function's name].")
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds a run may take [default: the function's @task, else 30].",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=None,
    help="Retries after a failure [default: the function's @task, else 0].",
)
@click.option(
    "--retry-backoff-s",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds before the first retry, doubling [default: @task's, else 0.5].",
)
@click.option("--description", default=None)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="At most this many runs of it at once over every scheduler [default: no limit].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the task as JSON.")
@api_options
def register_task(
    module: str,
    name: str | None,
    timeout_s: float | None,
    retries: int | None,
    retry_backoff_s: float | None,
    description: str | None,
    max_concurrency: int | None,
    as_json: bool,
    target: Target,
) -> None:
    """Register (or replace) the task MODULE:FUNCTION, e.g. mytasks:sharpen.

    A live worker must be able to import it: start workers with --tasks PATH (`cdiflow up
    --tasks PATH`), or the API refuses it with the worker's import error.
    """
    if ":" not in module:
        raise click.BadParameter("expected package.module:function", param_hint="MODULE")
    task_name = name or module.rsplit(":", 1)[1].rsplit(".", 1)[-1]
    with target.client() as api:
        task = api.register_task(
            task_name,
            module,
            timeout_s=timeout_s,
            retries=retries,
            retry_backoff_s=retry_backoff_s,
            description=description,
            max_concurrency=max_concurrency,
        )
    if as_json:
        echo_json(task)
        return
    click.echo(
        f"registered task {task.name} ({task.module}; timeout {task.timeout_s:g} s, "
        f"{task.retries} retries)"
    )


@tasks_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@api_options
def list_tasks(as_json: bool, target: Target) -> None:
    """Every registered task."""
    with target.client() as api:
        tasks = api.tasks()
    if as_json:
        echo_json(tasks)
        return
    rows = [(t.name, t.module, f"{t.timeout_s:g}", t.retries) for t in tasks]
    click.echo(table(("NAME", "MODULE", "TIMEOUT_S", "RETRIES"), rows))


@tasks_group.command("delete")
@click.argument("name")
@api_options
def delete_task(name: str, target: Target) -> None:
    """Delete a task (refused while a workflow definition uses it)."""
    with target.client() as api:
        api.delete_task(name)
    click.echo(f"deleted task {name}")


@click.group("definitions")
def definitions_group() -> None:
    """Workflow definitions and their versions."""


def _load(path: Path) -> list[dict[str, Any]]:
    """The definitions in a JSON or YAML file: one mapping, or a list of them."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        loaded = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"{path} is not valid {path.suffix[1:] or 'YAML'}: {exc}") from exc
    items = loaded if isinstance(loaded, list) else [loaded]
    if not items or not all(isinstance(item, dict) for item in items):
        raise click.BadParameter(
            f"{path} must hold a workflow definition (a mapping with name and tasks) or a "
            "list of them"
        )
    return items


@definitions_group.command("apply")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True)
@api_options
def apply_definitions(files: tuple[Path, ...], as_json: bool, target: Target) -> None:
    """Save the workflow definitions in FILES (.json, .yaml): each becomes a new version of
    its name when it differs from the current one; the same content saves nothing. A file
    may also set its queue's `priority` and `max_concurrent_runs`."""
    definitions = [d for path in files for d in _load(path)]
    saved = []
    with target.client() as api:
        current = {d.name: d.version for d in api.definitions()}
        for definition in definitions:
            before = current.get(str(definition.get("name")))
            after = api.apply_definition(definition)
            current[after.name] = after.version
            saved.append(after)
            if not as_json:
                what = (
                    "created"
                    if before is None
                    else "unchanged"
                    if before == after.version
                    else "saved"
                )
                click.echo(f"{after.name}: {what}, version {after.version}")
    if as_json:
        echo_json(saved)


@definitions_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@api_options
def list_definitions(as_json: bool, target: Target) -> None:
    """Every workflow definition at its current version."""
    with target.client() as api:
        found = api.definitions()
    if as_json:
        echo_json(found)
        return
    rows = [(d.name, d.version, _graph(d).summary(), when(d.updated_at)) for d in found]
    click.echo(table(("NAME", "VERSION", "STEPS", "SAVED"), rows))


@definitions_group.command("show")
@click.argument("name")
@click.option(
    "--version",
    "version",
    type=click.IntRange(min=1),
    default=None,
    help="Show that version [default: the current one].",
)
@api_options
def show_definition(name: str, version: int | None, target: Target) -> None:
    """A workflow definition as stored, as JSON: what `definitions apply` takes (applied
    again, it saves no new version). Which version it is goes to stderr."""
    with target.client() as api:
        found = api.definition_version(name, version) if version else api.definition(name)
    click.echo(f"# {found.name} version {found.version}", err=True)
    echo_json(definition_body(found))


@definitions_group.command("versions")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@api_options
def definition_versions(name: str, as_json: bool, target: Target) -> None:
    """Every version of a workflow definition, newest first, each with its graph: a step a
    line, after the steps it waits for."""
    with target.client() as api:
        versions = api.definition_versions(name)
    if as_json:
        echo_json(versions)
        return
    blocks = []
    for v in versions:
        graph = _graph(v)
        heading = f"version {v.version}, saved {when(v.created_at)}: {graph.summary()}"
        body = table(("STEP", "AFTER", "DOES"), graph.rows())
        blocks.append(heading + "\n" + "\n".join(f"  {line}" for line in body.splitlines()))
    click.echo("\n\n".join(blocks))


def _graph(definition: Definition | DefinitionVersion) -> Graph:
    # The steps as the API sent them, fields and kinds this version does not know included.
    return Graph(as_data(definition.tasks))


@definitions_group.command("pause")
@click.argument("name")
@api_options
def pause_definition(name: str, target: Target) -> None:
    """Pause a definition's queue: its new runs wait PENDING (RUNNING ones go on)."""
    with target.client() as api:
        api.pause_definition(name)
    click.echo(f"the queue of {name} is paused: its new runs wait")


@definitions_group.command("resume")
@click.argument("name")
@api_options
def resume_definition(name: str, target: Target) -> None:
    """Let a definition's waiting runs be claimed again."""
    with target.client() as api:
        api.resume_definition(name)
    click.echo(f"the queue of {name} goes on")


@definitions_group.command("delete")
@click.argument("name")
@api_options
def delete_definition(name: str, target: Target) -> None:
    """Delete a workflow definition (refused while runs of it are pending or running)."""
    with target.client() as api:
        api.delete_definition(name)
    click.echo(f"deleted workflow definition {name}")
