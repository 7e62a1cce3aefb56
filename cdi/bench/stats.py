"""Summaries and the readable table shared by the benchmarks."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Result", "format_size", "render_table", "summarize"]


@dataclass(frozen=True)
class Result:
    backend: str
    size: int
    n: int
    mean_us: float
    p50_us: float
    p99_us: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: every figure is a measured sample)."""
    index = max(0, min(len(sorted_values) - 1, round(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def summarize(backend: str, size: int, samples_ns: Sequence[int]) -> Result:
    values = sorted(s / 1000 for s in samples_ns)
    return Result(
        backend=backend,
        size=size,
        n=len(values),
        mean_us=round(statistics.fmean(values), 2),
        p50_us=round(_percentile(values, 0.50), 2),
        p99_us=round(_percentile(values, 0.99), 2),
    )


def format_size(size: int) -> str:
    for unit, scale in (("MB", 1000**2), ("KB", 1000)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def render_table(results: Sequence[Result], baseline: str, subject: str) -> str:
    """p50 / p99 per backend and size, and how many times ``subject`` beats ``baseline``."""
    sizes = sorted({r.size for r in results})
    backends = list(dict.fromkeys(r.backend for r in results))
    by = {(r.backend, r.size): r for r in results}
    header = f"{'backend':<10}" + "".join(f"{format_size(s):>22}" for s in sizes)
    lines = [header, f"{'':<10}" + "".join(f"{'p50 / p99 (us)':>22}" for _ in sizes)]
    for backend in backends:
        cells = []
        for size in sizes:
            r = by.get((backend, size))
            cells.append(f"{r.p50_us:>10.1f} / {r.p99_us:<9.1f}" if r else f"{'-':>22}")
        lines.append(f"{backend:<10}" + "".join(f"{c:>22}" for c in cells))
    ratios = []
    for size in sizes:
        base, subj = by.get((baseline, size)), by.get((subject, size))
        ratios.append(f"{base.p50_us / subj.p50_us:>21.1f}x" if base and subj else f"{'-':>22}")
    lines.append(f"{subject + ' vs ' + baseline:<10}"[:10] + "".join(ratios))
    return "\n".join(lines)
