"""Temporal: its development server (the Temporal CLI), Python SDK workers and driver.

    temporal server start-dev --headless --ip 127.0.0.1 --port P --db-filename F ...
    python -m loadtest.systems.temporal_worker 127.0.0.1:P          # ``workers`` of them
    python -m loadtest.systems.temporal_driver 127.0.0.1:P          # the load driver

The CLI is built from its Go module with ``go install`` on first use and kept in
``<data dir>/peers`` (``CDIFLOW_DATA_DIR``, default ``.data``), as Conductor's jar is; it
takes minutes. The dev server keeps its state in a SQLite file (``--db-filename``, in WAL mode:
durable, as cdiflow's and Conductor's state is; its default is memory only) in a folder of
its own (``peer_state.PeerState``, removed at stop), with an environment stripped to PATH,
HOME and TMPDIR; its workers and driver run on the same state, so no ``TEMPORAL_*`` setting
or configuration file of the user's reaches them. Workflows are started and followed by one
driver process (``loadtest.systems.driver_proc``), as Ray's are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from cdi.child import ChildProcess
from loadtest.plan import Point
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.driver_proc import DriverProcess
from loadtest.systems.peer_state import PeerState
from loadtest.systems.services import BenchServices, clear_prefixes, peer_env
from loadtest.systems.temporal_app import PREFIX
from orchestrator.child_process import free_port
from orchestrator.settings import load_settings

__all__ = ["CLI_MODULE", "CLI_VERSION", "TemporalSystem", "temporal_cli"]

CLI_MODULE: Final = "github.com/temporalio/cli/cmd/temporal"
# The newest the Go module proxy builds with ``go install``: later ones replace a module of
# their own by a local folder, which ``go install`` refuses.
CLI_VERSION: Final = "v1.5.1"
_READY_S: Final = 120.0


def temporal_cli(peers: Path | None = None) -> Path:
    """The ``temporal`` binary, built into ``peers`` once (Go's module cache is reused)."""
    folder = (peers or load_settings().data_dir / "peers") / f"temporal-cli-{CLI_VERSION}"
    binary = folder / "temporal"
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise RuntimeError(f"the Temporal peer needs Go (go) to build {CLI_MODULE}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    print(f"building {CLI_MODULE}@{CLI_VERSION} with go (minutes)", file=sys.stderr, flush=True)
    partial = Path(tempfile.mkdtemp(prefix="build-", dir=folder.parent))
    try:  # into a folder of its own first: an interrupted build never passes for the binary
        done = subprocess.run(
            ["go", "install", f"{CLI_MODULE}@{CLI_VERSION}"],
            env=dict(os.environ, GOBIN=str(partial)),
            cwd=partial,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
        if done.returncode != 0 or not (partial / "temporal").exists():
            tail = (done.stdout + done.stderr).strip()[-800:]
            raise RuntimeError(f"go could not build {CLI_MODULE}@{CLI_VERSION}: {tail}")
        partial.replace(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return binary


class TemporalSystem(System):
    name = "temporal"
    results_prefix = f"{PREFIX}results/"
    intermediates_via_s3 = True

    def __init__(self, services: BenchServices, ctx: RunContext) -> None:
        self.services = services
        self.ctx = ctx
        self.address = ""
        self._server: ChildProcess | None = None
        self._workers: list[ChildProcess] = []
        self._driver: DriverProcess | None = None
        self._state: PeerState | None = None

    def start(self) -> None:
        cli = temporal_cli()
        try:
            self._state = state = PeerState("temporal")
            self._start_server(cli, state)
            env = state.env(peer_env(self.services))
            argv = [sys.executable, "-m", "loadtest.systems.temporal_worker", self.address]
            for i in range(self.ctx.workers):
                log = self.ctx.folder / f"temporal-worker-{i + 1}.log"
                log.unlink(missing_ok=True)
                worker = ChildProcess(f"temporal worker {i + 1}", argv, log_path=log, env=env)
                self._workers.append(worker.start())
                self._wait_for(log, "ready", worker)
            self._driver = DriverProcess(
                "temporal driver",
                [sys.executable, "-m", "loadtest.systems.temporal_driver", self.address],
                env,
                self.ctx.folder / "temporal-driver.log",
            )
            self._driver.start()
        except BaseException:
            self.stop()
            raise

    def _start_server(self, cli: Path, state: PeerState) -> None:
        port = free_port()
        argv = [
            str(cli),
            "server",
            "start-dev",
            "--headless",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--http-port={free_port()}",
            f"--metrics-port={free_port()}",
            f"--db-filename={state.root / 'temporal.db'}",
            # One fsync a commit, as cdiflow's and Conductor's Postgres (synchronous_commit
            # on); SQLite's default rollback journal syncs several times a commit.
            "--sqlite-pragma=journal_mode=wal",
            "--sqlite-pragma=synchronous=full",
            "--log-level=warn",
        ]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(state.home), "TMPDIR": str(state.tmp),
               "LANG": "C.UTF-8"}  # fmt: skip
        log = self.ctx.folder / "temporal-server.log"
        self._server = ChildProcess(
            "temporal server", argv, log_path=log, env=env, cwd=state.root
        ).start()
        self.address = f"127.0.0.1:{port}"
        health = [str(cli), "operator", "cluster", "health", f"--address={self.address}"]
        deadline = time.monotonic() + _READY_S
        while True:
            if self._server.poll() is not None:
                raise RuntimeError(f"the Temporal server exited; see {log}")
            probe = subprocess.run(
                health, capture_output=True, text=True, env=env, timeout=30, check=False
            )
            if probe.returncode == 0 and "SERVING" in probe.stdout:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Temporal server was not serving in {_READY_S:g} s")
            time.sleep(0.5)

    def _wait_for(self, log: Path, word: str, proc: ChildProcess) -> None:
        deadline = time.monotonic() + _READY_S
        while word not in (log.read_text(errors="replace") if log.exists() else ""):
            if proc.poll() is not None:
                raise RuntimeError(f"a Temporal worker exited; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"a Temporal worker was not ready in {_READY_S:g} s")
            time.sleep(0.2)

    def stop(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.stop()
        workers, self._workers = self._workers, []
        for proc in workers:
            proc.stop(15.0, sweep_group=True)
        server, self._server = self._server, None
        if server is not None:
            server.stop(30.0, sweep_group=True)
        state, self._state = self._state, None
        if state is not None:
            state.remove()

    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        if self._driver is None:
            raise RuntimeError("temporal is not started")
        return self._driver.run_point(self, point, inputs)

    def after_point(self) -> None:
        clear_prefixes(self.services.running, (PREFIX,))
