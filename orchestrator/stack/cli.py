"""``cdiflow up`` / ``down`` / ``status``: the whole stack on this machine.

Imports stay light (``Stack`` loads inside ``up``): ``cdiflow`` imports this on every run.
``cdiflow`` mounts ``up_command``, ``down_command`` and ``status_command``;
``python -m orchestrator.stack`` offers the same commands plus the internal ``supervise``,
the process ``up`` starts (in a session of its own) to run the stack.
"""

from __future__ import annotations

import json
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from cdi.child import ChildProcess
from orchestrator.apikeys import read_key_file
from orchestrator.errors import OrchestratorError
from orchestrator.logs import LOG_FORMAT_ENV, LOG_FORMATS, setup_logging
from orchestrator.stack.access import service_access
from orchestrator.stack.control import (
    check_no_leftovers,
    failure_report,
    launch_supervisor,
    stop_stack,
    wait_until_up,
)
from orchestrator.stack.defaults import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_WORKERS
from orchestrator.stack.state import (
    DataDirLock,
    StackState,
    format_table,
    read_state,
    running_message,
)

if TYPE_CHECKING:
    from cdi.link_emulator import Link

__all__ = ["down_command", "stack_cli", "status_command", "up_command"]

_F = TypeVar("_F", bound=Callable[..., Any])

_COMMAND_HELP = (
    "Command line to run instead of the real {what} (tests, debugging); {{python}}, {{id}}, "
    "{{host}} and {{port}} are replaced."
)


def _data_dir_option(f: _F) -> _F:
    return click.option(
        "--data-dir",
        envvar="CDIFLOW_DATA_DIR",
        default=".data",
        show_default=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Folder with the services' data, the logs and stack.json [env: CDIFLOW_DATA_DIR].",
    )(f)


def _stack_options(f: _F) -> _F:
    options = [
        click.option("--workers", "-w", type=click.IntRange(min=0), default=DEFAULT_WORKERS,
                     show_default=True, help="Number of worker processes."),
        click.option("--hosts", type=click.IntRange(1, 16), default=1, show_default=True,
                     help="CDI hosts on this machine, each a network namespace (as root; "
                     "loopback addresses otherwise) with its own minion; workers are spread "
                     "over them and run in their host's namespace (with `nft`), objects cross "
                     "between them."),
        click.option("--link-mbit", type=click.FloatRange(min=1.0), default=None,
                     help="--hosts: cap the bandwidth between the hosts (tbf), e.g. 1000."),
        click.option("--link-rtt-ms", type=click.FloatRange(min=0.0), default=None,
                     help="--hosts: add this round trip between the hosts, e.g. 0.5 (every "
                     "connection between them, workers' to the services included)."),
        click.option("--host", default=DEFAULT_HOST, show_default=True,
                     help="Address the REST API listens on."),
        click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT,
                     show_default=True, help="Port the REST API listens on."),
        click.option("--api-command", hidden=True, help=_COMMAND_HELP.format(what="API")),
        click.option("--scheduler-command", hidden=True,
                     help=_COMMAND_HELP.format(what="scheduler")),
        click.option("--worker-command", hidden=True, help=_COMMAND_HELP.format(what="worker")),
        click.option("--tasks", "tasks", multiple=True, type=click.Path(),
                     metavar="FOLDER|FILE.py|MODULE",
                     help="Your task code, loaded by every worker (repeatable): a folder, a .py "
                     "file or an installed module; see `cdiflow worker --help`."),
        click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text",
                     show_default=True, envvar=LOG_FORMAT_ENV,
                     help="The API's, scheduler's and workers' logs: text, or one JSON object "
                     "a line with the workflow and task ids."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


def _folder(data_dir: Path) -> Path:
    return data_dir.expanduser().absolute()


@click.command("up")
@_data_dir_option
@_stack_options
@click.option("--detach", "-d", is_flag=True, help="Run in the background; stop with `down`.")
@click.option("--timeout", type=float, default=300.0, show_default=True,
              help="Seconds to wait for every piece to answer.")  # fmt: skip
