"""The ``cdiflow`` command."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import click

from apps.ar.errors import ARError
from cdi.errors import CDIError
from cdiflow.client.errors import CdiflowError
from orchestrator.errors import OrchestratorError
from orchestrator.pid_one import stop_on_sigterm, unwind_on_sigterm
from workflows.errors import WorkflowsError

__all__ = ["main"]

# ``cdiflow bench <name>``: where each benchmark command lives. They are imported only when
# called (or listed by ``cdiflow bench --help``): the harness and its dependencies (locust,
# Ray, Celery, ...) are not the product's, and ``loadtest`` ships only with a source checkout.
BENCH_COMMANDS: Final = {
    "cdi": "cdi.bench.cli:bench_cdi_command",
    "workflows": "loadtest.cli:bench_workflows_command",
    "images": "loadtest.image_costs:bench_images_command",
    "s3": "loadtest.s3_costs:bench_s3_command",
    "idle": "loadtest.idle:bench_idle_command",
    "history": "loadtest.history.cli:bench_history_command",
    "chaos": "loadtest.chaos.cli:bench_chaos_command",
    "ar": "apps.ar.cli:bench_ar_command",
    "ar-workflows": "loadtest.ar_workflows:bench_ar_workflows_command",
    "channels": "loadtest.channels:bench_channels_command",
    "cache": "loadtest.cache_bench:bench_cache_command",
}


# The product's own commands, imported when one runs (or help lists them). *Why:* the stack,
# the scheduler and the workers pull in most of the project, and a client command such as
# ``cdiflow run`` took two seconds to start when every import came first.
COMMANDS: Final = {
    "up": "orchestrator.stack.cli:up_command",
    "down": "orchestrator.stack.cli:down_command",
    "status": "orchestrator.stack.cli:status_command",
    "scheduler": "orchestrator.scheduler.cli:scheduler_command",
    "worker": "orchestrator.worker.cli:worker_command",
    "run": "cdiflow.commands.workflows:run_command",
    "workflows": "cdiflow.commands.workflows:workflows_group",
    "tasks": "cdiflow.commands.definitions:tasks_group",
    "definitions": "cdiflow.commands.definitions:definitions_group",
    "schedules": "cdiflow.commands.schedules:schedules_group",
    "webhooks": "cdiflow.commands.schedules:webhooks_group",
    "ar": "apps.ar.cli:ar_group",
    "containers": "deploy.containers.cli:containers_group",
}
CDI_COMMANDS: Final = {
    "controller": "cdi.controller.cli:controller_command",
    "credentials": "cdi.auth_cli:credentials_command",
    "minion": "cdi.minion.cli:minion_command",
}


class _LazyCommands(click.Group):
    """A group whose commands are imported when one is asked for (``lazy``: name to
    ``module:attribute``), beside those added to it as usual."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module_name, _, attribute = target.partition(":")
        try:
            module = _import_from_checkout(module_name)
        except ModuleNotFoundError as exc:
            return _unavailable(cmd_name, _missing(ctx.command_path, cmd_name, module_name, exc))
        command: click.Command = getattr(module, attribute)
        return command


def _import_from_checkout(module_name: str) -> ModuleType:
    """Import ``module_name``; a package of the source checkout this cdiflow runs from (the
    benchmark harness, which an install does not map) is found there."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        package = module_name.partition(".")[0]
        checkout = Path(__file__).resolve().parents[1]
        if exc.name != package or not (checkout / package / "__init__.py").is_file():
            raise
        sys.path.insert(0, str(checkout))
        return importlib.import_module(module_name)


def _unavailable(name: str, why: str) -> click.Command:
    """A command that says why it cannot run (listed in the help with that reason)."""

    def refuse() -> None:
        raise click.ClickException(why)

    return click.Command(
        name,
        callback=refuse,
        help=why,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


def _missing(group: str, command: str, module: str, exc: ModuleNotFoundError) -> str:
    package = module.partition(".")[0]
    if exc.name is not None and exc.name.partition(".")[0] == package:
        extra = " (`pip install -e '.[bench]'` there)" if group.endswith(" bench") else ""
        return (
            f"`{group} {command}` is part of the repository's source checkout ({package}/), "
            f"which an installed cdiflow does not include: run it from a checkout{extra}"
        )
    return f"`{group} {command}` needs {exc.name!r}, which is not installed: " + (
        "pip install 'cdiflow[bench]'" if group.endswith(" bench") else "reinstall cdiflow"
    )


class _Commands(_LazyCommands):
    """Our own errors (the documented trees of ``orchestrator``, ``cdi``, ``workflows``,
    ``apps.ar`` and ``cdiflow.client``) end a command with their message, which says what to
    do, not with a traceback; anything else is a bug and keeps its traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (OrchestratorError, CDIError, WorkflowsError, ARError, CdiflowError) as exc:
            log_file = getattr(exc, "log_file", None)
            more = f" (log: {log_file})" if log_file else ""
            raise click.ClickException(f"{exc}{more}") from exc


@click.group(cls=_Commands, lazy=COMMANDS)
@click.version_option(package_name="cdiflow")
def main() -> None:
    """cdiflow: a workflow orchestrator whose intermediate data moves as Container Data Items."""
    stop_on_sigterm()  # a container's roles run as its first process


@main.group("cdi", cls=_LazyCommands, lazy=CDI_COMMANDS)
def cdi_group() -> None:
    """The CDI runtime: controller and per-host minion."""


@main.group("bench", cls=_LazyCommands, lazy=BENCH_COMMANDS)
def bench_group() -> None:
    """Benchmarks that print a readable table (or JSON with --json)."""
    unwind_on_sigterm()  # a stopped benchmark stops the minions and stacks it started


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
    """Start the whole stack, run the image pipeline under every policy, the fork/join and the
    AR video, print a summary."""
    from cdiflow.demo import run_demo

    report = run_demo(data_dir=data_dir, as_json=as_json, port=port)
    if report["failed"]:
        raise SystemExit(1)
