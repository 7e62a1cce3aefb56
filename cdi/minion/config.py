"""Minion configuration."""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass, field

import psutil

from cdi.errors import ConfigError
from cdi.minion.names import NameRule
from cdi.protocol import Isolation
from cdi.url import default_socket_path

__all__ = ["MinionConfig", "check_socket_dir", "parse_bytes"]

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
}


def parse_bytes(text: str) -> int:
    """Parse ``"10MB"``, ``"512KiB"`` or ``"4096"`` into bytes (decimal units, as in the paper)."""
    raw = text.strip().upper().replace(" ", "")
    digits = raw.rstrip("KMGIB")
    unit = raw[len(digits) :]
    if unit not in _UNITS or not digits:
        raise ConfigError(f"cannot read {text!r} as a size; write e.g. 4096, 10KB, 1MB or 2GiB")
    try:
        value = float(digits)
    except ValueError as exc:
        raise ConfigError(f"cannot read {text!r} as a size; write e.g. 10KB or 1MB") from exc
    if value < 0:
        raise ConfigError(f"size {text!r} must not be negative")
    return int(value * _UNITS[unit])


def check_socket_dir(socket_path: str) -> None:
    """Refuse a socket folder that another user controls: its owner could swap our socket
    for one of its own, and every client would hand it its objects (a folder in /tmp made
    first by someone else, say). Ours or root's it must be, and writable by others only if
    sticky. A missing folder is made by the minion, ours."""
    folder = os.path.dirname(socket_path)
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return
    mine = st.st_uid in (os.geteuid(), 0)
    open_to_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX
    if not mine or open_to_others:
        raise ConfigError(
            f"the socket folder {folder} belongs to uid {st.st_uid} (mode "
            f"{stat.S_IMODE(st.st_mode):o}): whoever controls it could put another socket in "
            "the minion's place; use a folder of your own (--socket, CDI_SOCKET)"
        )


def _default_memory_limit() -> int:
    return int(psutil.virtual_memory().total // 2)


@dataclass
class MinionConfig:
    """How one minion runs."""

    socket_path: str = field(default_factory=default_socket_path)
    """Unix socket local containers connect to; its directory is what a pod mounts."""
    host: str = field(default_factory=socket.gethostname)
    """Name of this host in the CDI controller's directory."""
    memory_limit: int = field(default_factory=_default_memory_limit)
    """Upper bound on all segment bytes this minion holds (objects and warm pool)."""
    max_object: int = 1 << 30
    """Largest single object, in bytes."""
    idle_limit: int | None = None
    """Bytes of released segments kept warm for reuse; default a quarter of ``memory_limit``."""
    isolation: Isolation = Isolation.COOPERATIVE
    """Default isolation for objects that do not ask for one."""
    prewarm: dict[int, int] = field(default_factory=dict)
    """Object size -> number of segments to allocate at start-up."""
    controller_url: str | None = None
    """``grpc://host:port`` of the CDI controller; ``None`` runs the minion on its own."""
    controller_token: str | None = field(default=None, repr=False)
    """This host's token for the controller (``cdi.auth``): it proves the minion speaks for
    ``host``. Needed with ``controller_url``."""
    rpc_address: str = ""
    """Where other hosts' gateways reach this host's (``host:port``); empty: no transfers
    between hosts. Reported to the controller, whose directory routes transfers by it."""
    busy_poll_us: int = 1000
    """After a container starts waiting in ``access()``, poll (burning CPU) this long before
    sleeping, so the hand-off does not pay a process wake-up; 0 disables."""
    socket_mode: int = 0o660
    """Permissions of the socket file: the minion's uid and the socket's group connect."""
    socket_group: int | None = None
    """Group of the socket file (``--socket-group``): the containers' processes join it. None:
    the minion's own group."""
    names: tuple[NameRule, ...] = ()
    """Which uid may register which container ids (``--names``, see ``cdi.minion.names``);
    an id no rule matches may be registered only by the minion's own uid."""
    state_dir: str | None = None
    """Folder of the minion's journal (``--state-dir``): its objects then outlive its process
    (a crash, a kill, an upgrade) but not a reboot (docs/minion-restart.md). None: a minion
    that stops loses its objects."""
    term_keeps: bool = False
    """With a state folder (``--term-keeps``): SIGTERM stops the minion for a restart, keeping
    its objects, as SIGUSR2 does; SIGINT still stops for good. For a container, whose runtime
    sends SIGTERM to restart it: how long the objects live is then its storage's to decide."""

    def __post_init__(self) -> None:
        if self.memory_limit <= 0:
            raise ConfigError("memory_limit must be positive")
        if self.max_object <= 0 or self.max_object > self.memory_limit:
            raise ConfigError(
                f"max_object ({self.max_object}) must be positive and at most memory_limit "
                f"({self.memory_limit})"
            )
        if self.idle_limit is None:
            self.idle_limit = self.memory_limit // 4
        if not os.path.isabs(self.socket_path):
            self.socket_path = os.path.abspath(self.socket_path)
        if self.term_keeps and self.state_dir is None:
            raise ConfigError("term_keeps needs a state folder (--state-dir): nothing is kept")
        if self.state_dir is not None and not os.path.isabs(self.state_dir):
            self.state_dir = os.path.abspath(self.state_dir)
        if len(self.socket_path.encode()) > 107:
            raise ConfigError(f"socket path {self.socket_path!r} is longer than Unix sockets allow")
