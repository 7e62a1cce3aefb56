"""CPU and memory each component of a system uses during one point of a benchmark.

Every process the benchmark started (its descendants: services, the system's own processes,
locust) is put in a component by its command line. CPU is the difference of each process's
user + system time between the start and the end of the point. The systems' processes live
for the whole run; locust, started per point, exits before the end and measures itself from
its first workflow to its last (``System.client_usage``; start-up excluded), reported with its
system-time part and the minor page faults (Linux: what mapping fresh memory costs, the
signature of data copied into new buffers); memory is the highest resident set seen per
component, sampled twice a second. CPU per workflow is what
makes systems comparable on a busy machine: unlike latency, it hardly depends on what else
runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import psutil

__all__ = ["LOCUST_COMPONENT", "ExitedUsage", "ResourceMeter", "component_of"]

LOCUST_COMPONENT: Final = "locust (clients)"

# First match wins: (a piece of the command line, the component it names). A process that
# matches none belongs to its parent's component (pool workers, forked helpers); a child of the
# benchmark itself that matches none is the floor's process pool.
_COMPONENTS: Final = (
    ("-m orchestrator.controller", "cdiflow api"),
    ("-m orchestrator.scheduler", "cdiflow scheduler"),
    ("-m orchestrator.worker", "cdiflow workers"),
    ("-m cdi.minion", "cdi minion"),
    ("cdi-minion", "cdi minion"),  # the binary, once the launcher has exec-ed it
    ("-m cdi.controller", "cdi controller"),
    # Before the services: Conductor's command line names the Postgres and Redis it uses.
    ("conductor-server", "conductor server"),
    ("conductor_worker", "conductor workers"),
    ("versitygw", "s3 (versitygw)"),
    ("moto.server", "s3 (moto)"),
    ("-m cdi.link_emulator --target", "s3 link proxy"),
    ("-m cdi.link_emulator", "host link emulator"),  # --hosts: the link between the hosts
    ("redis-server", "redis"),
    ("postgres", "postgres"),
    ("-m locust", LOCUST_COMPONENT),
    ("-m celery", "celery workers"),
    ("ray_driver", "ray driver"),
    ("temporal_driver", "temporal driver"),
    ("temporal_worker", "temporal workers"),
    ("server start-dev", "temporal server"),
    ("ray::", "ray"),
    ("/ray/", "ray"),
    ("-m ray", "ray"),
)
_DRIVER: Final = "benchmark driver"
_SAMPLE_S: Final = 0.5
_RELIST_EVERY: Final = 10  # samples: descendants are listed again every 5 s


def component_of(cmdline: str) -> str | None:
    """The component a process's command line names, or ``None`` (then: its parent's)."""
    for needle, name in _COMPONENTS:
        if needle in cmdline:
            return name
    return None


@dataclass(frozen=True)
class ExitedUsage:
    """What a process that ended during a point measured of itself over the point."""

    cpu_s: float  # user + system
    sys_s: float
    peak_rss: int  # bytes


@dataclass(frozen=True)
class _Sample:
    component: str
    cpu_s: float
    sys_s: float
    faults: int
    rss: int


def _minor_faults(pid: int) -> int:
    """Minor page faults of ``pid`` so far (Linux ``/proc/<pid>/stat`` field 10); 0 elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return 0
    return int(fields[7])  # fields[0] is field 3 (state)


