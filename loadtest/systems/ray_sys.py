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

import select
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from loadtest.drive import read_records
from loadtest.plan import Point
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.services import BenchServices, clear_prefixes, peer_env
from orchestrator.child_process import ChildProcess, free_port

__all__ = ["RaySystem"]

# The object store holds the decoded images in flight (a 4 MB JPEG is ~40 MB of pixels);
# modest on this 2-core machine, and /dev/shm-backed. Ray's minimum is ~75 MB.
OBJECT_STORE_BYTES: Final = 512 * 2**20
_READY: Final = "Ray runtime started"


class RaySystem(System):
    name = "ray"

    def __init__(self, services: BenchServices, ctx: RunContext) -> None:
        self.services = services
        self.ctx = ctx
        self.address = ""
        self._proc: ChildProcess | None = None
        self._driver: ChildProcess | None = None
        self._temp: Path | None = None

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
            f"--object-store-memory={OBJECT_STORE_BYTES}",
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
            self._driver = self._start_driver()
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
            if driver.stdin is not None:
                driver.stdin.close()  # end of input: it shuts its Ray connection down and exits
            driver.stop(15.0, sweep_group=True)
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(30.0, sweep_group=True)
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

    def _start_driver(self) -> ChildProcess:
        return ChildProcess(
            "ray driver",
            [sys.executable, "-m", "loadtest.systems.ray_driver", self.address],
            log_path=self.ctx.folder / "ray-driver.log",
            env=peer_env(self.services),
            piped=True,  # it is handed each point on stdin and says "done" on stdout
        ).start()

    def _drive(self, target_file: Path) -> str:
        """Hand the driver one point; ``""`` once it is done, else what went wrong."""
        if self._driver is None or self._driver.poll() is not None:
            self._driver = self._start_driver()
        driver = self._driver
        assert driver.stdin is not None and driver.stdout is not None
        driver.stdin.write(f"{target_file}\n".encode())
        driver.stdin.flush()
        deadline = time.monotonic() + self.ctx.time_limit_s
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([driver.stdout], [], [], left)[0]:
                break
            line = driver.stdout.readline()
            if not line:  # it exited
                break
            if line.strip() == b"done":  # other lines: worker output Ray forwards
                return ""
        driver.stop(10.0, sweep_group=True)  # stuck or dead: the next point gets a fresh one
        self._driver = None
        return f"the Ray driver did not finish the point (status {driver.returncode})"

    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        if self._proc is None:
            raise RuntimeError("ray is not started")
        target, folder = self.point_target(point, inputs)
        records_file = Path(target.records)
        records_file.parent.mkdir(parents=True, exist_ok=True)
        records_file.unlink(missing_ok=True)
        target.write(folder / "target.json")
        problem = self._drive(folder / "target.json")
        records = read_records(records_file)
        missing = point.workflows - len(records)
        reason = f"{problem or 'not recorded'}; see {self.ctx.folder / 'ray-driver.log'}"
        return records + [
            WorkflowRecord(self.name, 0, point.tasks, 0.0, None, "MISSING", reason)
            for _ in range(max(0, missing))
        ]

    def after_point(self) -> None:
        clear_prefixes(self.services.running, ("ray/",))
