"""Run the roles as processes, wire them together, collect what they measured.

Each role is a program of its own, ``python -m apps.ar.role_process``, as each is a container
in the paper, with a socket pair to this process; a role placed on another host is started
inside that host's network namespace (``Host.wrap``), the socket pair passed down to it.
Not ``multiprocessing``'s spawn: that imports the parent's main module in every child, and
under the ``cdiflow`` command that is the whole orchestrator, in every role's memory.

The conversation: this process sends the run's configuration; every role says ``ready``
with its address; this process sends each the others' addresses; every role says
``connected``; this process says ``go`` to the receivers first and the extractor last; each
role answers ``done`` with its figures. A role that raises sends its traceback instead; one
that dies closes its end of the pair. Either stops every other role (they see their pipe
close, or their peers go) and raises ``RoleFailed``.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import psutil

from apps.ar.config import RunConfig
from apps.ar.errors import RoleFailed
from apps.ar.links import Peers, backend
from apps.ar.roles import RoleStats, peak_rss
from cdi.child import python_module
from cdi.minion.launcher import BINARY_NAME

__all__ = ["PipelineResult", "run_floor", "run_pipeline", "run_pool"]

_MB = 1e6


@dataclass
class _Role:
    name: str
    index: int
    process: subprocess.Popen[bytes]
    conn: Connection

    @property
    def label(self) -> str:
        return (
            self.name if self.name in ("extractor", "combinator") else f"{self.name} {self.index}"
        )


@dataclass
class PipelineResult:
    """One run's figures: each role's, and the CDI runtime's when one served it (as the
    ``minion`` role: its minions and their gateways, across hosts the controller too)."""

    config: RunConfig
    roles: list[RoleStats]
    minion_cpu_s: float | None = None
    runtime_cpu_s: dict[str, float] = field(default_factory=dict)
    """``minion_cpu_s`` by part: each minion (``runtime_label``), the Python launcher beside it
    (``<label> relay``: its directory relay), the controller."""
    minion_peak_rss: int | None = None
    """The largest of the runtime's processes (each with its children: a native minion under
    the Python process that runs its gateway)."""

    def of(self, role: str) -> list[RoleStats]:
        return [r for r in self.roles if r.role == role]

    @property
    def frames(self) -> int:
        """Frames that came out (the combinator's, or all the references' together)."""
        out = self.of("combinator") or self.of("floor") or self.of("pool")
        return sum(r.frames for r in out)

    @property
    def seconds(self) -> float:
        """From the first ``go`` to the last role's end."""
        return (max(r.end_ns for r in self.roles) - min(r.go_ns for r in self.roles)) / 1e9

    @property
    def fps(self) -> float:
        return self.frames / self.seconds

    @property
    def latency_ms_p50(self) -> float:
        latencies = [ns for r in self.roles for ns in r.latencies_ns]
        return statistics.median(latencies) / 1e6

    def cpu_ms_per_frame(self) -> dict[str, float]:
        """CPU per output frame by role: all detectors (or pool workers) together."""
        totals: dict[str, float] = {}
        for r in self.roles:
            totals[r.role] = totals.get(r.role, 0.0) + r.cpu_s
        if self.minion_cpu_s is not None:
            totals["minion"] = self.minion_cpu_s
        return {role: 1000 * cpu / self.frames for role, cpu in totals.items()}

    def cpu_ms_per_frame_split(self) -> tuple[float, float | None, float]:
        """All roles' CPU per frame (the sum of ``cpu_ms_per_frame``) as three parts, each
        measured where it is spent and none below zero: the application's own work
        (decode, detect, draw, encode); moving frames (each role's thread inside its end
        of the pipeline, the role's other threads, and the CDI runtime); the roles' own
        loops (the rest). Moving is ``None`` for the references, which move nothing (their
        other threads, if any, count in the rest)."""
        compute = sum(r.compute_s for r in self.roles)
        moves = self.config.backend not in ("floor", "pool")
        moving = (
            sum(r.link_s + r.threads_s for r in self.roles) + (self.minion_cpu_s or 0.0)
            if moves
            else None
        )
        rest = sum(
            r.cpu_s - r.compute_s - ((r.link_s + r.threads_s) if moves else 0.0) for r in self.roles
        )
        per_frame = 1000 / self.frames
        return (
            compute * per_frame,
            None if moving is None else moving * per_frame,
            rest * per_frame,
        )

    def moving_ms_per_frame_by_part(self) -> dict[str, float]:
        """Where ``cpu_ms_per_frame_split``'s moving part is spent: each role's thread in its
        end of the pipeline (``<role> link``) and its other threads (``<role> threads``),
        detectors together, and each process of the CDI runtime by ``runtime_label``."""
        parts: dict[str, float] = {}
        for r in self.roles:
            for kind, cpu in (("link", r.link_s), ("threads", r.threads_s)):
                parts[f"{r.role} {kind}"] = parts.get(f"{r.role} {kind}", 0.0) + cpu
        parts.update(self.runtime_cpu_s)
        return {part: 1000 * cpu / self.frames for part, cpu in parts.items()}

    def cpu_ms_per_frame_outside_compute(self) -> float:
        """CPU per frame of every role outside the application's own work (decode, detect,
        draw, encode, each timed on its thread), the minion's included: moving frames,
        measured without the floor. Unlike a difference of totals it does not carry the
        detectors' run-to-run noise, but it misses what moving costs the work itself
        (caches a copy has flushed)."""
        outside = sum(r.cpu_s - r.compute_s for r in self.roles) + (self.minion_cpu_s or 0.0)
        return 1000 * outside / self.frames

    def peak_rss_mb(self) -> dict[str, float]:
        """Peak resident memory by role: the largest of the detectors (or pool workers)."""
        peaks: dict[str, int] = {}
        for r in self.roles:
            peaks[r.role] = max(peaks.get(r.role, 0), r.peak_rss)
        if self.minion_peak_rss is not None:
            peaks["minion"] = self.minion_peak_rss
        return {role: peak / _MB for role, peak in peaks.items()}

    def detector_growth_mb(self) -> float | None:
        """How far the largest detector's memory grew past the process with its code loaded:
        its frame buffers (mapped objects included) and the detector's working memory."""
        growth = [r.peak_rss - r.base_rss for r in self.of("detector")]
        return max(growth) / _MB if growth else None

    def boxes(self) -> list[list[list[float]]]:
        """The boxes of every output frame, in order (pipeline and floor runs)."""
        (out,) = self.of("combinator") or self.of("floor")
        return out.boxes


