"""The stack's CDI runtime: a controller and one minion, or a minion with a gateway per host."""

from __future__ import annotations

import logging
from pathlib import Path

from cdi.controller.process import ControllerChild
from cdi.errors import CDIError
from cdi.minion.process import MinionChild
from cdi.remote.cluster import LocalCluster
from orchestrator.errors import StackError
from orchestrator.stack import probes
from orchestrator.stack.state import ProcessInfo

__all__ = ["CdiRuntime"]

log = logging.getLogger(__name__)


class CdiRuntime:
    """``hosts`` 1: a controller and a minion on this machine. More: each host a network
    namespace (or a loopback address) with its minion and gateway (``cdi.remote.cluster``);
    host ``n``'s minion socket is ``<data>/cdi/host<n>/minion.sock``."""

    def __init__(self, data_dir: Path, logs_dir: Path, hosts: int) -> None:
        self.hosts = hosts
        self.folder = data_dir / "cdi"
        self.logs_dir = logs_dir
        self.controller_url = ""  # a free port is picked at start
        self._controller: ControllerChild | None = None
        self._minion: MinionChild | None = None
        self._cluster: LocalCluster | None = None

    def socket_of(self, host: str = "host1") -> str:
        """The minion socket of ``host`` (``host1``, ...)."""
        if self.hosts == 1:
            return str(self.folder / "minion.sock")
        return str(self.folder / host / "minion.sock")

    @property
    def network_kind(self) -> str:
        return self._cluster.network.kind if self._cluster is not None else "one host"

    def start(self) -> None:
        if self.hosts > 1:
            try:
                self._cluster = LocalCluster.start(self.hosts, self.folder, logs=self.logs_dir)
            except CDIError as exc:
                raise StackError(f"CDI hosts: {exc}", log_file=self.logs_dir) from exc
            if self._cluster.network.kind == "loopback":
                log.warning("hosts on loopback addresses: %s", self._cluster.network.reason)
            self.controller_url = self._cluster.controller_url
            return
        self.controller_url = f"grpc://127.0.0.1:{probes.free_port()}"
        self._controller = ControllerChild(
            self.controller_url, log_path=str(self.logs_dir / "cdi-controller.log")
        )
        self._minion = MinionChild(
            self.socket_of(),
            "--controller",
            self.controller_url,
            log_path=str(self.logs_dir / "cdi-minion.log"),
        )
        for what, child in (("CDI controller", self._controller), ("minion", self._minion)):
            try:
                child.start()
            except CDIError as exc:
                raise StackError(f"{what}: {exc}", log_file=Path(child.log_path)) from exc

    def stop(self, timeout: float) -> None:
        """Minions, then the controller (and the hosts' namespaces); errors are logged."""
        try:
            if self._cluster is not None:
                self._cluster.close()
                log.info("cdi hosts stopped")
            else:
                if self._minion is not None:
                    self._minion.stop(timeout)
                    log.info("cdi-minion stopped")
                if self._controller is not None:
                    self._controller.stop(timeout)
                    log.info("cdi-controller stopped")
        finally:
            for n in range(1, self.hosts + 1):
                socket_path = Path(self.socket_of(f"host{n}"))
                if socket_path.is_socket():  # a minion that was killed cannot remove its socket
                    socket_path.unlink(missing_ok=True)
            self._cluster = self._minion = self._controller = None

    def processes(self) -> list[ProcessInfo]:
        """The controller's row and a row per minion."""
        controller = self._controller
        minions: list[tuple[str, MinionChild]] = []
        if self._cluster is not None:
            controller = self._cluster.controller
            hosts = self._cluster.network.hosts
            started = zip(hosts, self._cluster.minions, strict=False)  # fewer if a start failed
            minions = [(f"cdi-minion-{h.name}", m) for h, m in started]
        elif self._minion is not None:
            minions = [("cdi-minion", self._minion)]
        rows = []
        if controller is not None and controller.process is not None:
            rows.append(ProcessInfo.of("cdi-controller", controller.pid, self.controller_url,
                                       Path(controller.log_path)))  # fmt: skip
        for name, minion in minions:
            if minion.process is not None:
                rows.append(ProcessInfo.of(name, minion.pid, f"unix://{minion.socket_path}",
                                           Path(minion.log_path)))  # fmt: skip
        return rows
