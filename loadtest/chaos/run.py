"""One chaos case: workflows in flight, a fault, then every workflow followed to its end.

    with chaos_stack(folder) as target:
        result = run_case(target, FAULTS_BY_NAME["minion"], workflows=60)

A case starts ``workflows`` workflows, waits until a third of them have finished (the rest are
in flight or waiting), strikes, and from then on starts a *probe* workflow every second until
one completes: the **recovery time** is from the strike to that probe's completion. A held
fault (a network cut, an S3 outage, a full disk) goes on meanwhile, phase after phase, on a
thread of its own; once its last phase has undone it, probes go on until one started after
that completes: the **recovery after the end**. The case then waits (at most ``deadline_s``
past the fault's end) for every workflow to end and judges each one (``Workload.verdict``):
0 stuck, 0 lost, 0 wrong is the goal. Finally it waits for every minion to hold no object: one
left behind is a leak (``CaseTarget.objects_held``), and runs the fault's own checks
(``CaseTarget.check``). The target is any stack reachable from here (``faults.CaseTarget``):
the stack of processes here, or the stack as containers (``deploy.containers.faults``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.chaos.checks import Facts
from loadtest.chaos.faults import POLICY, CaseTarget, Fault, Rig, Target
from loadtest.chaos.judge import Tally, finished, judge, until
from loadtest.chaos.s3_gate import S3Gate
from loadtest.chaos.small_disk import SmallDisk
from loadtest.chaos.workload import Started, Workload
from orchestrator.child_process import free_port
from orchestrator.services import RunningServices, resolve_services
from orchestrator.settings import load_settings
from orchestrator.stack import RestartPolicy, Stack

__all__ = ["CaseResult", "chaos_stack", "external_services", "run_case"]

PROBE_EVERY_S = 1.0
PLAIN = Rig()


@dataclass(kw_only=True)
class CaseResult(Tally):
    """How a fault's case went: its workflows' ``Tally``, then what the fault did."""

    fault: str
    what: str
    target: str  # where the stack ran: "embedded", "external", "containers"
    workload: str  # what ran: "chain", "graph", "mixed" (``workload.SHAPES``)
    workflows: int
    probes: int
    fed: int = 0  # started by the fault itself to have work in flight when it struck
    recovery_s: float | None  # strike to the first probe completed; None: none did
    duration_s: float
    held_s: float = 0.0  # how long the fault lasted (0: it struck at once)
    recovery_after_end_s: float | None = None  # held: its end to a probe started after it done
    no_failed: bool = False  # the fault's goal: no workflow FAILED
    refused: dict[str, int] = field(default_factory=dict)  # non-201 answers to starts
    refusal_texts: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # what the fault's own checks found
    observed: dict[str, str] = field(default_factory=dict)  # the API's answers while it held
    scheduler_stalled_s: float = 0.0  # the longest its loop did not turn, strike to the checks
    # The longest a minion answered nothing, strike to the checks (None: not watched).
    minion_unanswered_s: float | None = None

    @property
    def passed(self) -> bool:
        recovered = self.recovery_s is not None and (
            not self.held_s or self.recovery_after_end_s is not None
        )
        crashed = any(status.startswith("5") and status != "503" for status in self.refused)
        return (
            self.ended_right
            and recovered
            and not crashed
            and not self.problems
            and not (self.no_failed and self.failed)
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
    folder: Path | None = None,
    *,
    external: bool = False,
    workers: int = 2,
    rig: Rig = PLAIN,
    policy: RestartPolicy = POLICY,
) -> Iterator[Target]:
    """A fresh stack (and its own services when ``external``) with what ``rig`` asks for,
    stopped and removed after."""
    own = folder is None
    root = Path(tempfile.mkdtemp(prefix="cdiflow-chaos-")) if folder is None else folder
    os.chmod(root, 0o755)
    try:
        with contextlib.ExitStack() as stack:
            disk = None
            data = root / "data"
            if rig.disk_mb is not None:
                disk = stack.enter_context(SmallDisk(root / "disk", rig.disk_mb))
                data = disk.folder / "data"
            services = None
            if external or rig.s3_gate:
                services = stack.enter_context(external_services(root / "services"))
            gate = None
            given = services
            if rig.s3_gate:
                assert services is not None
                gate = stack.enter_context(S3Gate(services.s3_endpoint_url, root / "s3-gate"))
                given = dataclasses.replace(services, s3_endpoint_url=gate.url, embedded=())
            running = Stack(
                data, workers=workers, hosts=rig.hosts, port=free_port(), services=given,
                restart_policy=policy,
            )  # fmt: skip
            target = Target(running, services, s3_gate=gate, disk=disk)
            stack.callback(lambda: target.stack.stop())  # the latest: down-up makes a new one
            running.start()
            yield target
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def run_case(
    target: CaseTarget,
    fault: Fault[Any],
    *,
    workflows: int = 60,
    deadline_s: float = 180.0,
    workload: str = "chain",
) -> CaseResult:
    """Strike ``fault`` with ``workflows`` in flight (the chain, the graph or both in turn:
    ``workload.SHAPES``) and judge how every workflow ends."""
    began = time.monotonic()
    since = time.time()
    target.observed.clear()
    load = Workload(target.stack, shape=workload)
    try:
        runs: dict[str, Started] = {}
        for _ in range(workflows):
            started = load.start()
            runs[started.id] = started
        until(lambda: finished(load, since) >= workflows // 3, deadline_s)
        watch, minion = target.loop_watch(), target.minion_watch()
        with contextlib.ExitStack() as watching:
            for watcher in (watch, minion):
                if watcher is not None:
                    watching.enter_context(watcher)
            timeline = _Timeline(target, fault, load)
            recovery, after_end = _probe(load, runs, timeline, deadline_s + fault.held_s)
            timeline.join()
            runs.update((s.id, s) for s in load.fed)
            tally = judge(load, runs, target, since=since, deadline_s=deadline_s)
            facts = Facts(timeline.ended_at, dict(load.refusal_texts))
            problems = target.check(fault, facts)
    finally:
        load.close()
    return CaseResult(
        **vars(tally),
        fault=fault.name,
        what=fault.what,
        target=target.kind,
        workload=workload,
        workflows=workflows,
        probes=sum(r.probe for r in runs.values()),
        fed=len(load.fed),
        recovery_s=None if recovery is None else round(recovery - timeline.struck, 2),
        duration_s=round(time.monotonic() - began, 1),
        held_s=fault.held_s,
        recovery_after_end_s=None if after_end is None else round(after_end, 2),
        no_failed=fault.no_failed,
        refused=dict(load.refused),
        refusal_texts=dict(load.refusal_texts),
        problems=problems,
        observed=dict(target.observed),
        scheduler_stalled_s=watch.longest_s if watch is not None else 0.0,
        minion_unanswered_s=minion.longest_s if minion is not None else None,
    )


class _Timeline:
    """A fault's phases: the first acts at once (``struck``), each later one when the one
    before has held; ``ended_at`` once the last has acted (unix seconds)."""

    def __init__(self, target: CaseTarget, fault: Fault[Any], load: Workload) -> None:
        self.target, self.fault = target, fault
        self.struck = time.time()
        target.strike(fault, load)
        self.ended_at: float | None = self.struck if len(fault.phases) == 1 else None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for before, phase in zip(self.fault.phases, self.fault.phases[1:], strict=False):
                time.sleep(before.hold_s)
                phase.act(self.target)
            if len(self.fault.phases) > 1:
                self.ended_at = time.time()
        except BaseException as exc:  # raised in the case's thread by join()
            self._error = exc

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"the fault {self.fault.name} failed: {self._error}") from (
                self._error
            )

    @property
    def over(self) -> bool:
        return not self._thread.is_alive()


def _probe(
    load: Workload, runs: dict[str, Started], timeline: _Timeline, deadline_s: float
) -> tuple[float | None, float | None]:
    """Start a probe every ``PROBE_EVERY_S`` until one completes and, for a held fault, one
    started after its end: the first one's completion time (unix), and the seconds from the
    fault's end to the second's completion."""
    deadline = time.monotonic() + deadline_s
    next_probe = 0.0
    probes: dict[str, Started] = {}
    first: float | None = None
    after_end: float | None = None
    held = len(timeline.fault.phases) > 1
    while time.monotonic() < deadline:
        if time.monotonic() >= next_probe:
            probe = load.start(probe=True, deadline_s=deadline_s)
            runs[probe.id] = probes[probe.id] = probe
            next_probe = time.monotonic() + PROBE_EVERY_S
        load.refresh(probes)
        done = [r for r in probes.values() if r.status == "COMPLETED" and r.finished_at]
        if done and first is None:
            first = min(r.finished_at for r in done if r.finished_at)
        ended = timeline.ended_at
        if held and ended is not None and after_end is None:
            later = [r.finished_at for r in done if r.finished_at and r.started_at >= ended]
            after_end = min(later) - ended if later else None
        if first is not None and (not held or after_end is not None):
            break
        time.sleep(0.2)
    return first, after_end
