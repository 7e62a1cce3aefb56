"""A load driver in a child process, handed one point at a time (Ray's and Temporal's).

The driver reads a target file path a line on stdin, runs that point, appends a
``WorkflowRecord`` JSON line per workflow to the target's ``records`` file, and answers
``done {json}`` on stdout, the JSON being what the system says of itself over the point
(``{}`` if nothing). Other stdout lines (worker output Ray forwards) are skipped. One driver
serves every point, so its connection and the system's workers stay warm; a driver that dies
or hangs is replaced for the next point.
"""

from __future__ import annotations

import json
import select
import time
from pathlib import Path
from typing import Any

from cdi.child import ChildProcess
from loadtest.drive import read_records
from loadtest.plan import Point
from loadtest.stats import WorkflowRecord
from loadtest.systems.base import Inputs, System

__all__ = ["DriverProcess"]


class DriverProcess:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log = log
        self.stats: dict[str, Any] = {}  # the last point's ``done`` JSON
        self._proc: ChildProcess | None = None

    def start(self) -> None:
        self._proc = ChildProcess(
            self.name, self.argv, log_path=self.log, env=self.env, piped=True
        ).start()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # end of input: it closes its connection and exits
        proc.stop(15.0, sweep_group=True)

    def drive(self, target_file: Path, time_limit_s: float) -> str:
        """Hand the driver one point; ``""`` once it is done, else what went wrong."""
        if self._proc is None or self._proc.poll() is not None:
            self.start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{target_file}\n".encode())
        proc.stdin.flush()
        deadline = time.monotonic() + time_limit_s
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([proc.stdout], [], [], left)[0]:
                break
            line = proc.stdout.readline()
            if not line:  # it exited
                break
            if line.startswith(b"done "):
                self.stats = json.loads(line[5:])
                return ""
        self.stop()  # stuck or dead: the next point gets a fresh one
        return f"the driver did not finish the point (status {proc.returncode})"

    def run_point(self, system: System, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        """``point`` for ``system``: its records, padded with ``MISSING`` for the workflows
        the driver never recorded."""
        target, folder = system.point_target(point, inputs)
        records_file = Path(target.records)
        records_file.parent.mkdir(parents=True, exist_ok=True)
        records_file.unlink(missing_ok=True)
        target.write(folder / "target.json")
        problem = self.drive(folder / "target.json", system.ctx.time_limit_s)
        records = read_records(records_file)
        missing = point.workflows - len(records)
        reason = f"{problem or 'not recorded'}; see {self.log}"
        return records + [
            WorkflowRecord(system.name, 0, point.tasks, 0.0, None, "MISSING", reason)
            for _ in range(max(0, missing))
        ]
