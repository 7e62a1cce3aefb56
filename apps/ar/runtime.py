"""What a run needs around its roles: where each runs, and the CDI minions it talks to.

On one host every role runs beside the launcher, and a CDI backend gets a minion of its own
unless the configuration names one. Across two hosts (``cdi.hosts``: network namespaces, or
loopback addresses where none can be made) the extractor and the combinator run on the first
host and the detectors on the second, so every frame crosses the link twice, whatever the
backend: to its detector, and on to the combinator. The CDI backends then get a cluster (a
controller, and per host a minion with its gateway: ``cdi.cluster``) of their own.

The processes of the CDI runtime a run started (minions, gateways, the controller) are given
to the launcher, which counts their CPU and memory as the ``minion`` role's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from apps.ar.config import RunConfig, Site
from apps.ar.links import backend
from cdi.cluster import LocalCluster
from cdi.hosts import HostNetwork
from cdi.minion.process import MinionChild

__all__ = ["HOST_OF_ROLE", "Prepared", "prepare", "spread"]

HOST_OF_ROLE = {"extractor": 0, "combinator": 0, "detector": 1}
"""Across hosts: which host (0 or 1) each role runs on."""


@dataclass
class Prepared:
    """A configuration ready to run, and the CDI runtime's processes it uses."""

    config: RunConfig
    runtime_pids: list[int] = field(default_factory=list)


def spread(network: HostNetwork, minions: Sequence[str] = ("", "")) -> dict[str, Site]:
    """The roles over the first two hosts of ``network`` (``HOST_OF_ROLE``), each with the
    minion socket of its host in ``minions``."""
    return {role: Site(network.hosts[host], minions[host]) for role, host in HOST_OF_ROLE.items()}


@contextmanager
def prepare(
    config: RunConfig,
    network: HostNetwork | None = None,
    minion_args: Sequence[str] = (),
) -> Iterator[Prepared]:
    """``config`` with its roles placed and its minions running: on ``network``'s hosts when
    given, else on this one. A CDI backend on one host uses ``config.minion`` if it names one,
    else a minion started here with ``minion_args``; across hosts, a cluster started here.
    Everything started here stops on exit."""
    hosts = 1 if network is None else 2
    needs_minion = backend(config.backend, hosts).needs_minion
    with tempfile.TemporaryDirectory(prefix="ar-runtime-") as folder:
        if network is None and (not needs_minion or config.minion):
            yield Prepared(config)
        elif network is None:
            socket_path = str(Path(folder) / "minion.sock")
            with MinionChild(socket_path, *minion_args) as minion:
                yield Prepared(replace(config, minion=socket_path), [minion.pid])
        elif not needs_minion:
            yield Prepared(replace(config, placement=spread(network)))
        else:
            with LocalCluster.start(2, folder, *minion_args, network=network) as cluster:
                sockets = [m.socket_path for m in cluster.minions]
                pids = [*(m.pid for m in cluster.minions), cluster.controller.pid]
                yield Prepared(replace(config, placement=spread(network, sockets)), pids)
