"""Ray: a local single-node cluster, ``workers`` CPUs, the image tasks as remote functions.

    ray start --head --block --num-cpus 2 --include-dashboard false ...  # what RaySystem starts

The cluster is one child process (``ray start --block`` keeps the head in the foreground and
takes its GCS, raylet, agents and workers down when it gets SIGTERM); its temp dir is a fresh
folder under /tmp (Ray's socket paths must stay short), removed at stop. A driver in a child
process (``loadtest.systems.ray_driver``) submits the chains and writes the workflow
records, as locust does for the other peers. See ray_tasks for the data path: S3 in,
shared memory between tasks, S3 out.

One driver (child process, one Ray job) serves every point, the point's target file named on
its stdin: Ray starts workers per job, so a driver per point would start cold workers.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import psutil

from loadtest.plan import Point
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.driver_proc import DriverProcess
from loadtest.systems.services import BenchServices, clear_prefixes, peer_env
from orchestrator.child_process import ChildProcess, free_port

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


class RaySystem(System):
    name = "ray"
    results_prefix = "ray/results/"

    def __init__(self, services: BenchServices, ctx: RunContext) -> None:
        self.services = services
        self.ctx = ctx
        self.address = ""
        self._proc: ChildProcess | None = None
        self._driver: DriverProcess | None = None
        self._temp: Path | None = None
        self._stats: dict[str, Any] = {}
        self._stats_before: dict[str, Any] = {}

    def start(self) -> None:
        self._temp = Path(tempfile.mkdtemp(prefix="cdiflow-ray-"))
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",  # the ``ray`` command, found without relying on PATH
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            f"--ray-client-server-port={free_port()}",
            f"--num-cpus={self.ctx.workers}",
            "--num-gpus=0",
            f"--object-store-memory={object_store_bytes(self.ctx.in_flight_bytes)}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self._temp}",
        ]
        log = self.ctx.folder / "ray-head.log"
        env = peer_env(self.services) | {"RAY_USAGE_STATS_ENABLED": "0"}
        self._proc = ChildProcess("ray head", argv, log_path=log, env=env).start()
        self.address = f"127.0.0.1:{port}"
        try:
            self._wait_ready(log, timeout=120)
            self._driver = DriverProcess(
                "ray driver",
                [sys.executable, "-m", "loadtest.systems.ray_driver", self.address],
                peer_env(self.services),
                self.ctx.folder / "ray-driver.log",
            )
            self._driver.start()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, log: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while _READY not in log.read_text(errors="replace"):
            if self._proc is None or self._proc.poll() is not None:
                raise RuntimeError(f"ray start exited; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray did not start in {timeout:g} s; see {log}")
            time.sleep(0.2)

    def stop(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.stop()
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(30.0, sweep_group=True)
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

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
