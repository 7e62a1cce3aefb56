"""``cdiflow cdi controller``: run the CDI controller in the foreground."""

from __future__ import annotations

import logging

import click

from cdi.controller.server import run
from cdi.errors import CDIError

__all__ = ["DEFAULT_LISTEN", "controller_command"]

DEFAULT_LISTEN = "127.0.0.1:50051"


@click.command("controller")
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    help="host:port to serve the cdi.v1.Controller gRPC service on.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
def controller_command(listen: str, log_level: str) -> None:
    """Run the CDI controller (soft-state directory of minions, containers and objects).

    Stops cleanly on SIGTERM or SIGINT.
    """
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        run(listen)
    except CDIError as exc:
        raise click.ClickException(str(exc)) from exc
