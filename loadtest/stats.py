"""Percentiles and the per-point result row shared by the quick bench and the load test."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "PointResult",
    "Summary",
    "WorkflowRecord",
    "busy_shares",
    "percentile",
    "summarize",
    "summarize_point",
    "window",
]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, as in ``cdi.bench.stats``: every figure is a measured sample."""
    index = max(0, min(len(sorted_values) - 1, round(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    p50: float
    p99: float
    p95: float = float("nan")


def summarize(values: Iterable[float]) -> Summary:
    ordered = sorted(values)
    if not ordered:
        return Summary(0, float("nan"), float("nan"), float("nan"))
    return Summary(
        len(ordered),
        statistics.fmean(ordered),
        percentile(ordered, 0.50),
        percentile(ordered, 0.99),
        percentile(ordered, 0.95),
    )


@dataclass(frozen=True)
class WorkflowRecord:
    """One workflow as the load generator saw it; times are Unix seconds on this machine."""

    system: str
    size: int  # bytes of the input image
    tasks: int
    submitted_at: float  # the client's clock just before the start request
    stored_at: float | None  # the system's own stamp of "result stored" (None: not finished)
    status: str  # COMPLETED, FAILED, ...
    error: str = ""
    ops_cpu_ms: float | None = None  # CPU time of its operations, where the system reports it
    # When the client learned the workflow had ended (its clock): ``noticed_at - stored_at``
    # is what the system's way of telling a client (long poll, subscription, poll) costs.
    noticed_at: float | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.stored_at is None else self.stored_at - self.submitted_at

    @property
    def notice_s(self) -> float | None:
        if self.stored_at is None or self.noticed_at is None:
            return None
        return self.noticed_at - self.stored_at

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkflowRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class PointResult:
    """One system at one point of a scenario: the JSON row of ``--json``."""

    system: str
    scenario: str
    size: int | None  # input bytes; None when the point mixes sizes (scenario 2)
    tasks: int
    concurrency: int
    completed: int
    failed: int
    mean_latency_s: float
    p50_latency_s: float
    p99_latency_s: float
    throughput_wps: float
    link: str = "loopback"
    round: int = 1  # which pass over the systems (``--rounds``)
    # Filled in against the floor of the same point (None for the floor itself or without one).
    overhead_p50_s: float | None = None
    throughput_vs_floor: float | None = None
    errors: list[str] = field(default_factory=list)
    # CPU and peak memory per component during the point (loadtest.resources.ResourceMeter).
    resources: dict[str, dict[str, float]] = field(default_factory=dict)
    # cdiflow only: each worker's share of the point's window spent running a task
    # (``busy_shares`` over the task runs in Postgres); a worker below 1 waited for work.
    workers_busy: dict[str, float] = field(default_factory=dict)
    # CPU ms per completed workflow spent in the image operations themselves (the task
    # functions' own threads), where the system reports it (every system of the load tests; None
    # when a workflow did not say); the
    # rest of ``resources`` is what the system spends around them.
    ops_cpu_ms_per_workflow: float | None = None
    p95_latency_s: float | None = None
    # How long after "result stored" the client learned of the end (ms, over completed
    # workflows): the cost of the system's way of telling a client.
    notice_p50_ms: float | None = None
    notice_mean_ms: float | None = None
    # Open loop: the fixed rate workflows were started at, and that rate as a share of the
    # same system's closed-loop throughput at the point; None for the closed loop.
    arrival_rate_wps: float | None = None
    load: float | None = None
    # loadtest.verify.verify_point: results stored = completed, each the reference's pixels.
    verified: dict[str, Any] = field(default_factory=dict)
    # What the system says of itself (Ray: bytes its object store spilled).
    peer_stats: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def window(records: Sequence[WorkflowRecord]) -> tuple[float, float] | None:
    """The span throughput is counted over: first submission to last result stored (Unix s)."""
    stored = [r.stored_at for r in records if r.status == "COMPLETED" and r.stored_at]
    if not stored:
        return None
    return min(r.submitted_at for r in records if r.submitted_at > 0), max(stored)


def busy_shares(
    runs: Iterable[tuple[str, float, float]], since: float, until: float
) -> dict[str, float]:
    """Each worker's share of ``[since, until]`` covered by its ``(worker, started, finished)``
    task runs (overlapping runs of a many-slot worker count once)."""
    if until <= since:
        return {}
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for worker, started, finished in runs:
        start, end = max(started, since), min(finished, until)
        if end > start:
            by_worker.setdefault(worker, []).append((start, end))
    shares = {}
    for worker, spans in sorted(by_worker.items()):
        covered, reach = 0.0, since
        for start, end in sorted(spans):
            if end > reach:
                covered += end - max(start, reach)
                reach = end
        shares[worker] = round(covered / (until - since), 4)
    return shares


def summarize_point(
    records: Sequence[WorkflowRecord],
    *,
    system: str,
    scenario: str,
    size: int | None,
    tasks: int,
    concurrency: int,
    link: str,
) -> PointResult:
    """Latency over completed workflows; throughput = completed / (last stored - first start)."""
    done = [r for r in records if r.status == "COMPLETED" and r.stored_at is not None]
    latency = summarize(r.latency_s for r in done if r.latency_s is not None)
    throughput = 0.0
    span = window(records)
    if span is not None:
        throughput = len(done) / (span[1] - span[0]) if span[1] > span[0] else float("inf")
    errors = sorted({r.error[:200] for r in records if r.status != "COMPLETED" and r.error})
    notice = summarize(r.notice_s * 1000 for r in done if r.notice_s is not None)
    return PointResult(
        system=system,
        scenario=scenario,
        size=size,
        tasks=tasks,
        concurrency=concurrency,
        completed=len(done),
        failed=len(records) - len(done),
        mean_latency_s=round(latency.mean, 4),
        p50_latency_s=round(latency.p50, 4),
        p99_latency_s=round(latency.p99, 4),
        throughput_wps=round(throughput, 3),
        link=link,
        errors=errors[:5],
        p95_latency_s=round(latency.p95, 4) if latency.n else None,
        notice_p50_ms=round(notice.p50, 2) if notice.n else None,
        notice_mean_ms=round(notice.mean, 2) if notice.n else None,
    )
