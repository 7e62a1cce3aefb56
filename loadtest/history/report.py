"""``cdiflow bench history``'s table: each call's median at every size and its ratio to the
smallest, then the history's make-up, one dashboard tab's cost, pruning and the plans."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["PRUNE_DELAY_GOAL_MS", "RATIO_GOAL", "history_table", "label"]

RATIO_GOAL: Final = 1.5  # every call at a size within this of its time at the smallest
PRUNE_DELAY_GOAL_MS: Final = 10.0  # pruning delays a running workflow by at most this (p95)


def label(size: int) -> str:
    """10000 -> 10k, 1000000 -> 1M."""
    for unit, scale in (("M", 1_000_000), ("k", 1_000)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def history_table(report: dict[str, Any]) -> str:
    """Calls by history size (median ms), then each larger size's ratio to the smallest (the
    median over the rounds of the two times each round took, seconds apart; ``*`` over
    ``RATIO_GOAL``); then the history's make-up, one dashboard tab's cost and the slowest
    plans."""
    sizes = [h["workflows"] for h in report["histories"]]
    by_call: dict[str, dict[int, dict[str, Any]]] = {}
    for row in report["results"]:
        by_call.setdefault(row["call"], {})[row["workflows"]] = row
    width = max(len(c) for c in by_call) + 2
    ratios = [f"{label(s)}/{label(sizes[0])}" for s in sizes[1:]]
    lines = [f"{'call (median ms)':<{width}}" + "".join(f"{label(s):>11}" for s in sizes)
             + "".join(f"{r:>12}" for r in ratios)]  # fmt: skip
    for call, rows in by_call.items():
        cells = "".join(f"{rows[s]['p50_ms']:>11.1f}" for s in sizes)
        for size in sizes[1:]:
            ratio = rows[size]["ratio"]
            cells += f"{ratio:>10.2f}x" + ("*" if ratio > RATIO_GOAL else " ")
        lines.append(f"{call:<{width}}{cells}")
    if ratios:
        first = label(sizes[0])
        lines.append(f"ratio: the median over the rounds of a round's time at that size over "
                     f"its time at {first} just before; * over {RATIO_GOAL}x")  # fmt: skip
    lines.append("")
    if report.get("again"):
        lines.append("timed again: the histories an earlier run grew in this folder (--again)")
    for h in report["histories"]:
        copied = f", copied in {h['copy_s']} s" if "copy_s" in h else ""
        lines.append(
            f"{label(h['workflows'])}: {h['task_runs_per_workflow']} task runs, "
            f"{h['events_per_workflow']} events, {h['handoffs_per_workflow']} hand-offs a "
            f"workflow; {h['statuses']}; grown in {h['grow_s']} s{copied}"
        )
    for t in report["dashboard_tab"]:
        lines.append(
            f"{label(t['workflows'])}: one overview tab costs the API and Postgres "
            f"{t['tab_cores']:.3f} cores (idle {t['idle_cores']:.3f})"
        )
    if (pruned := report.get("prune")) is not None:
        calm, busy = pruned["new_run_before"], pruned["new_run_during"]
        lines.append(
            f"pruning {pruned['pruned']:,} runs (archived first) took {pruned['seconds']} s "
            f"({pruned['runs_per_s']} runs/s); a new run meanwhile: p50 {busy['p50_ms']} ms, "
            f"p95 {busy['p95_ms']} ms, max {busy['max_ms']} ms (n={busy['n']}), against p50 "
            f"{calm['p50_ms']}, p95 {calm['p95_ms']}, max {calm['max_ms']} ms before "
            f"(n={calm['n']})"
        )
        met = "met" if pruned["delay_p95_ms"] <= pruned["delay_goal_ms"] else "not met"
        lines.append(
            f"a running workflow delayed by pruning: p50 {pruned['delay_p50_ms']} ms, p95 "
            f"{pruned['delay_p95_ms']} ms, max {pruned['delay_max_ms']} ms (goal: p95 <= "
            f"{pruned['delay_goal_ms']:g} ms, {met})"
        )
    for check in report.get("index_check", []):
        scans = ", ".join(check["seq_scans"]) or "none"
        lines.append(f"plan of '{check['call']}': {check['statements']} statements, slowest "
                     f"{check['slowest_statement_ms']} ms, whole-table scans: {scans}")  # fmt: skip
    machine = report["machine"]
    lines.append(f"machine: {machine['cpus']} cores, load {machine['loadavg'][0]} before, "
                 f"{machine['loadavg_after'][0]} after")  # fmt: skip
    for plan in report["plans"]:
        lines.append(f"\n--- plans of '{plan['call']}' at {label(plan['workflows'])} ---")
        for statement in plan["statements"]:
            lines.append(f"[{statement['duration_ms']:.1f} ms]\n{statement['plan']}")
    return "\n".join(lines)
