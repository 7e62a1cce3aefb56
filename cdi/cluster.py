"""Several CDI hosts on one machine: a controller, and per host a minion with its gateway.

    with LocalCluster.start(2, "/tmp/cdi-cluster") as cluster:
        a = cdi.connect(cluster.minions[0].socket_path, "producer")
        b = cdi.connect(cluster.minions[1].socket_path, "consumer")

Hosts are network namespaces (``cdi.hosts``), or loopback addresses where none can be made.
The controller stays in the root namespace, listening on the address every host reaches it
at; each minion runs on its host with ``--rpc-listen <host address>:0``. Tests, the
benchmark and ``cdiflow up --hosts`` use it; everything is stopped by PID in ``close()``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from cdi.auth import ClusterCredentials
from cdi.controller.process import ControllerChild
from cdi.errors import ConnectionFailed
from cdi.hosts import HostNetwork
from cdi.minion.process import MinionChild

__all__ = ["LocalCluster"]


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class LocalCluster:
    network: HostNetwork
    controller: ControllerChild
    minions: list[MinionChild] = field(default_factory=list)
    directory: Path = Path()
    owns_network: bool = True  # made by ``start`` (not passed in): removed when it closes

    @property
    def controller_url(self) -> str:
        return self.controller.url

    @classmethod
    def start(
        cls,
        hosts: int,
        directory: str | Path,
        *minion_args: str,
        network: HostNetwork | None = None,
        logs: str | Path | None = None,
        keep_objects: bool = False,
    ) -> LocalCluster:
        """Start a controller and ``hosts`` minions with gateways; wait until every gateway
        is in the controller's directory. Host ``n``'s minion socket is
        ``<directory>/host<n>/minion.sock``; logs go to ``logs`` (default: beside them).
        ``keep_objects``: each minion gets its own state folder, ``<directory>/host<n>/
        minion-state`` (the minion makes it private), so its objects outlive a restart of it
        (docs/minion-restart.md)."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
        net = network or HostNetwork.create(hosts)
        url = f"grpc://{net.gateway}:{_free_port(net.gateway)}"
        log_dir = Path(logs) if logs is not None else folder
        # The cluster's keys and each host's token, private to this user (cdi.auth).
        credentials = ClusterCredentials.ensure(
            folder / "credentials", [host.name for host in net.hosts]
        )
        controller = ControllerChild(url, str(log_dir / "cdi-controller.log"), credentials)
        cluster = cls(net, controller, directory=folder, owns_network=network is None)
        try:
            cluster.controller.start()
            for host in net.hosts:
                home = folder / host.name
                home.mkdir(exist_ok=True)
                os.chmod(home, 0o755)
                state = ("--state-dir", str(home / "minion-state")) if keep_objects else ()
                minion = MinionChild(
                    str(home / "minion.sock"),
                    "--host", host.name, "--controller", url,
                    "--controller-token-file", str(credentials.minion_token_file(host.name)),
                    "--gateway-key-file", str(credentials.gateway_key_file),
                    "--rpc-listen", f"{host.address}:0", *state, *minion_args,
                    log_path=str(
                        (log_dir / f"cdi-minion-{host.name}.log") if logs else home / "minion.log"
                    ),
                    wrap=host.wrap,
                )  # fmt: skip
                cluster.minions.append(minion)
                minion.start()
            cluster.wait_for_gateways()
        except BaseException:
            cluster.close()
            raise
        return cluster

    def wait_for_gateways(self, timeout: float = 30.0) -> None:
        """Until every minion is in the directory with its transfer address."""
        names = {h.name for h in self.network.hosts}
        deadline = time.monotonic() + timeout
        with self.controller.client() as client:
            while True:
                ready = {m.host for m in client.list_minions() if m.rpc_address and m.alive}
                if names <= ready:
                    return
                if time.monotonic() > deadline:
                    raise ConnectionFailed(
                        f"gateways of {sorted(names - ready)} not in the directory after "
                        f"{timeout} s; see {self.directory}/*/minion.log"
                    )
                time.sleep(0.05)

    def close(self, remove_network: bool | None = None) -> None:
        """Stop the minions and the controller; remove the host network if
        ``remove_network`` (by default: if this cluster made it)."""
        for minion in reversed(self.minions):
            with contextlib.suppress(Exception):
                minion.stop()
        self.controller.stop()
        if self.owns_network if remove_network is None else remove_network:
            self.network.close()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
