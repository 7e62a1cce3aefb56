"""CPU and memory each component of a system uses during one point of a benchmark.

Every process the benchmark started (its descendants: services, the system's own processes,
locust) is put in a component by its command line. CPU is the difference of each process's
user + system time between the start and the end of the point (a process that exits in
between loses its share; the systems' processes live for the whole run); memory is the
highest resident set seen per component, sampled twice a second. CPU per workflow is what
makes systems comparable on a busy machine: unlike latency, it hardly depends on what else
runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Final

import psutil

__all__ = ["ResourceMeter", "component_of"]

# First match wins: (a piece of the command line, the component it names).
_COMPONENTS: Final = (
    ("orchestrator.controller", "cdiflow api"),
    ("orchestrator.scheduler", "cdiflow scheduler"),
    ("orchestrator.worker", "cdiflow workers"),
    ("cdi.minion", "cdi minion"),
    ("cdi.controller", "cdi controller"),
    ("moto.server", "s3 (moto)"),
    ("redis-server", "redis"),
    ("postgres", "postgres"),
    ("locust", "locust (clients)"),
    ("celery", "celery workers"),
    ("conductor-server", "conductor server"),
    ("conductor_worker", "conductor workers"),
    ("ray_driver", "ray driver"),
    ("ray", "ray"),
    ("raylet", "ray"),
    ("gcs_server", "ray"),
    ("multiprocessing", "floor workers"),
)
_SAMPLE_S: Final = 0.5


def component_of(cmdline: str) -> str:
    """The component a process belongs to, from its command line."""
    for needle, name in _COMPONENTS:
        if needle in cmdline:
            return name
    return "benchmark driver"


@dataclass(frozen=True)
class _Sample:
    component: str
    cpu_s: float
    rss: int


class ResourceMeter:
    """``start()`` before a point, ``stop(workflows)`` after it: use per component."""

    def __init__(self) -> None:
        self._root = psutil.Process()
        self._before: dict[int, _Sample] = {}
        self._peak_rss: defaultdict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self) -> None:
        self._before = self._snapshot()
        self._peak_rss.clear()
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, name="resource-meter", daemon=True)
        self._sampler.start()

    def stop(self, workflows: int) -> dict[str, dict[str, float]]:
        """``{component: {"cpu_s", "cpu_ms_per_workflow", "peak_rss_mib"}}`` for the point."""
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        after = self._snapshot()
        self._note_rss(after)
        cpu: defaultdict[str, float] = defaultdict(float)
        for pid, now in after.items():
            then = self._before.get(pid)
            cpu[now.component] += now.cpu_s - (then.cpu_s if then is not None else 0.0)
        per = max(1, workflows)
        return {
            name: {
                "cpu_s": round(cpu[name], 3),
                "cpu_ms_per_workflow": round(cpu[name] * 1000 / per, 2),
                "peak_rss_mib": round(self._peak_rss[name] / 2**20, 1),
            }
            for name in sorted(cpu, key=lambda n: -cpu[n])
        }

    def _sample(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            self._note_rss(self._snapshot())

    def _note_rss(self, snapshot: dict[int, _Sample]) -> None:
        total: defaultdict[str, int] = defaultdict(int)
        for sample in snapshot.values():
            total[sample.component] += sample.rss
        for name, rss in total.items():
            self._peak_rss[name] = max(self._peak_rss[name], rss)

    def _snapshot(self) -> dict[int, _Sample]:
        out = {}
        for proc in [self._root, *self._root.children(recursive=True)]:
            # suppress: it exited meanwhile
            with contextlib.suppress(psutil.Error), proc.oneshot():
                times = proc.cpu_times()
                cmdline = " ".join(proc.cmdline()) or proc.name()
                out[proc.pid] = _Sample(
                    component_of(cmdline), times.user + times.system, proc.memory_info().rss
                )
        return out
