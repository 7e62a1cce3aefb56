"""``cdiflow cdi minion``: run this host's minion in the foreground."""

from __future__ import annotations

import logging
from typing import Any

import click

from cdi.minion.config import MinionConfig, parse_bytes
from cdi.minion.server import Minion
from cdi.protocol import Isolation
from cdi.url import default_socket_path

__all__ = ["build_minion", "minion_command"]


def _prewarm(spec: str) -> dict[int, int]:
    """``"1MB:4,10MB:2"`` -> {1000000: 4, 10000000: 2}."""
    result: dict[int, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        size, _, count = part.partition(":")
        result[parse_bytes(size)] = int(count or 1)
    return result


def build_minion(config: MinionConfig) -> Minion:
    reporter = None
    if config.controller_url:
        from cdi.controller.reporter import GrpcDirectoryReporter

        reporter = GrpcDirectoryReporter(config.controller_url, config.host, config.socket_path)
    return Minion(config, reporter)


@click.command("minion")
@click.option(
    "--socket",
    "socket_path",
    default=default_socket_path,
    show_default=True,
    help="Unix socket local containers connect to.",
)
@click.option("--host", default=None, help="Host name in the controller's directory.")
@click.option(
    "--controller",
    "controller_url",
    default=None,
    envvar="CDI_CONTROLLER_URL",
    help="grpc://host:port of the CDI controller (omit to run alone).",
)
@click.option("--memory-limit", default=None, help="Cap on all object memory, e.g. 4GiB.")
@click.option("--max-object", default="1GiB", show_default=True, help="Largest object.")
@click.option(
    "--isolation",
    type=click.Choice([i.value for i in Isolation]),
    default=Isolation.COOPERATIVE.value,
    show_default=True,
    help="Default isolation of new objects.",
)
@click.option("--prewarm", default="", help="Warm segments at start, e.g. 1MB:4,10MB:2.")
@click.option(
    "--busy-poll-us",
    default=1000,
    show_default=True,
    help="Poll this long for a transfer while a container waits in access(); 0: never.",
)
@click.option("--log-level", default="INFO", show_default=True)
def minion_command(
    socket_path: str,
    host: str | None,
    controller_url: str | None,
    memory_limit: str | None,
    max_object: str,
    isolation: str,
    prewarm: str,
    busy_poll_us: int,
    log_level: str,
) -> None:
    """Run this host's CDI minion: it holds every object's memory and enforces ownership."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    extra: dict[str, Any] = {}
    if host:
        extra["host"] = host
    if memory_limit:
        extra["memory_limit"] = parse_bytes(memory_limit)
    config = MinionConfig(
        socket_path=socket_path,
        max_object=parse_bytes(max_object),
        isolation=Isolation(isolation),
        prewarm=_prewarm(prewarm),
        controller_url=controller_url,
        busy_poll_us=busy_poll_us,
        **extra,
    )
    minion = build_minion(config)
    minion.install_signal_handlers()
    minion.serve_forever()
