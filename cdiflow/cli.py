"""The ``cdiflow`` command."""

from __future__ import annotations

import importlib
from typing import Any

import click

from cdi.errors import CDIError
from cdiflow.client.errors import CdiflowError
from orchestrator.errors import OrchestratorError
from workflows.errors import WorkflowsError

__all__ = ["main"]


class _Lazy(click.Group):
    """A group whose subcommands are imported when one is run (or help lists them), not when
    ``cdiflow`` starts: the benchmarks and the stack pull in most of the project, and a client
    command such as ``cdiflow run`` took two seconds to start when every import came first."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})  # name -> "module:attribute"

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, attr = self.lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(module), attr)
            assert isinstance(command, click.Command)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


class _Commands(_Lazy):
    """Our own errors (the documented trees of ``orchestrator``, ``cdi``, ``workflows`` and
    ``cdiflow.client``) end a command with their message, which says what to do, not with a
    traceback; anything else is a bug and keeps its traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (OrchestratorError, CDIError, WorkflowsError, CdiflowError) as exc:
            log_file = getattr(exc, "log_file", None)
            more = f" (log: {log_file})" if log_file else ""
            raise click.ClickException(f"{exc}{more}") from exc


@click.group(
    cls=_Commands,
    lazy={
        "up": "orchestrator.stack.cli:up_command",
        "down": "orchestrator.stack.cli:down_command",
        "status": "orchestrator.stack.cli:status_command",
        "scheduler": "orchestrator.scheduler.cli:scheduler_command",
        "worker": "orchestrator.worker.cli:worker_command",
        "run": "cdiflow.commands.workflows:run_command",
        "workflows": "cdiflow.commands.workflows:workflows_group",
        "tasks": "cdiflow.commands.definitions:tasks_group",
        "definitions": "cdiflow.commands.definitions:definitions_group",
    },
)
@click.version_option(package_name="cdiflow")
def main() -> None:
    """cdiflow: a workflow orchestrator whose intermediate data moves as Container Data Items."""


@main.group(
    "cdi",
    cls=_Lazy,
    lazy={
        "controller": "cdi.controller.cli:controller_command",
        "minion": "cdi.minion.cli:minion_command",
    },
)
def cdi_group() -> None:
    """The CDI runtime: controller and per-host minion."""


@main.group(
    "bench",
    cls=_Lazy,
    lazy={
        "cdi": "cdi.bench.cli:bench_cdi_command",
        "workflows": "loadtest.cli:bench_workflows_command",
        "images": "loadtest.image_costs:bench_images_command",
        "s3": "loadtest.s3_costs:bench_s3_command",
        "idle": "loadtest.idle:bench_idle_command",
    },
)
def bench_group() -> None:
    """Benchmarks that print a readable table (or JSON with --json)."""


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
