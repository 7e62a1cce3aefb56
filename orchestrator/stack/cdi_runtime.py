"""The stack's CDI runtime: a controller and one minion, or a minion with a gateway per host."""

from __future__ import annotations

import logging
import socket
import subprocess
from pathlib import Path

from cdi.auth import ClusterCredentials
from cdi.cluster import LocalCluster
from cdi.controller.process import ControllerChild
from cdi.errors import CDIError
from cdi.hosts import Host, HostNetwork
from cdi.link_emulator import SERVICES_ONLY, Link
from cdi.minion.process import MinionChild
from cdi.minion.state import discard_kept
from orchestrator.child_process import free_port
from orchestrator.errors import StackError
from orchestrator.stack.defaults import MINION_STATE, minion_state_folders
from orchestrator.stack.supervised import CdiProcess

__all__ = ["CdiRuntime"]

log = logging.getLogger(__name__)


class CdiRuntime:
    """``hosts`` 1: a controller and a minion on this machine. More: each host a network
    namespace (or a loopback address) with its minion and gateway (``cdi.cluster``);
    host ``n``'s minion socket is ``<data>/cdi/host<n>/minion.sock``. Its processes are
    ``CdiProcess``es, which the stack's supervisor restarts."""

    def __init__(
        self,
        data_dir: Path,
        logs_dir: Path,
        hosts: int,
        network: HostNetwork | None = None,
        link: Link | None = SERVICES_ONLY,
    ) -> None:
        """``network``: the hosts to use (left in place at stop), instead of making them;
        else the hosts made get ``link`` (``None``: none, and the orchestrator's processes
        all stay in the root namespace)."""
        self.hosts = hosts
        self.network = network
        self.link = link
        self.folder = data_dir / "cdi"
        self.logs_dir = logs_dir
        self.controller_url = ""  # a free port is picked at start
        self.controller: CdiProcess | None = None
        self.minions: list[CdiProcess] = []
        self.emulator: CdiProcess | None = None  # the link between the hosts, if we made one
        self._cluster: LocalCluster | None = None

    @property
    def credentials_folder(self) -> Path:
        """The cluster's keys and tokens (``cdi.auth``; ``LocalCluster`` keeps them there
        too)."""
        return self.folder / "credentials"

    @property
    def reader_token_file(self) -> Path:
        """The token that lets the API read the controller's directory."""
        return ClusterCredentials(self.credentials_folder).reader_token_file

    def socket_of(self, host: str = "host1") -> str:
        """The minion socket of ``host`` (``host1``, ...)."""
        if self.hosts == 1:
            return str(self.folder / "minion.sock")
        return str(self.folder / host / "minion.sock")

    def host_of(self, host: str) -> Host | None:
        """``host`` as a network namespace its processes can run in, with the services'
        connections carried there (an emulated link: ``HostNetwork.emulate_link``); ``None``
        where processes stay in the root namespace and reach their minion by its socket."""
        network = self._cluster.network if self._cluster is not None else None
        if network is None or network.kind != "netns" or network.link is None:
            return None
        return next((h for h in network.hosts if h.name == host), None)

    def reachable(self, url: str) -> str:
        """``url`` (a service on this machine's loopback) as a host's processes reach it."""
        network = self._cluster.network if self._cluster is not None else None
        return network.reachable(url) if network is not None else url

    @property
    def processes(self) -> list[tuple[CdiProcess, str]]:
        """The controller and each minion, with the address it serves."""
        found = [(self.controller, self.controller_url)] if self.controller else []
        if self.emulator is not None:
            found.append((self.emulator, "between the hosts"))
        for n, minion in enumerate(self.minions, 1):
            found.append((minion, f"unix://{self.socket_of(f'host{n}')}"))
        return found

    def start(self) -> None:
        if self.hosts > 1:
            self._start_hosts()
            return
        self.controller_url = f"grpc://127.0.0.1:{free_port()}"
        host = socket.gethostname()
        credentials = ClusterCredentials.ensure(self.credentials_folder, [host])
        self.controller = CdiProcess(
            "cdi-controller",
            ControllerChild(
                self.controller_url, str(self.logs_dir / "cdi-controller.log"), credentials
            ),
        )
        minion = CdiProcess(
            "cdi-minion",
            MinionChild(
                self.socket_of(),
                "--host", host, "--controller", self.controller_url,
                "--controller-token-file", str(credentials.minion_token_file(host)),
                # Its objects outlive a restart of the minion (docs/minion-restart.md).
                "--state-dir", str(self.folder / MINION_STATE),
                log_path=str(self.logs_dir / "cdi-minion.log"),
            ),
        )  # fmt: skip
        self.minions = [minion]
        for what, child in (("CDI controller", self.controller), ("minion", minion)):
            try:
                child.start()
            except CDIError as exc:
                raise StackError(f"{what}: {exc}", log_file=child.log_path) from exc

    def _start_hosts(self) -> None:
        try:
            network = self.network or self._make_hosts()
        except CDIError as exc:
            raise StackError(f"CDI hosts: {exc}", log_file=self.logs_dir) from exc
        try:
            # Each host's minion keeps its objects across a restart of it, in its own state
            # folder <folder>/host<n>/minion-state (docs/minion-restart.md).
            cluster = LocalCluster.start(
                self.hosts, self.folder, logs=self.logs_dir, network=network, keep_objects=True
            )
        except CDIError as exc:
            if network is not self.network:
                network.close()
            raise StackError(f"CDI hosts: {exc}", log_file=self.logs_dir) from exc
        if cluster.network.kind == "loopback":
            log.warning("hosts on loopback addresses: %s", cluster.network.reason)
        self._cluster = cluster
        self.controller_url = cluster.controller_url
        self.controller = CdiProcess("cdi-controller", cluster.controller)
        if network is not self.network and network.emulator is not None:
            # Ours to supervise: the workers on the hosts reach the services through it.
            self.emulator = CdiProcess("link-emulator", network.emulator.child)
        self.minions = [
            CdiProcess(f"cdi-minion-{host.name}", minion)
            for host, minion in zip(cluster.network.hosts, cluster.minions, strict=True)
        ]

    def _make_hosts(self) -> HostNetwork:
        """The hosts, with ``link`` where it can be had (namespaces and ``nft``): then each
        worker runs on its host (``host_of``); else they all stay in the root namespace."""
        network = HostNetwork.create(self.hosts)
        if network.kind != "netns" or self.link is None:
            return network
        try:
            network.emulate_link(self.link, str(self.folder / "link"))
        except (CDIError, OSError, subprocess.SubprocessError) as exc:
            log.warning("workers stay in the root namespace (no link between the hosts: %s)", exc)
        return network

    def stop(self, timeout: float) -> None:
        """Minions, then the controller (and the hosts' namespaces). A stop for good: what
        each minion kept for a successor goes too (its memory in /dev/shm and its journal),
        whether or not its process could remove it (``cdi.minion.state``)."""
        try:
            for minion in self.minions:
                minion.stop(timeout)
            if self.controller is not None:
                self.controller.stop(timeout)
            if self._cluster is not None and self._cluster.network is not self.network:
                self._cluster.network.close()
            log.info("cdi controller and minions stopped")
        finally:
            for state in minion_state_folders(self.folder.parent):
                discard_kept(state, timeout)
            for n in range(1, self.hosts + 1):
                socket_path = Path(self.socket_of(f"host{n}"))
                if socket_path.is_socket():  # a minion that was killed cannot remove its socket
                    socket_path.unlink(missing_ok=True)
            self.controller, self.minions, self._cluster = None, [], None
            self.emulator = None
