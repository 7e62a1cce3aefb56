"""Ray: a local cluster of ``workers`` CPUs, the image tasks as remote functions.

One node on one host; with ``--hosts`` (``RunContext.network``) a head node on host 1 and a
worker node on each other host, in its namespace, the CPUs shared out as cdiflow's workers are.

    ray start --head --block --num-cpus 2 --include-dashboard false ...  # what RaySystem starts

The cluster is one child process (``ray start --block`` keeps the head in the foreground and
takes its GCS, raylet, agents and workers down when it gets SIGTERM). Every process of it
runs on the peer's own state (``peer_state.PeerState``, removed at stop): its temp dir is
in that folder (Ray's socket paths must stay short), and it authenticates with a token of its
own (``RAY_AUTH_MODE=token``, the token in a file of that folder's home readable by its owner
alone), as a cluster ``ray.init()`` starts does, never with a user's ``~/.ray/auth_token``.
A driver in a child process (``loadtest.systems.ray_driver``) submits the chains and writes
the workflow records, as locust does for the other peers. See ray_tasks for the data path:
S3 in, shared memory between tasks, S3 out.

One driver (child process, one Ray job) serves every point, the point's target file named on
its stdin: Ray starts workers per job, so a driver per point would start cold workers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Final

import psutil

from cdi.child import ChildProcess
from cdi.hosts import Host
from loadtest.plan import Point
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.driver_proc import DriverProcess
from loadtest.systems.peer_state import PeerState
from loadtest.systems.services import BenchServices, clear_prefixes, peer_env
from orchestrator.child_process import free_port

__all__ = ["RaySystem"]

# The object store holds the decoded images between tasks (a 4 MB JPEG is ~40 MB of pixels),
# one per workflow in flight: it is sized for the run's points (``RunContext.in_flight_bytes``)
# with room to spare, so nothing is spilled to disk (each point records what was), and never
# below this nor above half the machine's memory.
MIN_OBJECT_STORE_BYTES: Final = 512 * 2**20
_HEADROOM: Final = 1.5
_READY: Final = "Ray runtime started"


def object_store_bytes(in_flight_bytes: int) -> int:
    """Ray's ``--object-store-memory`` for a run holding ``in_flight_bytes`` of images."""
    wanted = int(in_flight_bytes * _HEADROOM) + MIN_OBJECT_STORE_BYTES
    return min(wanted, psutil.virtual_memory().total // 2)


def _share(workers: int, hosts: int) -> list[int]:
    """``workers`` CPUs over ``hosts`` nodes, as cdiflow's workers are (round robin): a
    host with none gets no node."""
    return [len(range(n, workers, hosts)) for n in range(hosts)]


def _on(host: Host | None, argv: list[str]) -> list[str]:
    return host.wrap(argv) if host is not None else argv


class RaySystem(System):
    name = "ray"
    results_prefix = "ray/results/"

    def __init__(self, services: BenchServices, ctx: RunContext) -> None:
        self.services = services
        self.ctx = ctx
        self.address = ""
        self._proc: ChildProcess | None = None
        self._nodes: list[ChildProcess] = []  # worker nodes, on hosts 2.. (``--hosts``)
        self._driver: DriverProcess | None = None
        self._state: PeerState | None = None
        self._stats: dict[str, Any] = {}
        self._stats_before: dict[str, Any] = {}

    def start(self) -> None:
        self._state = PeerState("ray")
        network = self.ctx.network
        head = network.hosts[0] if network is not None else None
        port = free_port()
        address = head.address if head is not None else "127.0.0.1"
        # Several hosts: the head on host 1 and a worker node on each other host, the CPUs
        # (workers) shared out; the driver on host 1, where Ray wants a node of its own.
        cpus = _share(self.ctx.workers, len(network.hosts) if network is not None else 1)
        store = object_store_bytes(self.ctx.in_flight_bytes) // sum(1 for c in cpus if c)
        argv = [
            *self._ray_start(cpus[0], store, address),
            "--head",
            f"--port={port}",
            f"--ray-client-server-port={free_port()}",
            "--include-dashboard=false",
        ]
        log = self.ctx.folder / "ray-head.log"
        env = self._env(self._state)
        self._proc = ChildProcess("ray head", _on(head, argv), log_path=log, env=env).start()
        self.address = f"{address}:{port}"
        try:
            self._wait_ready(self._proc, log, timeout=120)
            for n, host in enumerate(network.hosts[1:] if network is not None else [], 1):
                if not cpus[n]:
                    continue
                node_log = self.ctx.folder / f"ray-node-{host.name}.log"
                node_argv = [*self._ray_start(cpus[n], store, host.address),
                             f"--address={self.address}"]  # fmt: skip
                node = ChildProcess(f"ray node {host.name}", host.wrap(node_argv),
                                    log_path=node_log, env=env).start()  # fmt: skip
                self._nodes.append(node)
                self._wait_ready(node, node_log, timeout=120)
            self._driver = DriverProcess(
                "ray driver",
                _on(head, [sys.executable, "-m", "loadtest.systems.ray_driver", self.address]),
                env,
                self.ctx.folder / "ray-driver.log",
            )
            self._driver.start()
        except BaseException:
            self.stop()
            raise

    def _ray_start(self, cpus: int, store: int, node_ip: str) -> list[str]:
        assert self._state is not None
        return [
            sys.executable,
            "-m",
            "ray.scripts.scripts",  # the ``ray`` command, found without relying on PATH
            "start",
            "--block",
            f"--node-ip-address={node_ip}",
            f"--num-cpus={cpus}",
            "--num-gpus=0",
            f"--object-store-memory={store}",
            "--disable-usage-stats",
            # Within the state's folder, which stays 0700 where Ray opens its own to all.
            f"--temp-dir={self._state.root / 'ray'}",
        ]

    def _env(self, state: PeerState) -> dict[str, str]:
        env = state.env(peer_env(self.services)) | {
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(state.secret_file(".ray/auth_token")),
        }
        if self.ctx.network is not None:  # S3 as the hosts reach it
            env["S3_ENDPOINT_URL"] = self.ctx.network.reachable(env["S3_ENDPOINT_URL"])
        return env

    @staticmethod
    def _wait_ready(proc: ChildProcess, log: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while _READY not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray did not start in {timeout:g} s; see {log}")
            time.sleep(0.2)

    def stop(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.stop()
        nodes, self._nodes = self._nodes, []
        for node in reversed(nodes):
            node.stop(30.0, sweep_group=True)
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(30.0, sweep_group=True)
        state, self._state = self._state, None
        if state is not None:
            state.remove()

    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        if self._proc is None or self._driver is None:
            raise RuntimeError("ray is not started")
        self._driver.stats = {}
        records = self._driver.run_point(self, point, inputs)
        if self._driver.stats:
            self._note_stats(self._driver.stats)
        return records

    def _note_stats(self, cumulative: dict[str, Any]) -> None:
        """This point's share of the store's cumulative counters (the warm-up's included in
        the first point: spilling then would be noted as well)."""
        before = self._stats_before
        self._stats = {
            k: v - before.get(k, 0) if k.endswith(("spilled_bytes", "restored_bytes")) else v
            for k, v in cumulative.items()
        }
        self._stats_before = cumulative

    def point_stats(self) -> dict[str, Any]:
        stats, self._stats = self._stats, {}
        return stats

    def after_point(self) -> None:
        clear_prefixes(self.services.running, ("ray/",))
