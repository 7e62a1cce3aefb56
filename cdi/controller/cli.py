"""``cdiflow cdi controller``: run the CDI controller in the foreground."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from cdi.auth import CLUSTER_KEY_ENV, read_secret, read_secret_file
from cdi.controller.server import run
from cdi.errors import CDIError, ConfigError

__all__ = ["DEFAULT_LISTEN", "controller_command"]

DEFAULT_LISTEN = "127.0.0.1:50051"


@click.command("controller")
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    envvar="CDI_CONTROLLER_LISTEN",
    show_envvar=True,
    help="host:port to serve the cdi.v1.Controller gRPC service on (this machine only unless "
    "another address is configured).",
)
@click.option(
    "--key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar=f"{CLUSTER_KEY_ENV}_FILE",
    show_envvar=True,
    help=f"The cluster key (mode 0600), which signs every caller's token; or set "
    f"${CLUSTER_KEY_ENV}. Make one with `cdiflow cdi credentials`.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
def controller_command(listen: str, key_file: Path | None, log_level: str) -> None:
    """Run the CDI controller (soft-state directory of minions, containers and objects).

    It answers only callers with a token of this cluster (docs/security.md, *CDI control
    plane*). Stops cleanly on SIGTERM or SIGINT.
    """
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        key = (
            read_secret_file(key_file, what="cluster key")
            if key_file is not None
            else read_secret(CLUSTER_KEY_ENV, what="cluster key")
        )
        if key is None:
            raise ConfigError(
                f"the CDI controller needs the cluster key: --key-file (${CLUSTER_KEY_ENV}_FILE) "
                f"or ${CLUSTER_KEY_ENV}; `cdiflow cdi credentials DIR` makes one"
            )
        run(listen, key=key)
    except CDIError as exc:
        raise click.ClickException(str(exc)) from exc
