"""Faults of one host of a ``--hosts 2`` stack (each host a network namespace, ``cdi.hosts``):
its network cut and mended, and every process on it killed at once.

*The cut* drops every packet the host sends or receives over the network, in its own
namespace (``nft``): on its link to the bridge (the other host, the root namespace) and on the
link emulator's port on its loopback, through which its processes reach Postgres, Redis and S3
(``cdi.link_emulator``). Connections stay open, as across a failed switch: TCP sends again
until the cut mends or a timeout of the application's gives up. Its processes still reach one
another (the worker its minion, by a Unix socket).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Final

from cdi.hosts import Host
from cdi.link_emulator import PORT

__all__ = ["cut", "kill_all_on", "mend", "processes_on"]

_TABLE: Final = "cdichaos"


def cut(host: Host) -> None:
    """Cut ``host`` off the network (see the module's docstring) until ``mend``."""
    rules = (
        f"table inet {_TABLE} {{\n"
        " chain output {\n"
        "  type filter hook output priority 0; policy accept;\n"
        '  oifname "eth0" drop\n'
        f"  tcp dport {PORT} drop\n"
        f"  tcp sport {PORT} drop\n"
        " }\n"
        " chain input {\n"
        "  type filter hook input priority 0; policy accept;\n"
        '  iifname "eth0" drop\n'
        " }\n"
        "}\n"
    )
    subprocess.run(_nft(host, "-f", "-"), input=rules.encode(), check=True, capture_output=True,
                   timeout=30)  # fmt: skip


def mend(host: Host) -> None:
    """Take the cut away (nothing to do if there is none)."""
    subprocess.run(_nft(host, "delete", "table", "inet", _TABLE), capture_output=True, timeout=30)


def processes_on(host: Host) -> list[int]:
    """The PIDs of every process in ``host``'s network namespace."""
    namespace = _namespace(host)
    inside = os.stat(f"/run/netns/{namespace}")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(entry / "ns" / "net")
        except OSError:  # gone meanwhile, or not ours to look at
            continue
        if (ns.st_dev, ns.st_ino) == (inside.st_dev, inside.st_ino):
            found.append(int(entry.name))
    return found


def kill_all_on(host: Host) -> list[int]:
    """SIGKILL every process on ``host``, all in one go; their PIDs."""
    pids = processes_on(host)
    if not pids:
        raise RuntimeError(f"no process runs on {host.name} ({host.namespace})")
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return pids


def _nft(host: Host, *args: str) -> list[str]:
    return ["ip", "netns", "exec", _namespace(host), "nft", *args]


def _namespace(host: Host) -> str:
    if host.namespace is None:
        raise RuntimeError(
            f"{host.name} is a loopback address, not a network namespace: cutting or killing a "
            "host needs namespaces (root and the `ip` command) and `nft`"
        )
    return host.namespace
