"""The ``cdiflow`` command."""

from __future__ import annotations

from typing import Any

import click

from apps.ar.cli import ar_group, bench_ar_command
from apps.ar.errors import ARError
from cdi.bench.cli import bench_cdi_command
from cdi.controller.cli import controller_command
from cdi.errors import CDIError
from cdi.minion.cli import minion_command
from loadtest.cli import bench_workflows_command
from loadtest.idle import bench_idle_command
from loadtest.image_costs import bench_images_command
from loadtest.s3_costs import bench_s3_command
from orchestrator.errors import OrchestratorError
from orchestrator.scheduler.cli import scheduler_command
from orchestrator.stack.cli import down_command, status_command, up_command
from orchestrator.worker.cli import worker_command
from workflows.errors import WorkflowsError

__all__ = ["main"]


class _Commands(click.Group):
    """Our own errors (the documented trees of ``orchestrator``, ``cdi``, ``workflows`` and
    ``apps.ar``) end a command with their message, which says what to do, not with a
    traceback; anything else is a bug and keeps its traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (OrchestratorError, CDIError, WorkflowsError, ARError) as exc:
            log_file = getattr(exc, "log_file", None)
            more = f" (log: {log_file})" if log_file else ""
            raise click.ClickException(f"{exc}{more}") from exc


@click.group(cls=_Commands)
@click.version_option(package_name="cdiflow")
def main() -> None:
    """cdiflow: a workflow orchestrator whose intermediate data moves as Container Data Items."""


@main.group("cdi")
def cdi_group() -> None:
    """The CDI runtime: controller and per-host minion."""


cdi_group.add_command(controller_command)
cdi_group.add_command(minion_command)


main.add_command(up_command)
main.add_command(down_command)
main.add_command(status_command)
main.add_command(scheduler_command)
main.add_command(worker_command)
main.add_command(ar_group)


@main.group("bench")
def bench_group() -> None:
    """Benchmarks that print a readable table (or JSON with --json)."""


bench_group.add_command(bench_cdi_command)
bench_group.add_command(bench_workflows_command)
bench_group.add_command(bench_images_command)
bench_group.add_command(bench_s3_command)
bench_group.add_command(bench_idle_command)
bench_group.add_command(bench_ar_command)


@cdi_group.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option(
    "--data-dir",
    default=".data/cdi-demo",
    show_default=True,
    help="Where logs and the result image go.",
)
def cdi_demo_command(as_json: bool, data_dir: str) -> None:
    """Two processes pass an image through one CDI object (CDI runtime only)."""
    from cdiflow.demo_cdi import run_cdi_demo

    run_cdi_demo(data_dir=data_dir, as_json=as_json)


@main.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--data-dir", default=None, help="Stack data folder (default ./.data).")
@click.option("--port", default=8000, show_default=True, help="Port of the REST API.")
def demo_command(as_json: bool, data_dir: str | None, port: int) -> None:
    """Start the whole stack, run the image pipeline under every policy, print a summary."""
    from cdiflow.demo import run_demo

    report = run_demo(data_dir=data_dir, as_json=as_json, port=port)
    if report["failed"]:
        raise SystemExit(1)
