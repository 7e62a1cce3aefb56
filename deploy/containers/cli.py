"""``cdiflow containers``: build the images, run the stack as containers, strike it."""

from __future__ import annotations

import click

from deploy.containers.errors import ContainerError

__all__ = ["containers_group"]


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