def _start(name: str, index: int, config: RunConfig) -> _Role:
    mine, theirs = socket.socketpair()
    argv = python_module("apps.ar.role_process", str(theirs.fileno()), name, str(index))
    host = config.site(name, index).host
    try:
        process = subprocess.Popen(
            host.wrap(argv) if host is not None else argv,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
    finally:
        theirs.close()
    role = _Role(name, index, process, Connection(mine.detach()))
    _send(role, config)
    return role


def _send(role: _Role, message: Any) -> None:
    try:
        role.conn.send(message)
    except OSError:
        raise RoleFailed(
            role.label, f"the process ended (exit status {role.process.poll()})"
        ) from None


def _receive(role: _Role) -> tuple[str, Any]:
    """The role's next message; its end of the pipe closing means it died."""
    try:
        kind, payload = role.conn.recv()
    except (EOFError, ConnectionError):
        try:
            status = role.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            status = None
        raise RoleFailed(role.label, f"the process ended (exit status {status})") from None
    if kind == "error":
        raise RoleFailed(role.label, payload)
    return kind, payload


def _gather(roles: list[_Role], expect: str, timeout: float) -> list[Any]:
    """Every role's next message, which must be ``expect``; the first failure raises."""
    answers: dict[int, Any] = {}
    pending = {role.conn.fileno(): i for i, role in enumerate(roles)}
    while pending:
        ready = wait(list(pending), timeout)
        if not ready:
            raise RoleFailed(roles[min(pending.values())].label, f"no answer within {timeout} s")
        for fd in ready:
            i = pending.pop(fd)  # type: ignore[arg-type]
            kind, payload = _receive(roles[i])
            if kind != expect:
                raise RoleFailed(roles[i].label, f"said {kind!r} where {expect!r} was due")
            answers[i] = payload
    return [answers[i] for i in range(len(roles))]


@contextmanager
def _processes(wanted: list[tuple[str, int]], config: RunConfig) -> Iterator[list[_Role]]:
    roles: list[_Role] = []
    try:
        for name, index in wanted:
            roles.append(_start(name, index, config))
        yield roles
    finally:
        for role in roles:
            role.conn.close()  # a role still waiting for its next word ends on its own
        for role in roles:
            try:
                role.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                role.process.kill()  # our own child, by its handle
                role.process.wait()


def _converse(
    wanted: list[tuple[str, int]], config: RunConfig, runtime_pids: Sequence[int], setup_s: float
) -> PipelineResult:
    with _processes(wanted, config) as roles:
        addresses = _gather(roles, "ready", setup_s)
        by_name = {(r.name, r.index): a for r, a in zip(roles, addresses, strict=True)}
        peers = Peers(
            [by_name.get(("detector", k), "") for k in range(config.detectors)],
            by_name.get(("combinator", 0), ""),
        )
        for role in roles:
            _send(role, peers)
        _gather(roles, "connected", setup_s)
        runtime = [psutil.Process(pid) for pid in runtime_pids]
        runtime_cpu = _cpu_by_pid(runtime)
        for role in sorted(roles, key=lambda r: r.name == "extractor"):
            _send(role, "go")
        stats: list[RoleStats] = _gather(roles, "done", config.timeout_s * 4)
        result = PipelineResult(config, stats)
        if runtime:
            for index, process in enumerate(runtime):
                label = runtime_label(index, len(runtime))
                for pid, cpu in _cpu_by_pid([process]).items():
                    part = label if label == "controller" or _native(pid) else f"{label} relay"
                    spent = cpu - runtime_cpu.get(pid, 0.0)
                    result.runtime_cpu_s[part] = result.runtime_cpu_s.get(part, 0.0) + spent
            result.minion_cpu_s = sum(result.runtime_cpu_s.values())
            result.minion_peak_rss = max(_peak_rss_with_children(p) for p in runtime)
        return result


def runtime_label(index: int, count: int) -> str:
    """The name of the ``index``-th of ``count`` runtime processes (``runtime.Prepared``):
    one host's minion, or across hosts each host's minion (its gateway inside it), then the
    controller."""
    if count == 1:
        return "minion"
    return "controller" if index == count - 1 else f"minion host {index}"


def _native(pid: int) -> bool:
    """Whether ``pid`` is the native minion; else, beside a minion, the Python launcher that
    relays its object events to the controller's directory (``cdi.minion.launcher``)."""
    with suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).name() == BINARY_NAME
    return False


