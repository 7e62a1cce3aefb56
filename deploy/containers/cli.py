"""``cdiflow containers``: build the images, run the stack as containers, strike it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from deploy.containers.errors import ContainerError

__all__ = ["containers_group"]

_DATA_HELP = "Folder of the stack's data, logs and secrets (its own: not `cdiflow up`'s)."


@click.group("containers")
def containers_group() -> None:
    """cdiflow as containers on this machine, with podman, as root (README: Deploying)."""


@containers_group.command("build")
@click.option("--refresh-base", is_flag=True, help="Make the Debian base again (new packages).")
def build_command(refresh_base: bool) -> None:
    """Build the images (what `make image` runs): the product's and the services'."""
    from deploy.containers.images import build_images

    try:
        names = build_images(refresh_base=refresh_base)
    except ContainerError as exc:
        raise click.ClickException(str(exc)) from exc
    for what, ref in names.all().items():
        click.echo(f"{what:9} {ref}")


@containers_group.command("up")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(".data/containers"), show_default=True, help=_DATA_HELP)  # fmt: skip
@click.option("--name", default="cdiflow", show_default=True,
              help="The stack's name: the prefix of its network, pods, containers.")  # fmt: skip
@click.option("--hosts", type=click.IntRange(1, 8), default=2, show_default=True,
              help="Hosts: pods, each with its minion, on one network.")  # fmt: skip
@click.option("--workers", "-w", type=click.IntRange(min=1), default=2, show_default=True,
              help="Workers, spread over the hosts.")  # fmt: skip
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True,
              help="Port on 127.0.0.1 the API and the dashboard are published on.")  # fmt: skip
@click.option("--tasks", multiple=True, type=click.Path(exists=True, file_okay=False,
              path_type=Path), metavar="FOLDER",
              help="A folder of your task code, mounted into the API and the workers "
              "(repeatable).")  # fmt: skip
def up_command(
    data_dir: Path, name: str, hosts: int, workers: int, port: int, tasks: tuple[Path, ...]
) -> None:
    """Start the whole stack as containers (`make image` first) and return once every piece
    answers; stop it with `cdiflow containers down`."""
    from deploy.containers.stack import ContainerStack

    stack = ContainerStack(data_dir, name=name, hosts=hosts, workers=workers, port=port,
                           tasks=tasks)  # fmt: skip
    try:
        stack.start()
    except ContainerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(_summary(stack))


@containers_group.command("down")
@click.option("--name", default="cdiflow", show_default=True, help="The stack's name.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(".data/containers"), show_default=True, help=_DATA_HELP)  # fmt: skip
@click.option("--volumes", is_flag=True, help="Remove its data folder too (Postgres, S3, keys).")
def down_command(name: str, data_dir: Path, volumes: bool) -> None:
    """Stop and remove the stack's containers, pods and network (workers first)."""
    from deploy.containers.stack import ContainerStack

    try:
        ContainerStack(data_dir, name=name).stop(remove_data=volumes)
    except ContainerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stack {name} removed" + (f", and {data_dir}" if volumes else ""))


@containers_group.command("status")
@click.option("--name", default="cdiflow", show_default=True, help="The stack's name.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
def status_command(name: str, as_json: bool) -> None:
    """The stack's containers: role, host, state, restarts (exit status 1 when none runs)."""
    from deploy.containers.stack import container_rows

    try:
        rows = container_rows(name)
    except ContainerError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps({"name": name, "containers": rows}))
    elif rows:
        click.echo(f"{'container':28} {'role':11} {'pod':18} {'state':10} restarts")
        for row in rows:
            click.echo(f"{row['name']:28} {row['role']:11} {row['pod'] or '-':18} "
                       f"{row['state']:10} {row['restarts']}")  # fmt: skip
    else:
        click.echo(f"no stack named {name} runs here")
    sys.exit(0 if rows else 1)


@containers_group.command("faults")
@click.option("--faults", default="all", show_default=True,
              help="Comma-separated fault names (see deploy/containers/faults.py).")  # fmt: skip
@click.option("--workflows", type=click.IntRange(3, 1000), default=30, show_default=True,
              help="Workflows in flight when each fault strikes.")  # fmt: skip
@click.option("--deadline", type=float, default=240.0, show_default=True,
              help="Seconds each case may take to bring every workflow to its end.")  # fmt: skip
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write the results as JSON to this file.")  # fmt: skip
@click.option("--logs", "logs_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Keep each container's log here, a folder a fault.")  # fmt: skip
def faults_command(
    faults: str, workflows: int, deadline: float, json_out: Path | None, logs_dir: Path | None
) -> None:
    """Strike each fault at a fresh stack as containers (two hosts) with WORKFLOWS in flight:
    every workflow must end right (0 stuck, 0 lost, 0 wrong, no object left), and the time
    until a new workflow completes is the recovery. Prints a table; exits 1 if a case failed."""
    from deploy.containers.faults import CONTAINER_FAULTS, run_faults
    from loadtest.chaos.cli import table

    by_name = {f.name: f for f in CONTAINER_FAULTS}
    names = list(by_name) if faults == "all" else [f.strip() for f in faults.split(",") if f]
    if unknown := [n for n in names if n not in by_name]:
        raise click.BadParameter(f"unknown fault(s) {unknown}; choose from {', '.join(by_name)}")
    try:
        results = run_faults([by_name[n] for n in names], workflows=workflows,
                             deadline_s=deadline, logs_dir=logs_dir)  # fmt: skip
    except ContainerError as exc:
        raise click.ClickException(str(exc)) from exc
    report: dict[str, Any] = {"results": [r.as_dict() for r in results]}
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
    click.echo(table(results))
    if not all(r.passed for r in results):
        sys.exit(1)


def _summary(stack: Any) -> str:
    key = stack.secrets.admin_key_file
    return (
        f"cdiflow is up as containers ({stack.layout.hosts} hosts, {stack.layout.workers} "
        f"workers): API and dashboard {stack.api_url}/\n"
        f"The admin key is in {key} (root's alone). For the client and the command line:\n"
        f'  export CDIFLOW_API_URL={stack.api_url} CDIFLOW_API_KEY="$(cat {key})"\n'
        f"S3 endpoint {stack.services.s3_endpoint_url} (keys: {stack.data_dir}/credentials.json)"
        f"\nSee it with `cdiflow containers status --name {stack.name}`; stop it with "
        f"`cdiflow containers down --name {stack.name}`."
    )
