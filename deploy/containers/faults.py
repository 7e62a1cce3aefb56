"""Faults struck at the stack as containers, judged by the chaos suite's own checks.

Each case runs on a fresh stack of two hosts (``ContainerStack``) with the chaos workload in
flight (``loadtest.chaos``: image workflows under every policy, each result checked by its
pixels, a probe workflow a second until one completes after the strike). A fault is what an
operator or the infrastructure does to a container:

* ``podman kill`` of each role's container (SIGKILL to all its processes), which podman then
  leaves stopped: the case starts it again ``EXTERNAL_RESTART_S`` later, as Kubernetes would
  restart a pod's container;
* a host cut from the network (``podman network disconnect`` of its pod) and joined again
  ``PARTITION_S`` later at the same address;
* a container removed and run again from the same image with its data folder (its volume):
  whatever it kept must come back from there.

Every workflow must end completed with the right pixels or failed with a reason (0 stuck, 0
lost, 0 wrong), no CDI object may be left in any minion, and the recovery is the time from the
strike to the first probe that completed.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from deploy.containers.stack import ContainerStack
from loadtest.chaos.checks import Facts
from loadtest.chaos.faults import EXTERNAL_RESTART_S, Fault
from loadtest.chaos.run import CaseResult, run_case
from loadtest.chaos.workload import Workload
from orchestrator.child_process import free_port

__all__ = ["CONTAINER_FAULTS", "PARTITION_S", "ContainerTarget", "run_faults"]

log = logging.getLogger(__name__)

# Longer than a worker's silence before it is presumed dead (WORKER_DEAD_AFTER_S, 6 s) and a
# scheduler's before it is stale (SCHEDULER_STALE_S, 10 s): the cut is noticed, not ridden out.
PARTITION_S: Final = 15.0


@dataclass
class ContainerTarget:
    """A stack as containers, as the chaos cases strike it (``loadtest.chaos.CaseTarget``)."""

    stack: ContainerStack
    kind: str = "containers"
    observed: dict[str, str] = field(default_factory=dict)  # no fault here asks the API

    def strike(self, fault: Fault[Any], load: Workload) -> None:
        fault.strike(self)

    def objects_held(self) -> int | None:
        return self.stack.objects_held()

    def loop_watch(self) -> None:
        """None: the scheduler's alive stamp is inside its container."""
        return None

    def minion_watch(self) -> None:
        """None: the minion's socket is inside its pod."""
        return None

    def check(self, fault: Fault[Any], facts: Facts) -> list[str]:
        """None beyond how every workflow ended: the checks of the process stack look at its
        processes, which run in containers here."""
        return []

    def later(self, delay: float, action: Callable[[], None], what: str) -> None:
        """``action`` after ``delay`` seconds, on a thread of its own (the repair the
        infrastructure makes while the case watches the workflows)."""

        def run() -> None:
            time.sleep(delay)
            try:
                action()
            except Exception:
                log.exception("%s failed", what)

        threading.Thread(target=run, name=f"repair {what}", daemon=True).start()


def _kill(role: str) -> Callable[[ContainerTarget], None]:
    def strike(target: ContainerTarget) -> None:
        name = target.stack.layout.container(role)
        target.stack.kill(name)
        target.later(EXTERNAL_RESTART_S, lambda: target.stack.restart(name), f"start {name}")

    return strike


def _partition(host: str) -> Callable[[ContainerTarget], None]:
    def strike(target: ContainerTarget) -> None:
        target.stack.disconnect(host)
        target.later(PARTITION_S, lambda: target.stack.connect(host), f"reconnect {host}")

    return strike


def _recreate(role: str) -> Callable[[ContainerTarget], None]:
    def strike(target: ContainerTarget) -> None:
        target.stack.recreate(target.stack.layout.container(role))

    return strike


CONTAINER_FAULTS: Final[tuple[Fault[ContainerTarget], ...]] = (
    Fault.at_once("kill-postgres", "podman kill of Postgres", _kill("postgres")),
    Fault.at_once("kill-redis", "podman kill of Redis", _kill("redis")),
    Fault.at_once("kill-s3", "podman kill of the S3 endpoint", _kill("s3")),
    Fault.at_once("kill-controller", "podman kill of the CDI controller", _kill("cdi-controller")),
    Fault.at_once("kill-api", "podman kill of the API", _kill("api")),
    Fault.at_once("kill-scheduler", "podman kill of the scheduler (host 1)", _kill("scheduler-1")),
    Fault.at_once("kill-worker", "podman kill of the worker on host 2", _kill("worker-2")),
    Fault.at_once("kill-minion-host2", "podman kill of host 2's minion", _kill("host2-minion")),
    Fault.at_once("kill-minion-host1", "podman kill of host 1's minion", _kill("host1-minion")),
    Fault.at_once(
        "partition-host2", "host 2 cut from the network, then joined", _partition("host2")
    ),
    Fault.at_once(
        "partition-host1", "host 1 cut from the network, then joined", _partition("host1")
    ),
    Fault.at_once("recreate-postgres", "Postgres run again on its volume", _recreate("postgres")),
    Fault.at_once("recreate-s3", "the S3 endpoint run again on its volume", _recreate("s3")),
)


def run_faults(
    faults: list[Fault[ContainerTarget]],
    *,
    workflows: int = 30,
    deadline_s: float = 240.0,
    logs_dir: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> list[CaseResult]:
    """Each fault on a fresh stack as containers (two hosts, two workers); the results.
    ``logs_dir``: keep every container's log there, a folder per fault."""
    tell = say or _stderr
    results = []
    for fault in faults:
        tell(f"containers: {fault.name} with {workflows} workflows ...")
        with tempfile.TemporaryDirectory(prefix="cdiflow-faults-") as folder:
            stack = ContainerStack(Path(folder) / "data", name=f"cdiflow-f{uuid.uuid4().hex[:6]}",
                                   hosts=2, workers=2, port=free_port())  # fmt: skip
            try:
                stack.start()
                began = time.monotonic()
                result = run_case(ContainerTarget(stack), fault, workflows=workflows,
                                  deadline_s=deadline_s)  # fmt: skip
                verdict = "ok" if result.passed else "FAILED"
                took = time.monotonic() - began
                tell(f"  {fault.name}: {verdict} in {took:.0f} s, recovery {result.recovery_s} s")
                if result.leaked_objects:
                    tell(f"  objects left: {stack.objects_left()}")
                results.append(result)
            finally:
                if logs_dir is not None:
                    stack.save_logs(logs_dir / fault.name)
                stack.stop(remove_data=True, timeout=5)
    return results


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