class ResourceMeter:
    """``start()`` before a point, ``stop(workflows)`` after it: use per component."""

    def __init__(self) -> None:
        self._root = psutil.Process()
        self._before: dict[int, _Sample] = {}
        self._peak_rss: defaultdict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._components: dict[psutil.Process, str] = {}

    def start(self) -> None:
        self._before = self._snapshot()
        self._peak_rss.clear()
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, name="resource-meter", daemon=True)
        self._sampler.start()

    def stop(
        self, workflows: int, exited: Mapping[str, ExitedUsage] | None = None
    ) -> dict[str, dict[str, float]]:
        """``{component: {"cpu_s", "cpu_ms_per_workflow", "sys_ms_per_workflow",
        "page_faults_per_workflow", "peak_rss_mib"}}`` for the point. ``exited``: what processes
        that ended during the point measured of themselves, by component."""
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        after = self._snapshot()
        self._note_rss(after)
        cpu: defaultdict[str, float] = defaultdict(float)
        sys: defaultdict[str, float] = defaultdict(float)
        faults: defaultdict[str, int] = defaultdict(int)
        for pid, now in after.items():
            then = self._before.get(pid) or _Sample(now.component, 0.0, 0.0, 0, 0)
            cpu[now.component] += now.cpu_s - then.cpu_s
            sys[now.component] += now.sys_s - then.sys_s
            faults[now.component] += now.faults - then.faults
        for name, usage in (exited or {}).items():
            cpu[name] += usage.cpu_s
            sys[name] += usage.sys_s
            self._note_peaks({name: usage.peak_rss})
        per = max(1, workflows)
        return {
            name: {
                "cpu_s": round(cpu[name], 3),
                "cpu_ms_per_workflow": round(cpu[name] * 1000 / per, 2),
                "sys_ms_per_workflow": round(sys[name] * 1000 / per, 2),
                "page_faults_per_workflow": round(faults[name] / per, 1),
                "peak_rss_mib": round(self._peak_rss[name] / 2**20, 1),
            }
            for name in sorted(cpu, key=lambda n: -cpu[n])
        }

    def _sample(self) -> None:
        # Between the full looks only resident memory is read, of the processes last listed:
        # listing descendants scans every process on the machine, and a full look reads several
        # files per process: CPU the measured system would lose on two cores.
        procs = self._list()
        samples = 0
        while not self._stop.wait(_SAMPLE_S):
            samples += 1
            if samples % _RELIST_EVERY == 0:  # processes that started meanwhile (Ray's workers)
                procs = self._list()
            total: defaultdict[str, int] = defaultdict(int)
            for proc, name in procs:
                with contextlib.suppress(psutil.Error):  # it exited meanwhile
                    total[name] += proc.memory_info().rss
            self._note_peaks(total)

    def _note_rss(self, snapshot: dict[int, _Sample]) -> None:
        total: defaultdict[str, int] = defaultdict(int)
        for sample in snapshot.values():
            total[sample.component] += sample.rss
        self._note_peaks(total)

    def _note_peaks(self, total: dict[str, int]) -> None:
        for name, rss in total.items():
            self._peak_rss[name] = max(self._peak_rss[name], rss)

    def _list(self) -> list[tuple[psutil.Process, str]]:
        """The benchmark and its descendants with their components. A process whose command
        line names its component keeps it (psutil's ``Process`` compares PID and start time);
        the others (pool workers, forks) take their parent's at each listing."""
        listed: list[tuple[psutil.Process, str]] = []
        names: dict[int, str] = {self._root.pid: _DRIVER}
        # Parents come before their children in psutil's recursive listing.
        for proc in [self._root, *self._root.children(recursive=True)]:
            name = self._components.get(proc)
            if name is None:
                with contextlib.suppress(psutil.Error):  # it exited meanwhile
                    own = component_of(" ".join(proc.cmdline()) or proc.name())
                    if own is not None:  # a process caught between fork and exec names none
                        self._components[proc] = own
                    name = own or self._inherited(proc, names)
            if name is not None:
                names[proc.pid] = name
                listed.append((proc, name))
        return listed

    def _inherited(self, proc: psutil.Process, names: dict[int, str]) -> str:
        if proc.pid == self._root.pid:
            return _DRIVER
        if proc.ppid() == self._root.pid:
            return "floor workers"  # the benchmark's own process pool
        return names.get(proc.ppid(), _DRIVER)

    def _snapshot(self) -> dict[int, _Sample]:
        out: dict[int, _Sample] = {}
        for proc, name in self._list():
            with contextlib.suppress(psutil.Error), proc.oneshot():  # it exited meanwhile
                times = proc.cpu_times()
                out[proc.pid] = _Sample(
                    name,
                    times.user + times.system,
                    times.system,
                    _minor_faults(proc.pid),
                    proc.memory_info().rss,
                )
        return out
