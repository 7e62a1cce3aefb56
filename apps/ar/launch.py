"""Run the roles as processes, wire them together, collect what they measured.

Each role is a spawned process (``apps.ar.roles.role_main``) with a pipe to this one. The
conversation: every role says ``ready`` with its address; this process sends each the
others' addresses; every role says ``connected``; this process says ``go`` to the receivers
first and the extractor last; each role answers ``done`` with its figures. A role that raises
sends its traceback instead; one that dies is noticed by its process sentinel. Either stops
every other role and raises ``RoleFailed``.
"""

from __future__ import annotations

import multiprocessing
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import psutil

from apps.ar.config import RunConfig
from apps.ar.errors import RoleFailed
from apps.ar.links import Peers, backend
from apps.ar.roles import RoleStats, peak_rss, role_main

__all__ = ["PipelineResult", "run_floor", "run_pipeline", "run_pool"]

_MB = 1e6


@dataclass
class _Role:
    name: str
    index: int
    process: BaseProcess
    conn: Connection

    @property
    def label(self) -> str:
        return (
            self.name if self.name in ("extractor", "combinator") else f"{self.name} {self.index}"
        )


@dataclass
class PipelineResult:
    """One run's figures: each role's, and the minion's when one served it."""

    config: RunConfig
    roles: list[RoleStats]
    minion_cpu_s: float | None = None
    minion_peak_rss: int | None = None

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

    def ready_rss_mb(self) -> dict[str, float]:
        """Resident memory by role once set up, before the first frame (the largest)."""
        ready: dict[str, int] = {}
        for r in self.roles:
            ready[r.role] = max(ready.get(r.role, 0), r.ready_rss)
        return {role: rss / _MB for role, rss in ready.items()}

    def boxes(self) -> list[list[list[float]]]:
        """The boxes of every output frame, in order (pipeline and floor runs)."""
        (out,) = self.of("combinator") or self.of("floor")
        return out.boxes


def _start(context: Any, name: str, index: int, config: RunConfig) -> _Role:
    mine, theirs = context.Pipe()
    process = context.Process(
        target=role_main, args=(name, index, config, theirs), name=f"ar-{name}-{index}"
    )
    process.start()
    theirs.close()
    return _Role(name, index, process, mine)


def _receive(role: _Role, timeout: float) -> tuple[str, Any]:
    ready = wait([role.conn, role.process.sentinel], timeout)
    if role.conn in ready:
        try:
            kind, payload = role.conn.recv()
        except EOFError:
            pass
        else:
            if kind == "error":
                raise RoleFailed(role.label, payload)
            return kind, payload
    if not ready:
        raise RoleFailed(role.label, f"no answer within {timeout} s")
    role.process.join(timeout=5)
    raise RoleFailed(role.label, f"the process exited with status {role.process.exitcode}")


def _gather(roles: list[_Role], expect: str, timeout: float) -> list[Any]:
    """Every role's next message, which must be ``expect``; the first failure raises."""
    answers: dict[int, Any] = {}
    pending = list(range(len(roles)))
    while pending:
        waiting = [roles[i].conn for i in pending] + [roles[i].process.sentinel for i in pending]
        if not wait(waiting, timeout):
            raise RoleFailed(roles[pending[0]].label, f"no answer within {timeout} s")
        for i in list(pending):
            role = roles[i]
            if role.conn.poll() or not role.process.is_alive():
                kind, payload = _receive(role, timeout)
                if kind != expect:
                    raise RoleFailed(role.label, f"said {kind!r} where {expect!r} was due")
                answers[i] = payload
                pending.remove(i)
    return [answers[i] for i in range(len(roles))]


@contextmanager
def _processes(
    context: Any, wanted: list[tuple[str, int]], config: RunConfig
) -> Iterator[list[_Role]]:
    roles: list[_Role] = []
    try:
        for name, index in wanted:
            roles.append(_start(context, name, index, config))
        yield roles
    finally:
        for role in roles:
            role.process.join(timeout=10)
            if role.process.is_alive():
                role.process.kill()  # our own child, by its handle
                role.process.join()
            role.conn.close()


def _converse(
    wanted: list[tuple[str, int]], config: RunConfig, minion_pid: int | None, setup_s: float
) -> PipelineResult:
    context = multiprocessing.get_context("spawn")
    with _processes(context, wanted, config) as roles:
        addresses = _gather(roles, "ready", setup_s)
        by_name = {(r.name, r.index): a for r, a in zip(roles, addresses, strict=True)}
        peers = Peers(
            [by_name.get(("detector", k), "") for k in range(config.detectors)],
            by_name.get(("combinator", 0), ""),
        )
        for role in roles:
            role.conn.send(peers)
        _gather(roles, "connected", setup_s)
        minion = psutil.Process(minion_pid) if minion_pid else None
        minion_cpu = _cpu(minion)
        for role in sorted(roles, key=lambda r: r.name == "extractor"):
            role.conn.send("go")
        stats: list[RoleStats] = _gather(roles, "done", config.timeout_s * 4)
        result = PipelineResult(config, stats)
        if minion is not None:
            result.minion_cpu_s = _cpu(minion) - minion_cpu
            result.minion_peak_rss = peak_rss(minion.pid)
        return result


def _cpu(process: psutil.Process | None) -> float:
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def run_pipeline(
    config: RunConfig, minion_pid: int | None = None, setup_s: float = 60.0
) -> PipelineResult:
    """Run the extractor, ``config.detectors`` detectors and the combinator over
    ``config.backend``; ``minion_pid``: the minion serving a CDI backend, whose CPU and peak
    memory count as a role's."""
    backend(config.backend)  # an unavailable backend fails here, before any process starts
    wanted = [("combinator", 0), *(("detector", k) for k in range(config.detectors))]
    return _converse([*wanted, ("extractor", 0)], config, minion_pid, setup_s)


def run_floor(config: RunConfig, setup_s: float = 60.0) -> PipelineResult:
    """The whole application in one process: the floor any version's CPU is measured against."""
    return _converse([("floor", 0)], config, None, setup_s)


def run_pool(config: RunConfig, setup_s: float = 120.0) -> PipelineResult:
    """Detection alone in ``config.detectors`` processes, on frames each already holds."""
    return _converse([("pool", k) for k in range(config.detectors)], config, None, setup_s)
