"""A soak: hours of steady load at a fraction of the stack's peak, and whether anything grows.

First the peak: ``inflight`` workflows kept in flight (closed loop) for ``peak_s``; the rate of
completions over its second half is the peak throughput. Then ``duration_s`` of open-loop
load at ``load`` times that rate (one start every ``1 / rate`` s, whatever the stack's pace),
while a ``Sampler`` records each piece's memory and open files, Postgres's size and Redis's
memory every ``sample_every_s``. Finally every workflow is judged like any chaos case.

The goal: each process's memory and open files, and Redis's memory, flat after warm-up: at
most ``GROWTH_GOAL_PCT`` between the start and the end of the last ``window_s`` (30 min, or
half a shorter soak). Postgres grows with the rows every run leaves (runs are kept): its
growth is given per workflow, which is what explains it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from loadtest.chaos.checks import all_running
from loadtest.chaos.faults import Target
from loadtest.chaos.judge import Tally, finished, judge
from loadtest.chaos.sampling import Sample, Sampler, growth
from loadtest.chaos.workload import Started, Workload

__all__ = ["GROWTH_GOAL_PCT", "SoakResult", "run_soak"]

GROWTH_GOAL_PCT: Final = 10.0
WINDOW_S: Final = 1800.0


@dataclass(kw_only=True)
class SoakResult(Tally):
    duration_s: float  # of the steady load
    peak_wps: float  # workflows a second the stack completed at its peak
    rate_wps: float  # the steady load's rate of starts
    load: float  # rate / peak
    window_s: float  # the span at the end over which growth is judged
    workflows: int
    completed_wps: float  # workflows a second that finished during the steady load
    behind_at_end: int  # started during the steady load, not finished at its end
    growth: dict[str, dict[str, float]]  # metric -> first, last, percent (over the window)
    postgres_bytes_per_workflow: float | None
    restarts: dict[str, int]  # by the supervisor, during the soak, per piece
    samples: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fault: str = "soak"
    target: str = "embedded"

    @property
    def flat(self) -> bool:
        """Every process's memory and open files, and Redis's memory, within the goal."""
        return all(
            g["percent"] <= GROWTH_GOAL_PCT
            for metric, g in self.growth.items()
            if metric != "postgres_bytes"
        )

    @property
    def passed(self) -> bool:
        return self.flat and self.ended_right and not self.problems

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed, "flat": self.flat}


def run_soak(
    target: Target,
    *,
    duration_s: float = 3600.0,
    load: float = 0.8,
    peak_s: float = 120.0,
    inflight: int = 64,
    sample_every_s: float = 30.0,
    deadline_s: float = 600.0,
) -> SoakResult:
    """Measure the peak, then hold ``load`` of it for ``duration_s`` and judge it all."""
    stack = target.stack
    since = time.time()
    work = Workload(stack)
    runs: dict[str, Started] = {}
    restarts_before = {p.name: p.restarts for p in stack.processes()}
    try:
        peak = _peak(work, runs, since, inflight=inflight, peak_s=peak_s)
        rate = load * peak
        with Sampler(stack, every_s=sample_every_s) as sampler:
            steady_from = time.time()
            _open_loop(work, runs, rate=rate, duration_s=duration_s)
            steady_to = time.time()
        tally = judge(work, runs, target, since=since, deadline_s=deadline_s)
        problems = all_running(target)
    finally:
        work.close()
    samples = sampler.samples
    window = min(WINDOW_S, duration_s / 2)
    metrics = sorted({m for s in samples for m in s.values})
    grown = {m: growth(samples, m, window) for m in metrics}
    return SoakResult(
        **vars(tally),
        duration_s=duration_s,
        peak_wps=round(peak, 2),
        rate_wps=round(rate, 2),
        load=load,
        window_s=window,
        workflows=len(runs),
        completed_wps=round(_finished_in(runs, steady_from, steady_to) / duration_s, 2),
        behind_at_end=_behind(runs, steady_from, steady_to),
        growth={m: g.as_dict() for m, g in grown.items()},
        postgres_bytes_per_workflow=_per_workflow(samples, runs, steady_from),
        restarts={p.name: p.restarts - restarts_before.get(p.name, 0) for p in stack.processes()},
        samples=[{"at_s": s.at_s, **s.values} for s in samples],
        problems=problems,
    )


def _peak(
    work: Workload, runs: dict[str, Started], since: float, *, inflight: int, peak_s: float
) -> float:
    """Completions a second with ``inflight`` kept in flight, over the second half of
    ``peak_s`` (the first warms the stack up)."""
    began = time.monotonic()
    mark: tuple[float, int] | None = None
    while (elapsed := time.monotonic() - began) < peak_s:
        done = finished(work, since)
        for _ in range(inflight - (len(runs) - done)):
            started = work.start()
            runs[started.id] = started
        if mark is None and elapsed >= peak_s / 2:
            mark = (time.monotonic(), done)
        time.sleep(0.5)
    assert mark is not None
    completed = finished(work, since) - mark[1]
    return max(completed / (time.monotonic() - mark[0]), 0.1)


def _open_loop(work: Workload, runs: dict[str, Started], *, rate: float, duration_s: float) -> None:
    """One start every ``1 / rate`` s for ``duration_s``; a start that falls behind (the API
    slow or refusing) is made up at once, so the rate holds on average."""
    began = time.monotonic()
    made = 0
    while (elapsed := time.monotonic() - began) < duration_s:
        due = int(elapsed * rate) + 1
        while made < due:
            started = work.start()
            runs[started.id] = started
            made += 1
        time.sleep(max(0.0, made / rate - (time.monotonic() - began)))


def _finished_in(runs: dict[str, Started], begin: float, end: float) -> int:
    """Runs that finished between ``begin`` and ``end``, by the end times the judge read."""
    return sum(r.finished_at is not None and begin <= r.finished_at <= end for r in runs.values())


def _behind(runs: dict[str, Started], begin: float, end: float) -> int:
    """Runs started from ``begin`` that had not finished by ``end``: the backlog the steady
    load left (0 when the stack kept up with the rate offered)."""
    return sum(
        begin <= r.started_at <= end and (r.finished_at is None or r.finished_at > end)
        for r in runs.values()
    )


def _per_workflow(
    samples: list[Sample], runs: dict[str, Started], steady_from: float
) -> float | None:
    """Postgres's growth from the first sample to the last (the steady load), per workflow
    started in that time."""
    sizes = [s.values["postgres_bytes"] for s in samples if "postgres_bytes" in s.values]
    started = sum(r.started_at >= steady_from for r in runs.values())
    if len(sizes) < 2 or not started:
        return None
    return round((sizes[-1] - sizes[0]) / started, 1)
