"""``cdiflow bench history``: the cost of every call as the history grows (see the package)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import click
import httpx
import psutil
from sqlalchemy.engine import make_url

from loadtest.cli import one_run_per_folder, terminated_by_signal
from loadtest.history.calls import OVERVIEW_POLL_S, Probe, calls, median, overview_poll, time_call
from loadtest.history.grow import History, connect, run_templates
from loadtest.history.plans import PlanCapture, preload_auto_explain
from loadtest.runner import machine_state
from loadtest.systems.services import BenchServices, s3_client
from orchestrator.child_process import free_port
from orchestrator.stack import Stack

__all__ = ["bench_history_command", "measure_history", "parse_sizes"]

_SIZE: Final = re.compile(r"^(\d+(?:\.\d+)?)([kKmM]?)$")
_SLOWEST: Final = 3  # calls whose plans are shown, at the largest size


def parse_sizes(text: str) -> tuple[int, ...]:
    """``10k,1M`` -> (10000, 1000000), ascending."""
    sizes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        match = _SIZE.match(part)
        if match is None:
            raise click.BadParameter(f"{part!r}: write sizes such as 10k, 250000 or 1M")
        scale = {"": 1, "k": 1_000, "m": 1_000_000}[match[2].lower()]
        sizes.append(round(float(match[1]) * scale))
    if not sizes or min(sizes) < 1000:
        raise click.BadParameter("give at least one size, each 1k or more")
    return tuple(sorted(set(sizes)))


def _label(size: int) -> str:
    for unit, scale in (("M", 1_000_000), ("k", 1_000)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds of these processes and their children so far."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


def tab_cost(http: httpx.Client, pool: ThreadPoolExecutor, pids: list[int], seconds: float
             ) -> dict[str, float]:  # fmt: skip
    """Cores the API and Postgres use while one dashboard tab shows the overview (its poll
    every 2.5 s, readiness every 5 s), less what they use idle for as long."""
    before = _cpu_s(pids)
    time.sleep(seconds)
    idle = _cpu_s(pids) - before
    before, began, polls = _cpu_s(pids), time.monotonic(), 0
    while time.monotonic() - began < seconds:
        overview_poll(http, pool)
        if polls % 2 == 0:
            http.get("/api/readyz")
        polls += 1
        time.sleep(max(0.0, began + polls * OVERVIEW_POLL_S - time.monotonic()))
    busy = _cpu_s(pids) - before
    return {"idle_cores": round(idle / seconds, 4), "tab_cores": round((busy - idle) / seconds, 4)}


def _probe(http: httpx.Client, history: History) -> Probe:
    first = http.get("/api/workflows", params={"limit": 1}).raise_for_status().json()
    total = int(first["total"])
    page = http.get("/api/workflows", params={"limit": 1, "offset": total // 2})
    return Probe(total=total, deep_run=page.raise_for_status().json()["items"][0],
                 deep_cursor=None)  # fmt: skip


def measure_history(
    data_dir: Path,
    sizes: tuple[int, ...],
    *,
    repeat: int = 5,
    templates: int = 250,
    tab_seconds: float = 20.0,
    progress: bool = True,
) -> dict[str, Any]:
    """Start a stack, run ``templates`` real workflows, grow to each size in turn and time
    every call there."""

    def say(text: str) -> None:
        if progress:
            click.echo(text, err=True)

    folder = data_dir.absolute()
    before = machine_state()
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {"results": results, "sizes": list(sizes), "repeat": repeat,
                              "histories": [], "dashboard_tab": [], "plans": []}  # fmt: skip
    with BenchServices(folder / "services") as shared:
        services = shared.for_system("history")
        running = shared.running
        assert running.admin_database_url is not None
        database = make_url(services.database_url).database or ""
        pg_port = make_url(services.database_url).port or 5432
        log_file = running.data_dir / "logs" / "postgres.log"
        with connect(running.admin_database_url, autocommit=True) as admin:
            preload_auto_explain(admin, database)
            stack = Stack(folder / "stack", workers=2, port=free_port(), services=services)
            with (
                stack,
                ThreadPoolExecutor(4) as pool,
                httpx.Client(
                    base_url=stack.api_url, headers=stack.auth_headers, timeout=120
                ) as http,
                connect(services.database_url) as scheduler,
            ):
                say(f"running {templates} real workflows ...")
                began = time.monotonic()
                ids = run_templates(http, s3_client(running), running.s3_bucket, templates)
                report["templates_s"] = round(time.monotonic() - began, 1)
                history = History(services.database_url, ids)
                api_pid = stack.pid_of("api")
                assert api_pid is not None
                postgres = [s.pid for s in running.embedded if s.name == "postgres" and s.pid]
                capture = PlanCapture(admin, log_file, database, pg_port)

                def new_run() -> None:
                    body = {"workflow": "noop_pipeline", "input": {}, "policy": "affinity"}
                    reply = http.post("/api/workflows", params={"wait_s": 30}, json=body)
                    run = reply.raise_for_status().json()
                    if run["status"] != "COMPLETED":
                        raise RuntimeError(f"the new run ended {run['status']}: {run['error']}")

                for size in sizes:
                    say(f"growing the history to {_label(size)} workflows ...")
                    grown = history.grow_to(size)
                    kept = history.proportions()
                    report["histories"].append({**kept.as_dict(), "grow_s": round(grown, 1)})
                    say(f"  {kept.as_dict()} in {grown:.0f} s; timing ...")
                    probe = _probe(http, history)
                    made = calls(http, pool, probe, scheduler, new_run)
                    timed: dict[str, float] = {}
                    for call in made:
                        took = time_call(call, repeat * (3 if call.name.startswith("new") else 1))
                        timed[call.name] = median(took)
                        results.append({"call": call.name, "workflows": kept.workflows,
                                        "p50_ms": round(timed[call.name], 2)})  # fmt: skip
                    tab = tab_cost(http, pool, [api_pid, *postgres], tab_seconds)
                    report["dashboard_tab"].append({"workflows": kept.workflows, **tab})
                    if size == sizes[-1]:
                        slowest = sorted(
                            (c for c in made if not c.name.startswith(("new", "scheduler"))),
                            key=lambda c: -timed[c.name],
                        )[:_SLOWEST]
                        for call in slowest:
                            found = capture.plans(api_pid, call.make)
                            report["plans"].append({
                                "call": call.name, "workflows": kept.workflows,
                                "statements": [{"duration_ms": p.duration_ms, "plan": p.text}
                                               for p in found],
                            })  # fmt: skip
                history.close()
    report["machine"] = {**before, "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    return report


def history_table(report: dict[str, Any]) -> str:
    """Calls by history size (median ms), the last column the largest size's time over the
    smallest's; then the history's make-up, one dashboard tab's cost and the slowest plans."""
    sizes = [h["workflows"] for h in report["histories"]]
    by_call: dict[str, dict[int, float]] = {}
    for row in report["results"]:
        by_call.setdefault(row["call"], {})[row["workflows"]] = row["p50_ms"]
    width = max(len(c) for c in by_call) + 2
    head = f"{'call (median ms)':<{width}}" + "".join(f"{_label(s):>10}" for s in sizes)
    lines = [head + (f"{'ratio':>8}" if len(sizes) > 1 else "")]
    for call, times in by_call.items():
        cells = "".join(f"{times.get(s, float('nan')):>10.1f}" for s in sizes)
        ratio = ""
        if len(sizes) > 1 and times.get(sizes[0]):
            ratio = f"{times[sizes[-1]] / times[sizes[0]]:>7.2f}x"
        lines.append(f"{call:<{width}}{cells}{ratio}")
    lines.append("")
    for h in report["histories"]:
        lines.append(
            f"{_label(h['workflows'])}: {h['task_runs_per_workflow']} task runs, "
            f"{h['events_per_workflow']} events, {h['handoffs_per_workflow']} hand-offs a "
            f"workflow; {h['statuses']}; grown in {h['grow_s']} s"
        )
    for t in report["dashboard_tab"]:
        lines.append(
            f"{_label(t['workflows'])}: one overview tab costs the API and Postgres "
            f"{t['tab_cores']:.3f} cores (idle {t['idle_cores']:.3f})"
        )
    machine = report["machine"]
    lines.append(f"machine: {machine['cpus']} cores, load {machine['loadavg'][0]} before, "
                 f"{machine['loadavg_after'][0]} after")  # fmt: skip
    for plan in report["plans"]:
        lines.append(f"\n--- plans of '{plan['call']}' at {_label(plan['workflows'])} ---")
        for statement in plan["statements"]:
            lines.append(f"[{statement['duration_ms']:.1f} ms]\n{statement['plan']}")
    return "\n".join(lines)


