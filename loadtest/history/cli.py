"""``cdiflow bench history``: the cost of every call as the history grows (see the package)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import click
import httpx
import psutil
from sqlalchemy.engine import make_url

from loadtest.cli import one_run_per_folder, terminated_by_signal
from loadtest.history.calls import (
    OVERVIEW_POLL_S,
    Call,
    Probe,
    calls,
    median,
    overview_poll,
    time_call,
)
from loadtest.history.grow import HOOK, SPREAD_DAYS, History, connect, run_templates
from loadtest.history.plans import PlanCapture, preload_auto_explain
from loadtest.runner import machine_state
from loadtest.systems.services import BenchServices, s3_client
from orchestrator.child_process import free_port
from orchestrator.db.repository.paging import Cursor
from orchestrator.stack import Stack

__all__ = ["bench_history_command", "measure_history", "parse_sizes"]

_SIZE: Final = re.compile(r"^(\d+(?:\.\d+)?)([kKmM]?)$")
_SLOWEST: Final = 3  # calls whose plans are shown, at the largest size
# The tables that grow with the history: a call that scans one whole costs the history.
_GROWING: Final = re.compile(
    r"Seq Scan on (workflows|task_runs|events|handoffs|webhook_deliveries)\b"
)


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


# The stack's retention while the history is grown and timed: nothing pruned (the clones reach
# back --days), passes every 5 s, pruned runs archived; ``measure_pruning`` then lets each
# definition keep one day.
_STACK_ENV: Final = {
    "CDIFLOW_RETENTION_DAYS": "0",
    "CDIFLOW_RETENTION_INTERVAL_S": "5",
    "CDIFLOW_ARCHIVE_URI": "s3://cdiflow/bench-history-archive/",
}
_PRUNE_GAP_S: Final = 0.25  # between two new runs while pruning
_STALLED_S: Final = 120.0  # pruning that has removed nothing for so long is over
_CALM_RUNS: Final = 200  # new runs timed before pruning starts


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50_ms": round(median(ordered), 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "max_ms": round(ordered[-1], 2),
    }


def measure_pruning(
    http: httpx.Client, history: History, new_run: Callable[[], None], samples: int
) -> dict[str, Any]:
    """Let every definition keep its runs one day, and time new runs, one after another,
    while the API's housekeeping prunes (and archives) the rest; against new runs timed just
    before."""

    def timed() -> float:
        began = time.perf_counter()
        new_run()
        return (time.perf_counter() - began) * 1000.0

    def on_record() -> int:
        return int(http.get("/api/retention").raise_for_status().json()["runs_on_record"])

    before = []
    for _ in range(samples):
        before.append(timed())
        time.sleep(_PRUNE_GAP_S)
    with history.cursor() as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE finished_at < now() - interval '1 day') FROM workflows"
        ).fetchone()
    due = int(row[0]) if row else 0
    start = on_record()
    for definition in http.get("/api/workflow-definitions").raise_for_status().json():
        http.put(f"/api/workflow-definitions/{definition['name']}/retention",
                 json={"days": 1}).raise_for_status()  # fmt: skip
    began, during, left = time.monotonic(), [], start
    moved = began
    while left > start - due and time.monotonic() - moved < _STALLED_S:
        during.append(timed())
        time.sleep(_PRUNE_GAP_S)
        if len(during) % 20 == 0:
            now_left = on_record() - len(during)  # the new runs are kept
            if now_left < left:
                left, moved = now_left, time.monotonic()
    took = time.monotonic() - began
    shown = http.get("/api/retention").raise_for_status().json()
    calm, busy = _spread(before), _spread(during)
    return {
        "pruned": start + len(during) - on_record(),
        "archived_total": shown["archived_total"],
        "seconds": round(took, 1),
        "runs_per_s": round(due / took, 1) if took else None,
        "new_run_before": calm,
        "new_run_during": busy,
        "delay_p50_ms": round(busy["p50_ms"] - calm["p50_ms"], 2),
        "delay_p95_ms": round(busy["p95_ms"] - calm["p95_ms"], 2),
        "last_pass": shown["last_pass"],
    }


def _probe(http: httpx.Client, history: History) -> Probe:
    """A run half-way down the newest-first list, and the cursor of the page after it: where
    a user who paged that far would be (found once here with an OFFSET, which the API no
    longer needs); the same half-way point in the webhook's log; when the history begins."""
    first = http.get("/api/workflows", params={"limit": 1}).raise_for_status().json()
    total = int(first["total"])
    with history.cursor() as conn:
        row = conn.execute(
            "SELECT id, created_at FROM workflows ORDER BY created_at DESC, id DESC "
            "OFFSET %(n)s LIMIT 1",
            {"n": total // 2},
        ).fetchone()
        hook = conn.execute(
            "WITH log AS (SELECT d.id FROM webhook_deliveries d "
            "JOIN webhooks h ON h.id = d.webhook_id WHERE h.name = %(h)s) "
            "SELECT id FROM log ORDER BY id DESC "
            "OFFSET (SELECT count(*) / 2 FROM log) LIMIT 1",
            {"h": HOOK},
        ).fetchone()
        oldest = conn.execute("SELECT min(created_at) FROM workflows").fetchone()
    assert row is not None and oldest is not None
    deep = http.get(f"/api/workflows/{row[0]}", params={"events": 0}).raise_for_status().json()
    return Probe(
        total=total,
        deep_run=deep,
        deep_cursor=Cursor(row[1], row[0]).encode(),
        deep_delivery=None if hook is None else int(hook[0]),  # None: no clones, no log
        oldest=oldest[0],
    )


def measure_history(
    data_dir: Path,
    sizes: tuple[int, ...],
    *,
    repeat: int = 5,
    templates: int = 250,
    tab_seconds: float = 20.0,
    spread_days: int = SPREAD_DAYS,
    prune: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Start a stack, run ``templates`` real workflows, grow to each size in turn and time
    every call there; then (``prune``) prune all but the last day's runs while new runs are
    timed."""

    def say(text: str) -> None:
        if progress:
            click.echo(text, err=True)

    folder = data_dir.absolute()
    before = machine_state()
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {"results": results, "sizes": list(sizes), "repeat": repeat,
                              "spread_days": spread_days, "histories": [], "dashboard_tab": [],
                              "plans": [], "index_check": []}  # fmt: skip
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
            saved = {k: os.environ.get(k) for k in _STACK_ENV}
            os.environ.update(_STACK_ENV)  # the stack's processes inherit them
            with (
                _restored(saved),
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
                history = History(services.database_url, ids, spread_days=spread_days)
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
                        say("  reading the plan of every call ...")
                        report["index_check"] = check_indexes(capture, api_pid, made)
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
                if prune:
                    say("pruning all but the last day's runs while new runs are timed ...")
                    report["prune"] = measure_pruning(http, history, new_run, _CALM_RUNS)
                history.close()
    report["machine"] = {**before, "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    return report


def check_indexes(capture: PlanCapture, api_pid: int, made: list[Call]) -> list[dict[str, Any]]:
    """Of every call the API serves: how many statements it ran, and the growing tables any
    of them read whole (a sequential scan), from the plans Postgres ran."""
    checked = []
    for call in made:
        if call.name.startswith(("new", "scheduler")):
            continue
        if call.before is not None:
            call.before()
        found = capture.plans(api_pid, call.make, keep=1000)
        scans = sorted({m[1] for p in found for m in _GROWING.finditer(p.text)})
        slowest = max((p.duration_ms for p in found), default=0.0)
        checked.append({"call": call.name, "statements": len(found), "seq_scans": scans,
                        "slowest_statement_ms": round(slowest, 2)})  # fmt: skip
    return checked


@contextlib.contextmanager
def _restored(saved: dict[str, str | None]) -> Iterator[None]:
    """Put the environment variables back as they were."""
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def history_table(report: dict[str, Any]) -> str:
    """Calls by history size (median ms), the last column the largest size's time over the
    smallest's; then the history's make-up, one dashboard tab's cost and the slowest plans."""
    sizes = [h["workflows"] for h in report["histories"]]
    by_call: dict[str, dict[int, float]] = {}
    for row in report["results"]:
        by_call.setdefault(row["call"], {})[row["workflows"]] = row["p50_ms"]
    width = max(len(c) for c in by_call) + 2
    head = f"{'call (median ms)':<{width}}" + "".join(f"{_label(s):>11}" for s in sizes)
    lines = [head + (f"{'ratio':>10}" if len(sizes) > 1 else "")]
    for call, times in by_call.items():
        cells = "".join(f"{times.get(s, float('nan')):>11.1f}" for s in sizes)
        ratio = ""
        if len(sizes) > 1 and times.get(sizes[0]):
            ratio = f"{times[sizes[-1]] / times[sizes[0]]:>9.2f}x"
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
    if (pruned := report.get("prune")) is not None:
        calm, busy = pruned["new_run_before"], pruned["new_run_during"]
        lines.append(
            f"pruning {pruned['pruned']:,} runs (archived first) took {pruned['seconds']} s "
            f"({pruned['runs_per_s']} runs/s); a new run meanwhile: p50 {busy['p50_ms']} ms, "
            f"p95 {busy['p95_ms']} ms, max {busy['max_ms']} ms (n={busy['n']}), against p50 "
            f"{calm['p50_ms']}, p95 {calm['p95_ms']}, max {calm['max_ms']} ms before "
            f"(n={calm['n']})"
        )
    for check in report.get("index_check", []):
        scans = ", ".join(check["seq_scans"]) or "none"
        lines.append(f"plan of '{check['call']}': {check['statements']} statements, slowest "
                     f"{check['slowest_statement_ms']} ms, whole-table scans: {scans}")  # fmt: skip
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
@click.option("--days", "spread_days", default=SPREAD_DAYS, show_default=True,
              type=click.IntRange(1, 3650),
              help="Days the history spreads over, back from now.")  # fmt: skip
@click.option("--tab-seconds", default=20.0, show_default=True, type=click.FloatRange(5, 600),
              help="Seconds one dashboard tab is measured (and idle, to subtract).")  # fmt: skip
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".data/bench-history"),
    show_default=True,
    help="Folder for the services and the history (removed at the end unless --keep).",
)
@click.option("--prune/--no-prune", default=True, show_default=True,
              help="At the end, prune all but the last day's runs, timing new runs.")  # fmt: skip
@click.option("--keep", is_flag=True, help="Keep the data folder (its Postgres holds the history).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_history_command(
    sizes: str,
    repeat: int,
    templates: int,
    tab_seconds: float,
    spread_days: int,
    data_dir: Path,
    prune: bool,
    keep: bool,
    as_json: bool,
) -> None:
    """Every API call, the scrape, the scheduler's tick and a new run, timed as the history of
    runs grows to each size (cloned from real runs, spread over --days, a year by default);
    at the largest, the plan of every call (whole-table scans named)."""
    wanted = parse_sizes(sizes)
    signal.signal(signal.SIGTERM, terminated_by_signal)  # unwind: stop what was started
    try:
        with one_run_per_folder(data_dir):
            report = measure_history(
                data_dir, wanted, repeat=repeat, templates=templates, tab_seconds=tab_seconds,
                spread_days=spread_days, prune=prune,
            )  # fmt: skip
    finally:
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    click.echo(json.dumps(report, indent=1) if as_json else history_table(report))
