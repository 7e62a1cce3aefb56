"""CDI-RDMA: the device probe and the transport seam's RDMA entry.

What exists: ``probe()`` finds RDMA devices the way rdma-core does (``/sys/class/infiniband``)
and whether ``pyverbs`` (rdma-core's Python bindings, a distribution package, not on PyPI in a
usable form) can be imported. ``RdmaTransport()`` refuses with the reason when either is
missing. What does not exist: the RDMA data path (registering the destination mapping,
exchanging queue-pair details over the TCP control stream, an RDMA WRITE and its completion).
No machine this project runs on has an RDMA device or Soft-RoCE, so it could never have been
run; it is not built, and ``RdmaTransport()`` says so even where a device exists.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from dataclasses import dataclass

from cdi.errors import ConfigError

__all__ = ["RdmaProbe", "RdmaTransport", "probe"]

SYSFS = "/sys/class/infiniband"


@dataclass(frozen=True)
class RdmaProbe:
    devices: tuple[str, ...]
    pyverbs: bool

    @property
    def usable(self) -> bool:
        return bool(self.devices) and self.pyverbs

    def reason(self) -> str:
        if not self.devices:
            return f"this host has no RDMA device ({SYSFS} is empty or absent)"
        if not self.pyverbs:
            return (
                f"RDMA devices {', '.join(self.devices)} exist but pyverbs cannot be imported "
                "(install rdma-core's python3-pyverbs)"
            )
        return f"RDMA devices: {', '.join(self.devices)}"


def probe(sysfs: str = SYSFS) -> RdmaProbe:
    """Which RDMA devices this host has, and whether pyverbs is importable."""
    try:
        devices = tuple(sorted(os.listdir(sysfs)))
    except OSError:
        devices = ()
    return RdmaProbe(devices, importlib.util.find_spec("pyverbs") is not None)


class RdmaTransport:
    """The seam's RDMA entry: refuses, saying why, until its data path exists and has run."""

    name = "rdma"

    def __init__(self, sysfs: str = SYSFS) -> None:
        found = probe(sysfs)
        if not found.usable:
            raise ConfigError(f"RDMA transfers were asked for, but {found.reason()}; use tcp")
        raise ConfigError(
            f"{found.reason()}, but this release has no RDMA data path (it has never run on "
            "an RDMA device); use tcp"
        )

    def connect(self, address: str, timeout: float) -> socket.socket:
        raise AssertionError("unreachable: RdmaTransport() refuses")

    def listen(self, address: str) -> socket.socket:
        raise AssertionError("unreachable: RdmaTransport() refuses")
