"""PNG figures in the manner of the paper's figures 5 and 6: latency and throughput per system
against image size (scenario 1), concurrency (scenario 2) and pipeline length (scenario 3).

Needs matplotlib (the optional ``bench`` dependencies); drawn off-screen (Agg).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

__all__ = ["write_plots"]

# (x field, x label, log x) per scenario.
_AXES: Final[dict[str, tuple[str, str, bool]]] = {
    "1": ("size", "image size (bytes)", True),
    "2": ("concurrency", "concurrent workflows", True),
    "3": ("tasks", "image tasks per workflow", False),
}
_TITLES: Final = {
    "1": "Scenario 1: 10 workflows in parallel, by image size",
    "2": "Scenario 2: concurrent workflows, images 10 KB - 4 MB",
    "3": "Scenario 3: pipeline length, 2 MB images",
}


def write_plots(results: Sequence[dict[str, Any]], folder: Path) -> list[Path]:
    """One PNG per scenario present in ``results`` (the JSON rows); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for scenario, (x_field, x_label, log_x) in _AXES.items():
        rows = [
            r
            for r in results
            if r["scenario"] == scenario and r["completed"] and r.get("load") is None
        ]  # the closed loop's rows: an open loop's throughput is the rate it was given
        if not rows:
            continue
        links = sorted({r["link"] for r in rows if r["link"] != "none"}) or ["none"]
        fig, (lat, tput) = plt.subplots(1, 2, figsize=(12, 4.5))
        for system in dict.fromkeys(r["system"] for r in rows):
            points = sorted((r[x_field], r) for r in rows if r["system"] == system)
            xs = [x for x, _ in points]
            style = "--" if system.startswith("floor") else "-"
            lat.plot(xs, [r["p50_latency_s"] for _, r in points], style, marker="o", label=system)
            tput.plot(xs, [r["throughput_wps"] for _, r in points], style, marker="o", label=system)
        for ax, y_label in ((lat, "p50 latency (s)"), (tput, "throughput (workflows/s)")):
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            ax.set_yscale("log")
            if log_x:
                ax.set_xscale("log")
            ax.grid(True, which="both", alpha=0.3)
        lat.legend(fontsize="small")
        fig.suptitle(f"{_TITLES[scenario]} (S3 link: {', '.join(links)})")
        fig.tight_layout()
        path = folder / f"scenario{scenario}-{'-'.join(links)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