def _family(process: psutil.Process) -> list[psutil.Process]:
    return [process, *process.children(recursive=True)]


def _cpu_by_pid(processes: list[psutil.Process]) -> dict[int, float]:
    """CPU time of ``processes`` and of their children, seconds, by PID. Differences are
    taken PID by PID, so none is below zero: a child that ended meanwhile is missing from
    the second reading and left out, one started meanwhile counts from its start."""
    cpu: dict[int, float] = {}
    for one in (one for process in processes for one in _family(process)):
        with suppress(psutil.NoSuchProcess):
            times = one.cpu_times()
            cpu[one.pid] = times.user + times.system
    return cpu


def _peak_rss_with_children(process: psutil.Process) -> int:
    total = 0
    for one in _family(process):
        with suppress(FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            total += peak_rss(one.pid)
    return total


def run_pipeline(
    config: RunConfig, runtime_pids: Sequence[int] = (), setup_s: float = 60.0
) -> PipelineResult:
    """Run the extractor, ``config.detectors`` detectors and the combinator over
    ``config.backend``, each on its host (``config.placement``); ``runtime_pids``: the CDI
    runtime serving a CDI backend (``apps.ar.runtime``), whose CPU and peak memory count as
    the ``minion`` role's."""
    # An unavailable backend fails here, before any process starts.
    backend(config.backend, config.hosts)
    wanted = [("combinator", 0), *(("detector", k) for k in range(config.detectors))]
    return _converse([*wanted, ("extractor", 0)], config, runtime_pids, setup_s)


def run_floor(config: RunConfig, setup_s: float = 60.0) -> PipelineResult:
    """The whole application in one process: the floor any version's CPU is measured against."""
    return _converse([("floor", 0)], config, (), setup_s)


def run_pool(config: RunConfig, setup_s: float = 120.0) -> PipelineResult:
    """Detection alone in ``config.detectors`` processes, on frames each already holds."""
    return _converse([("pool", k) for k in range(config.detectors)], config, (), setup_s)