def up_command(
    data_dir: Path,
    workers: int,
    hosts: int,
    link_mbit: float | None,
    link_rtt_ms: float | None,
    host: str,
    port: int,
    api_command: str | None,
    scheduler_command: str | None,
    worker_command: str | None,
    tasks: tuple[str, ...],
    log_format: str,
    detach: bool,
    timeout: float,
) -> None:
    """Start cdiflow on this machine: Postgres, Redis and S3 (embedded unless DATABASE_URL,
    REDIS_URL, S3_ENDPOINT_URL are set), the CDI controller and minion, the REST API, the
    scheduler and the workers. Ctrl-C stops everything in reverse order."""
    from orchestrator.stack.stack import Stack  # here: `cdiflow --help` need not load it

    folder = _folder(data_dir)
    try:  # refuse now, with a clear message, what the supervisor would refuse later
        stack = Stack(folder, workers=workers, hosts=hosts, host=host, port=port, tasks=tasks,
                      log_format=log_format, link=_link(link_mbit, link_rtt_ms))  # fmt: skip
        stack.preflight()
        check_no_leftovers(folder)
    except OrchestratorError as exc:
        raise click.ClickException(str(exc)) from exc
    options = ["--workers", str(workers), "--hosts", str(hosts), "--host", host,
               "--port", str(port), "--log-format", log_format]  # fmt: skip
    for flag, number in (("--link-mbit", link_mbit), ("--link-rtt-ms", link_rtt_ms)):
        if number is not None:
            options += [flag, str(number)]
    for source in stack.tasks:  # made absolute: the supervisor may not share our directory
        options += ["--tasks", source]
    for flag, value in (("--api-command", api_command), ("--scheduler-command", scheduler_command),
                        ("--worker-command", worker_command)):  # fmt: skip
        if value is not None:
            options += [flag, value]
    proc = launch_supervisor(folder, options, detach=detach)
    stop_requested = _forward_stop_signals(proc)
    try:
        state = wait_until_up(proc, folder, timeout)
    except OrchestratorError as exc:
        raise click.ClickException(str(exc)) from exc
    if state is None:
        if stop_requested.is_set():
            raise click.ClickException("stopped before the stack was up")
        if detach:
            raise click.ClickException(failure_report(proc, folder))
        raise click.ClickException("the stack did not start; see the messages above")
    click.echo(_summary(state, folder))
    if detach:
        click.echo(f"\nRunning in the background. Stop it with: cdiflow down --data-dir {folder}")
        return
    click.echo("\nPress Ctrl-C to stop.")
    proc.wait()
    status = proc.returncode
    if status != 0:
        raise click.ClickException(f"the stack's supervisor exited with status {status}")
    click.echo("stack stopped")


@click.command("down")
@_data_dir_option
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds the stack gets to stop before what is left is killed.")  # fmt: skip
def down_command(data_dir: Path, timeout: float) -> None:
    """Stop the stack started by `cdiflow up` (foreground or detached) from this data folder."""
    folder = _folder(data_dir)
    try:
        state = stop_stack(folder, timeout)
    except OrchestratorError as exc:
        raise click.ClickException(str(exc)) from exc
    if state is None:
        if DataDirLock(folder).held_elsewhere():
            raise click.ClickException(running_message(folder))
        click.echo(f"no cdiflow stack is running from {folder}")
        return
    click.echo(f"stopped the stack in {folder} ({len(state.processes)} processes)")


@click.command("status")
@_data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def status_command(data_dir: Path, as_json: bool) -> None:
    """Show the stack running from this data folder (exit status 1 when none runs)."""
    folder = _folder(data_dir)
    try:
        state = read_state(folder)
    except OrchestratorError as exc:
        raise click.ClickException(str(exc)) from exc
    running = state.supervisor.alive() if state else DataDirLock(folder).held_elsewhere()
    if as_json:
        report: dict[str, Any] = {"running": running, "data_dir": str(folder)}
        if state is not None:
            report |= asdict(state)
            report["supervisor"]["alive"] = running
            for row, proc in zip(report["processes"], state.processes, strict=True):
                row["alive"] = proc.alive()
            report |= _api_key(state)
            if (access := service_access(folder, state)) is not None:
                report["credentials"] = access
        click.echo(json.dumps(report))
    elif state is None:
        click.echo(running_message(folder) if running else f"no stack runs from {folder}")
    else:
        if running:
            click.echo(f"cdiflow stack in {folder}, up since {state.started_at}")
        else:
            click.echo(f"stale stack.json in {folder}: the supervisor (pid "
                       f"{state.supervisor.pid}) is gone; `cdiflow down` cleans up")  # fmt: skip
        click.echo(format_table((state.supervisor, *state.processes), folder, show_state=True))
        if (access := service_access(folder, state)) is not None:
            click.echo(_access_text(access))
    sys.exit(0 if running else 1)


