"""``cdiflow cdi credentials DIR``: make a CDI cluster's keys and tokens (``cdi.auth``)."""

from __future__ import annotations

from pathlib import Path

import click

from cdi.auth import (
    ANY_HOST,
    CLUSTER_KEY_ENV,
    CONTROLLER_TOKEN_ENV,
    GATEWAY_KEY_ENV,
    ClusterCredentials,
)
from cdi.errors import CDIError

__all__ = ["credentials_command"]


@click.command("credentials")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--host",
    "hosts",
    multiple=True,
    metavar="NAME",
    help="Write a minion token for this host (repeatable): the name its minion announces "
    "(--host, default the machine's host name).",
)
@click.option(
    "--any-host",
    is_flag=True,
    help="Write a minion token that may speak for any host (where each node cannot be given "
    "its own, e.g. a DaemonSet's one Secret): weaker, see docs/security.md.",
)
def credentials_command(folder: Path, hosts: tuple[str, ...], any_host: bool) -> None:
    """Make the CDI cluster's keys in FOLDER (kept if there) and the tokens asked for, each
    a file of mode 0600. Nothing secret is printed: hand each file to its process, as a file
    or in the environment variable named below (a Kubernetes Secret, for instance)."""
    try:
        made = ClusterCredentials.ensure(folder, [*hosts, *([ANY_HOST] if any_host else [])])
    except CDIError as exc:
        raise click.ClickException(str(exc)) from exc
    rows = [
        (made.cluster_key_file, f"the controller: {CLUSTER_KEY_ENV}[_FILE]"),
        (made.gateway_key_file, f"every minion with --rpc-listen: {GATEWAY_KEY_ENV}[_FILE]"),
        (made.reader_token_file, f"a reader (the API): {CONTROLLER_TOKEN_ENV}[_FILE]"),
    ]
    for host in (*hosts, *([ANY_HOST] if any_host else [])):
        what = "any host's minion" if host == ANY_HOST else f"the minion of host {host}"
        rows.append((made.minion_token_file(host), f"{what}: {CONTROLLER_TOKEN_ENV}[_FILE]"))
    for path, use in rows:
        click.echo(f"{path}  ->  {use}")
