"""One chaos case: workflows in flight, a fault, then every workflow followed to its end.

    with chaos_stack(folder) as target:
        result = run_case(target, FAULTS_BY_NAME["minion"], workflows=60)

A case starts ``workflows`` workflows, waits until a third of them have finished (the rest are
in flight or waiting), strikes, and from then on starts a *probe* workflow every second until
one completes: the **recovery time** is from the strike to that probe's completion. It then
waits (at most ``deadline_s``) for every workflow to end and judges each one
(``Workload.verdict``): 0 stuck, 0 lost, 0 wrong is the goal. Finally it waits for the minion to
hold no object: one left behind is a leak (``leaked_objects``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.chaos.faults import POLICY, CaseTarget, Fault, Target
from loadtest.chaos.workload import FINISHED, Started, Workload
from orchestrator.child_process import free_port
from orchestrator.services import RunningServices, resolve_services
from orchestrator.settings import load_settings
from orchestrator.stack import Stack

__all__ = ["CaseResult", "chaos_stack", "external_services", "run_case"]

PROBE_EVERY_S = 1.0


@dataclass
class CaseResult:
    fault: str
    what: str
    target: str  # where the stack ran: "embedded", "external", "containers"
    workflows: int
    probes: int
    completed: int
    failed: int
    stuck: int
    lost: int
    wrong: int
    leaked_objects: int
    recovery_s: float | None  # strike to the first probe completed; None: none did
    duration_s: float
    failures: list[str] = field(default_factory=list)  # reasons of FAILED workflows

    @property
    def passed(self) -> bool:
        return (self.stuck, self.lost, self.wrong, self.leaked_objects) == (0, 0, 0, 0) and (
            self.recovery_s is not None
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed}


@contextlib.contextmanager
def external_services(folder: Path) -> Iterator[RunningServices]:
    """Postgres, Redis and S3 started apart from any stack, as managed services would be."""
    settings = load_settings(
        data_dir=folder, database_url=None, redis_url=None, s3_endpoint_url=None,
        aws_access_key_id=None, aws_secret_access_key=None,
    )  # fmt: skip
    with resolve_services(settings) as services:
        yield services


@contextlib.contextmanager
def chaos_stack(
    folder: Path | None = None, *, external: bool = False, workers: int = 2
) -> Iterator[Target]:
    """A fresh stack (and its own services when ``external``), stopped and removed after."""
    own = folder is None
    root = Path(tempfile.mkdtemp(prefix="cdiflow-chaos-")) if folder is None else folder
    os.chmod(root, 0o755)
    try:
        with contextlib.ExitStack() as stack:
            services = None
            if external:
                services = stack.enter_context(external_services(root / "services"))
            running = Stack(
                root / "data", workers=workers, port=free_port(), services=services,
                restart_policy=POLICY,
            )  # fmt: skip
            target = Target(running, services)
            stack.callback(lambda: target.stack.stop())  # the latest: down-up makes a new one
            running.start()
            yield target
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def run_case(
    target: CaseTarget, fault: Fault[Any], *, workflows: int = 60, deadline_s: float = 180.0
) -> CaseResult:
    """Strike ``fault`` with ``workflows`` in flight and judge how every workflow ends."""
    began = time.monotonic()
    load = Workload(target.stack)
    try:
        runs: dict[str, Started] = {}
        for _ in range(workflows):
            started = load.start()
            runs[started.id] = started
        _until(lambda: _finished(load, runs) >= workflows // 3, deadline_s)
        struck = time.time()
        target.strike(fault, load)
        recovery = _probe(load, runs, struck, deadline_s)
        _until(lambda: _finished(load, runs) == len(runs), deadline_s)
        verdicts = {run.id: load.verdict(run) for run in runs.values()}
        leaked = _leaked_objects(target)
    finally:
        load.close()
    values = list(verdicts.values())
    return CaseResult(
        fault=fault.name,
        what=fault.what,
        target=target.kind,
        workflows=workflows,
        probes=sum(r.probe for r in runs.values()),
        completed=sum(r.status == "COMPLETED" and verdicts[r.id] == "ok" for r in runs.values()),
        failed=sum(r.status == "FAILED" and verdicts[r.id] == "ok" for r in runs.values()),
        stuck=values.count("stuck"),
        lost=values.count("lost"),
        wrong=values.count("wrong"),
        leaked_objects=leaked,
        recovery_s=None if recovery is None else round(recovery - struck, 2),
        duration_s=round(time.monotonic() - began, 1),
        failures=sorted(
            {str(r.detail.get("error")) for r in runs.values() if r.status == "FAILED"}
        ),
    )


def _probe(
    load: Workload, runs: dict[str, Started], struck: float, deadline_s: float
) -> float | None:
    """Start a probe every ``PROBE_EVERY_S`` until one completes; its completion time."""
    deadline = time.monotonic() + deadline_s
    next_probe = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_probe:
            probe = load.start(probe=True, deadline_s=deadline_s)
            runs[probe.id] = probe
            next_probe = time.monotonic() + PROBE_EVERY_S
        load.refresh(runs)
        done = [r.finished_at for r in runs.values()
                if r.probe and r.status == "COMPLETED" and r.finished_at]  # fmt: skip
        if done:
            return min(done)
        time.sleep(0.2)
    return None


def _finished(load: Workload, runs: dict[str, Started]) -> int:
    load.refresh(runs)
    return sum(r.status in FINISHED or r.status == "LOST" for r in runs.values())


def _until(check: Any, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.25)


def _leaked_objects(target: CaseTarget, wait_s: float = 30.0) -> int:
    """Objects the minions still hold once every workflow has ended (after a grace: the last
    ones are handed back and destroyed just after their workflow ends)."""
    deadline = time.monotonic() + wait_s
    count: int | None = None
    while time.monotonic() < deadline:
        count = target.objects_held()
        if count == 0:
            return 0
        time.sleep(0.5)
    return 1 if count is None else count