@click.command("supervise", hidden=True)
@_data_dir_option
@_stack_options
@click.option("--log-file", type=click.Path(path_type=Path), default=None, hidden=True)
def supervise_command(
    data_dir: Path,
    workers: int,
    hosts: int,
    link_mbit: float | None,
    link_rtt_ms: float | None,
    host: str,
    port: int,
    api_command: str | None,
    scheduler_command: str | None,
    worker_command: str | None,
    tasks: tuple[str, ...],
    log_format: str,
    log_file: Path | None,
) -> None:
    """Run the stack in this process until SIGTERM/SIGINT (what `up` starts)."""
    from orchestrator.stack.daemon import run_supervisor

    setup_logging(
        "INFO",
        log_format,
        process="supervisor",
        text="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    commands = {
        "api_command": api_command,
        "scheduler_command": scheduler_command,
        "worker_command": worker_command,
    }
    overrides = {key: shlex.split(value) for key, value in commands.items() if value}
    status = run_supervisor(
        _folder(data_dir),
        log_file=log_file,
        workers=workers,
        hosts=hosts,
        link=_link(link_mbit, link_rtt_ms),
        host=host,
        port=port,
        tasks=tasks,
        log_format=log_format,
        **overrides,
    )
    sys.exit(status)


def _link(mbit: float | None, rtt_ms: float | None) -> Link:
    """The link between the hosts: none emulated unless asked for (only the workers'
    connections to the services are carried)."""
    from cdi.link_emulator import SERVICES_ONLY, Link

    if mbit is None and rtt_ms is None:
        return SERVICES_ONLY
    return Link(mbit=mbit, rtt_ms=rtt_ms or 0.0)


@click.group("stack")
def stack_cli() -> None:
    """Run cdiflow on this machine (also mounted as `cdiflow up/down/status`)."""


for _command in (up_command, down_command, status_command, supervise_command):
    stack_cli.add_command(_command)


def _summary(state: StackState, folder: Path) -> str:
    head = f"cdiflow is up: API {state.api_url}  (data and logs in {folder})"
    table = format_table((state.supervisor, *state.processes), folder)
    if state.api_key_file:
        key = (
            f"\nThe API needs a key. The admin key is in {state.api_key_file} (readable by you "
            f'alone); use it as\n  curl -H "Authorization: Bearer $(cat {state.api_key_file})" '
            f"{state.api_url}/api/workflows\nand sign in to the dashboard ({state.api_url}/) "
            "with it. `cdiflow status --json` shows it as api_key."
        )
    else:
        key = "\nThe API needs a key: the admin key is the one configured (CDIFLOW_ADMIN_KEY)."
    return f"{head}\n{table}\n{key}"


def _api_key(state: StackState) -> dict[str, str]:
    """``api_key`` for whoever may read the key file (its owner), else why it is missing."""
    if not state.api_key_file:
        return {"api_key_error": "the stack uses a configured admin key (CDIFLOW_ADMIN_KEY)"}
    try:
        return {"api_key": read_key_file(Path(state.api_key_file))}
    except OrchestratorError as exc:
        return {"api_key_error": str(exc)}


def _access_text(access: dict[str, Any]) -> str:
    """The embedded services' credentials as lines (only their owner gets this far)."""
    lines = [f"\ncredentials of the embedded services (from {access['file']}, yours only):"]
    for label, key in (("DATABASE_URL", "database_url"), ("REDIS_URL", "redis_url")):
        if key in access:
            lines.append(f"  {label}={access[key]}")
    if s3 := access.get("s3"):
        lines += [
            f"  S3_ENDPOINT_URL={s3['endpoint_url']}",
            f"  AWS_ACCESS_KEY_ID={s3['access_key_id']}",
            f"  AWS_SECRET_ACCESS_KEY={s3['secret_access_key']}",
        ]
    return "\n".join(lines)


def _forward_stop_signals(proc: ChildProcess) -> threading.Event:
    """Turn Ctrl-C, SIGTERM and SIGHUP into a SIGTERM for the supervisor, which stops the
    stack in order; we keep waiting for it. The returned event is set once one arrived."""
    requested = threading.Event()

    def forward(_signum: int, _frame: FrameType | None) -> None:
        requested.set()
        proc.send_signal(signal.SIGTERM)  # a no-op once it has exited and been reaped

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    return requested
