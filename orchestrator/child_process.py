"""The free ports a child of the orchestrator or its harness may listen on.

The children themselves (the embedded services, the stack's API, scheduler and workers, the
load tests' peers) are ``cdi.child.ChildProcess``es: one class for every child cdiflow starts,
kept in ``cdi``, which imports nothing of the orchestrator.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Final

__all__ = ["free_port", "port_is_free"]


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (with SO_REUSEADDR, as servers set it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


_LISTEN_FLOOR: Final = 20000  # free ports are drawn from here up to the ephemeral range


def _ephemeral_floor() -> int:
    """The lowest port the kernel gives the local end of an outgoing connection."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now, for a child to listen on. Drawn at random below
    the kernel's ephemeral range: a port from that range (what binding port 0 returns) may
    become the local end of any process's outgoing connection before the child binds it, and
    then the child cannot listen there. Another process may still take ours first."""
    top = _ephemeral_floor()
    if top - _LISTEN_FLOOR >= 1000:
        for _ in range(50):
            port = random.randrange(_LISTEN_FLOOR, top)
            if port_is_free(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        chosen: int = sock.getsockname()[1]
        return chosen
