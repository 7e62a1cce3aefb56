"""The readable table of ``cdiflow bench ar``, and its figures (``--plots``).

The figures follow the paper's Figs. 3-6 (CPU and memory of each container, per version of
the application: Figs. 5-6 on one host, 3-4 across hosts), with what a single run can add:
how each version scales with the number of detectors, against detection alone in a pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["render_table", "write_plots"]

_ROLES = ("extractor", "detector", "combinator", "minion", "floor", "pool")


def _cells(values: dict[str, float], digits: int) -> str:
    return " ".join(f"{role[:4]} {values[role]:.{digits}f}" for role in _ROLES if role in values)


def _where(doc: dict[str, Any]) -> str:
    """Where the pipelines ran, in words."""
    hosts = doc["hosts"]
    if hosts["count"] == 1:
        return "one host"
    return "two hosts" + (" (loopback addresses)" if hosts["kind"] == "loopback" else "")


def render_table(doc: dict[str, Any]) -> str:
    video = doc["video"]
    lines = [
        f"video {video['width']}x{video['height']}, {video['frames']} frames "
        f"({video['frame_mb']:.2f} MB a frame); {doc['depth']} frame(s) in flight per "
        f"detector; pipelines on {_where(doc)}; {doc['rounds']} round(s), medians",
        "",
        f"{'backend':<9}{'N':>3}{'fps':>7}{'p50 ms':>8}{'moving':>8}"
        f"  {'CPU ms/frame by role':<46}peak RSS MB by role",
    ]
    for row in doc["results"]:
        moving = row["cpu_ms_per_frame_moving"]
        lines.append(
            f"{row['backend']:<9}{row['detectors']:>3}{row['fps']:>7.2f}"
            f"{row['latency_ms_p50']:>8.0f}{'-' if moving is None else f'{moving:.2f}':>8}"
            f"  {_cells(row['cpu_ms_per_frame'], 2):<46}{_cells(row['peak_rss_mb'], 0)}"
        )
    lines += [
        "",
        "moving: CPU per frame inside the roles' ends of the pipeline, their other threads "
        "and the CDI runtime",
    ]
    if doc["outside_compute"]:
        outside = ", ".join(
            f"{r['backend']}/{r['detectors']} {r['cpu_ms_per_frame']:.2f}"
            for r in doc["outside_compute"]
            if r["backend"] != "floor"
        )
        lines.append(f"CPU ms/frame outside decode, detect, draw, encode: {outside}")
    for r in doc.get("moving_by_part", []):
        parts = sorted(r["cpu_ms_per_frame"].items(), key=lambda part: -part[1])
        spent = ", ".join(f"{name} {ms:.2f}" for name, ms in parts if ms >= 0.005)
        lines.append(f"moving, {r['backend']}/{r['detectors']}: {spent}")
    for goal in doc["goals"]:
        parts = [
            f"{key} {value:.2f}"
            for key, value in goal.items()
            if key not in ("backend", "detectors")
        ]
        lines.append(f"{goal['backend']}, {goal['detectors']} detector(s): {', '.join(parts)}")
    return "\n".join(lines)


def write_plots(doc: dict[str, Any], folder: Path) -> list[Path]:
    """Four PNGs: CPU and memory by role for each backend (at the largest detector count),
    fps and moving CPU by detector count. Needs matplotlib (the ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    folder.mkdir(parents=True, exist_ok=True)
    rows: Sequence[dict[str, Any]] = doc["results"]
    pipelines = [r for r in rows if r["backend"] not in ("floor", "pool")]
    most = max((r["detectors"] for r in pipelines), default=1)
    at_most = [r for r in pipelines if r["detectors"] == most]
    written = []
    for key, unit, name in (
        ("cpu_ms_per_frame", "CPU ms per frame", "ar-cpu.png"),
        ("peak_rss_mb", "peak RSS (MB)", "ar-memory.png"),
    ):
        fig, ax = plt.subplots(figsize=(9, 4.5))
        roles = [role for role in _ROLES if any(role in r[key] for r in at_most)]
        width = 0.8 / max(1, len(roles))
        for i, role in enumerate(roles):
            xs = [j + i * width for j in range(len(at_most))]
            ax.bar(xs, [r[key].get(role, 0.0) for r in at_most], width, label=role)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(at_most))])
        ax.set_xticklabels([r["backend"] for r in at_most])
        ax.set_ylabel(unit)
        ax.set_title(f"AR application on {_where(doc)}, {most} detectors: {unit} by role")
        ax.legend(fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        written.append(_save(fig, folder / name))
    for key, unit, name, names in (
        ("fps", "frames per second", "ar-fps.png", None),
        ("cpu_ms_per_frame_moving", "CPU ms per frame moving frames", "ar-moving.png", "pipes"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for backend in dict.fromkeys(r["backend"] for r in rows if r["backend"] != "floor"):
            if names and backend == "pool":
                continue
            points = sorted((r["detectors"], r[key]) for r in rows if r["backend"] == backend)
            style = "--" if backend == "pool" else "-"
            ax.plot(
                [x for x, _ in points], [y for _, y in points], style, marker="o", label=backend
            )
        ax.set_xlabel("detectors")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(unit)
        ax.set_title(f"AR application on {_where(doc)}: {unit}, by detectors")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        written.append(_save(fig, folder / name))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