@click.command("history")
@click.option("--sizes", default="10k,1M", show_default=True,
              help="History sizes in workflows, ascending: 10k, 250000, 1M.")  # fmt: skip
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(1, 100),
              help="Timings per call and size (the median is reported).")  # fmt: skip
@click.option("--templates", default=250, show_default=True, type=click.IntRange(50, 5000),
              help="Real workflows run first; the history is made of their clones.")  # fmt: skip
@click.option("--tab-seconds", default=20.0, show_default=True, type=click.FloatRange(5, 600),
              help="Seconds one dashboard tab is measured (and idle, to subtract).")  # fmt: skip
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".data/bench-history"),
    show_default=True,
    help="Folder for the services and the history (removed at the end unless --keep).",
)
@click.option("--keep", is_flag=True, help="Keep the data folder (its Postgres holds the history).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_history_command(
    sizes: str,
    repeat: int,
    templates: int,
    tab_seconds: float,
    data_dir: Path,
    keep: bool,
    as_json: bool,
) -> None:
    """Every API call, the scrape, the scheduler's tick and a new run, timed as the history of
    runs grows to each size (cloned from real runs, spread over 30 days)."""
    wanted = parse_sizes(sizes)
    signal.signal(signal.SIGTERM, terminated_by_signal)  # unwind: stop what was started
    try:
        with one_run_per_folder(data_dir):
            report = measure_history(
                data_dir, wanted, repeat=repeat, templates=templates, tab_seconds=tab_seconds
            )
    finally:
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    click.echo(json.dumps(report, indent=1) if as_json else history_table(report))
