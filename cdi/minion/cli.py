"""``cdiflow cdi minion``: run this host's minion in the foreground."""

from __future__ import annotations

import grp
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from cdi.auth import (
    CONTROLLER_TOKEN_ENV,
    GATEWAY_KEY_ENV,
    Role,
    check_key,
    check_token,
    read_secret,
    read_secret_file,
)
from cdi.errors import ConfigError
from cdi.minion import launcher
from cdi.minion.config import MinionConfig, check_socket_dir, parse_bytes
from cdi.minion.names import parse_names
from cdi.protocol import Isolation
from cdi.remote.transport import TRANSPORTS
from cdi.url import default_socket_path

if TYPE_CHECKING:
    from cdi.controller.reporter import DirectoryReporter
    from cdi.remote.gateway import Gateway

__all__ = ["minion_command", "require_binary"]

BATCHED_LINGER_S = 0.02  # the reporter's wait for more events: the binary's already merged


def _prewarm(spec: str) -> dict[int, int]:
    """``"1MB:4,10MB:2"`` -> {1000000: 4, 10000000: 2}."""
    result: dict[int, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        size, _, count = part.partition(":")
        if not (count or "1").isdigit():
            raise ConfigError(f"--prewarm {part!r}: write SIZE:COUNT, e.g. 1MB:4")
        result[parse_bytes(size)] = int(count or 1)
    return result


def reporter_factory(config: MinionConfig) -> Callable[[], DirectoryReporter] | None:
    """How to make the directory reporter, if a controller is configured."""
    url = config.controller_url
    if not url:
        return None

    def make() -> DirectoryReporter:
        from cdi.controller.reporter import GrpcDirectoryReporter

        # The binary already lets objects' events linger and merges them (its
        # --events-linger-ms): its batches go to the controller after a short wait only.
        return GrpcDirectoryReporter(
            url, config.host, config.socket_path, config.rpc_address,
            linger_s=BATCHED_LINGER_S, token=config.controller_token,
        )  # fmt: skip

    return make


def _config(
    socket_path: str,
    host: str | None,
    controller_url: str | None,
    controller_token_file: Path | None,
    memory_limit: str | None,
    max_object: str,
    isolation: str,
    prewarm: str,
    busy_poll_us: int,
    names: str,
    socket_group: str | None,
    state_dir: Path | None = None,
    term_keeps: bool = False,
) -> MinionConfig:
    """The command's options, checked: ``ConfigError`` says what is wrong."""
    extra: dict[str, Any] = {}
    if host:
        extra["host"] = host
    if memory_limit:
        extra["memory_limit"] = parse_bytes(memory_limit)
    token = None
    if controller_url:
        token = _secret(controller_token_file, CONTROLLER_TOKEN_ENV, "controller token")
        if token is None:
            raise ConfigError(
                "--controller: the minion proves itself to the controller with its host's "
                f"token; give it --controller-token-file (${CONTROLLER_TOKEN_ENV}_FILE) or "
                f"${CONTROLLER_TOKEN_ENV} (`cdiflow cdi credentials` makes them)"
            )
        token = check_token(token, Role.MINION)  # a placeholder is refused before anything runs
    return MinionConfig(
        socket_path=socket_path,
        max_object=parse_bytes(max_object),
        isolation=Isolation(isolation),
        controller_url=controller_url,
        controller_token=token,
        prewarm=_prewarm(prewarm),
        busy_poll_us=busy_poll_us,
        names=parse_names(names),
        socket_group=_group(socket_group) if socket_group else None,
        state_dir=str(state_dir) if state_dir is not None else None,
        term_keeps=term_keeps,
        **extra,
    )


def _secret(path: Path | None, variable: str, what: str) -> str | None:
    """A secret from its file option, else from ``$variable`` (never from the command line)."""
    if path is not None:
        return read_secret_file(path, what=what)
    return read_secret(variable, what=what)


def _group(name: str) -> int:
    """A group name or number as a gid."""
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"--socket-group {name!r}: no such group on this machine") from None


def require_binary() -> str:
    """The minion's binary; ``ConfigError`` saying how to get it where there is none."""
    binary = launcher.find_binary()
    if binary is None:
        raise ConfigError(launcher.missing_binary())
    return binary


F = TypeVar("F", bound=Callable[..., Any])


def _gateway_side(side: str, does: str, native: str) -> Callable[[F], F]:
    """``--gateway-inbound`` or ``--gateway-outbound``: the minion itself, or Python."""
    return click.option(
        f"--gateway-{side}",
        type=click.Choice(["native", "python"]),
        default="native",
        show_default=True,
        envvar=f"CDI_GATEWAY_{side.upper()}",
        help=f"Who {does}: the minion itself ({native}), or the gateway's Python process "
        "(kept to compare the two).",
    )


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
@click.option(
    "--controller-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar=f"{CONTROLLER_TOKEN_ENV}_FILE",
    show_envvar=True,
    help=f"This host's token for the controller (mode 0600; or ${CONTROLLER_TOKEN_ENV}): "
    "with --controller.",
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
    "--names",
    default="",
    envvar="CDI_MINION_NAMES",
    help="Which uid may register which container ids, e.g. 'worker-*=10004,sched-*=cdiflow' "
    "(first match decides; ids no rule names: the minion's own uid only).",
)
@click.option(
    "--socket-group",
    default=None,
    envvar="CDI_SOCKET_GROUP",
    help="Group (name or gid) whose members may connect to the socket (mode 0660); default: "
    "the minion's own group.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    envvar="CDI_MINION_STATE_DIR",
    help="Folder for the minion's journal: its objects then outlive a restart of the minion "
    "(in /dev/shm: not a reboot of the host).",
)
@click.option(
    "--term-keeps",
    is_flag=True,
    default=False,
    envvar="CDI_MINION_TERM_KEEPS",
    help="With --state-dir: SIGTERM stops for a restart, keeping the objects (in a container, "
    "whose runtime sends SIGTERM to restart it and whose storage decides how long they live).",
)
@click.option(
    "--busy-poll-us",
    default=1000,
    type=click.IntRange(min=0),
    show_default=True,
    help="Poll this long for a transfer while a container waits in access(); 0: never.",
)
@click.option(
    "--rpc-listen",
    default=None,
    envvar="CDI_RPC_LISTEN",
    help="host:port on which this host's gateway takes objects from other hosts (needs "
    "--controller); omit for one host.",
)
@click.option(
    "--rpc-advertise",
    default=None,
    envvar="CDI_RPC_ADVERTISE",
    help="host:port other hosts dial, when not --rpc-listen (e.g. listening on 0.0.0.0).",
)
@click.option(
    "--transport",
    type=click.Choice(TRANSPORTS),
    default="auto",
    show_default=True,
    envvar="CDI_TRANSPORT",
    help="How objects cross between hosts: tcp; rdma refuses, saying why (no data path yet).",
)
@click.option(
    "--gateway-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar=f"{GATEWAY_KEY_ENV}_FILE",
    show_envvar=True,
    help=f"The key every gateway of the cluster holds (mode 0600; or ${GATEWAY_KEY_ENV}): "
    "with --rpc-listen.",
)
@_gateway_side("inbound", "receives other hosts' objects", "native, TCP")
@_gateway_side("outbound", "sends objects to other hosts", "native; when it receives too")
@click.option("--log-level", default="INFO", show_default=True)
def minion_command(
    log_level: str,
    rpc_listen: str | None,
    rpc_advertise: str | None,
    transport: str,
    gateway_key_file: Path | None,
    gateway_inbound: str,
    gateway_outbound: str,
    **options: Any,
) -> None:
    """Run this host's CDI minion: it holds every object's memory and enforces ownership."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        config = _config(**options)
        check_socket_dir(config.socket_path)
        binary = require_binary()
        gateway = _gateway(
            config, rpc_listen, rpc_advertise, transport, gateway_key_file,
            gateway_inbound, gateway_outbound,
        )  # fmt: skip
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    if gateway is not None:
        config.rpc_address = gateway.address
    try:
        sys.exit(launcher.run_binary(binary, config, reporter_factory(config), gateway))
    finally:
        if gateway is not None:
            gateway.close()


def _gateway(
    config: MinionConfig,
    listen: str | None,
    advertise: str | None,
    transport: str,
    key_file: Path | None,
    inbound: str = "native",
    outbound: str = "native",
) -> Gateway | None:
    """This host's gateway for transfers between hosts, bound but not started; ``None``
    without ``--rpc-listen``."""
    if not listen:
        if transport == "rdma":
            raise ConfigError("--transport rdma needs --rpc-listen (a host's transfer address)")
        return None
    if not config.controller_url:
        raise ConfigError("--rpc-listen needs --controller: other hosts are found through it")
    key = _secret(key_file, GATEWAY_KEY_ENV, "gateway key")
    if key is None:
        raise ConfigError(
            "--rpc-listen: gateways prove to each other that they belong to the cluster with "
            f"its gateway key; give it --gateway-key-file (${GATEWAY_KEY_ENV}_FILE) or "
            f"${GATEWAY_KEY_ENV} (`cdiflow cdi credentials` makes one)"
        )
    from cdi.remote.gateway import Gateway, GatewayConfig

    return Gateway(
        GatewayConfig(
            minion_socket=config.socket_path,
            host=config.host,
            controller_url=config.controller_url,
            controller_token=config.controller_token,
            key=check_key(key, "gateway key"),
            listen=listen,
            advertise=advertise or "",
            transport=transport,
            socket_mode=config.socket_mode,
            socket_group=config.socket_group,
            inbound=inbound,
            outbound=outbound,
        )
    )
