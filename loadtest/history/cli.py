"""``cdiflow bench history``: the cost of every call as the history grows (see the package)."""

from __future__ import annotations

import contextlib
import dataclasses
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
import psycopg
from sqlalchemy.engine import make_url

from loadtest.cli import one_run_per_folder, terminated_by_signal
from loadtest.history.calls import OVERVIEW_POLL_S, Call, Probe, calls, median, overview_poll
from loadtest.history.grow import HOOK, SPREAD_DAYS, History, connect, run_templates
from loadtest.history.plans import PlanCapture, preload_auto_explain
from loadtest.history.report import PRUNE_DELAY_GOAL_MS, history_table, label
from loadtest.history.sides import Side, grow_sizes, open_sides, time_sides
from loadtest.runner import machine_state
from loadtest.systems.services import BenchServices, s3_client
from orchestrator.child_process import free_port
from orchestrator.db.repository.paging import Cursor
from orchestrator.services import RunningServices
from orchestrator.stack import Stack

__all__ = ["KEPT", "bench_history_command", "measure_history", "parse_sizes", "read_kept"]

_SIZE: Final = re.compile(r"^(\d+(?:\.\d+)?)([kKmM]?)$")
_SLOWEST: Final = 3  # calls whose plans are shown, at the largest size
KEPT: Final = "history.json"  # in the data folder: the sizes grown and their databases
# The tables that grow with the history: a call that scans one whole costs the history.
_GROWING: Final = re.compile(
    r"Seq Scan on (workflows|workflow_tags|task_runs|events|handoffs|webhook_deliveries)\b"
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
    http: httpx.Client, reader: psycopg.Connection[Any], new_run: Callable[[], None], samples: int
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
    row = reader.execute(
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
        # A running workflow's delay: a new run's time, start to finish, while pruning over
        # its time just before (the goal: PRUNE_DELAY_GOAL_MS, judged at p95).
        "delay_p50_ms": round(busy["p50_ms"] - calm["p50_ms"], 2),
        "delay_p95_ms": round(busy["p95_ms"] - calm["p95_ms"], 2),
        "delay_max_ms": round(busy["max_ms"] - calm["max_ms"], 2),
        "delay_goal_ms": PRUNE_DELAY_GOAL_MS,
        "last_pass": shown["last_pass"],
    }


def _probe(http: httpx.Client, reader: psycopg.Connection[Any]) -> Probe:
    """A run half-way down the newest-first list, and the cursor of the page after it: where
    a user who paged that far would be (found once here with an OFFSET, which the API no
    longer needs); the same half-way point in the webhook's log; when the history begins."""
    first = http.get("/api/workflows", params={"limit": 1}).raise_for_status().json()
    total = int(first["total"])
    row = reader.execute(
        "SELECT id, created_at FROM workflows ORDER BY created_at DESC, id DESC "
        "OFFSET %(n)s LIMIT 1",
        {"n": total // 2},
    ).fetchone()
    hook = reader.execute(
        "WITH log AS (SELECT d.id FROM webhook_deliveries d "
        "JOIN webhooks h ON h.id = d.webhook_id WHERE h.name = %(h)s) "
        "SELECT id FROM log ORDER BY id DESC "
        "OFFSET (SELECT count(*) / 2 FROM log) LIMIT 1",
        {"h": HOOK},
    ).fetchone()
    oldest = reader.execute("SELECT min(created_at) FROM workflows").fetchone()
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
    plans: bool = True,
    progress: bool = True,
    services: RunningServices | None = None,
    redis_db: int = 1,
    again: bool = False,
) -> dict[str, Any]:
    """Run ``templates`` real workflows on a stack, grow their clones to each size in turn
    (a copy of the database at each but the largest: ``grow_sizes``), start a stack on each
    size and time every call in rounds across the sizes (``time_sides``); then one dashboard
    tab at each size, at the largest the plans (``plans``) and, the other stacks stopped,
    (``prune``) pruning all but the last day's runs while new runs are timed. ``services``:
    running ones to use (the stacks' Redis databases from ``redis_db`` up). What was grown is
    written to ``KEPT`` in ``data_dir``; ``again``: time the histories it names instead of
    growing (``sizes``, ``templates`` and ``spread_days`` are then those it says)."""

    def say(text: str) -> None:
        if progress:
            click.echo(text, err=True)

    folder = data_dir.absolute()
    kept_before = read_kept(folder) if again else None
    if kept_before is not None:
        sizes, spread_days = tuple(kept_before["sizes"]), kept_before["spread_days"]
    before = machine_state()
    report: dict[str, Any] = {"results": [], "sizes": list(sizes), "repeat": repeat,
                              "spread_days": spread_days, "histories": [], "dashboard_tab": [],
                              "plans": [], "index_check": []}  # fmt: skip
    saved = {k: os.environ.get(k) for k in _STACK_ENV}
    os.environ.update(_STACK_ENV)  # the stacks' processes inherit them
    with (
        _restored(saved),
        BenchServices(folder / "services", given=services, first_redis_db=redis_db) as shared,
    ):
        running = shared.running
        assert running.admin_database_url is not None
        if kept_before is None:
            main = shared.for_system("history")
        else:  # the kept history's own database, a Redis database of this run
            main = dataclasses.replace(
                running, database_url=_on(running, kept_before["databases"][-1]),
                redis_url=shared.redis_url(), s3_endpoint_url=shared.s3_url, embedded=(),
            )  # fmt: skip
        database = make_url(main.database_url).database or ""
        with connect(running.admin_database_url, autocommit=True) as admin:
            if kept_before is None:
                preload_auto_explain(admin, database)
                report["templates_s"] = _run_templates(folder, main, templates, report, say)
                history = History(main.database_url, report.pop("_ids"),
                                  spread_days=spread_days)  # fmt: skip
                urls = grow_sizes(history, sizes, admin, report["histories"], say)
                _write_kept(folder, sizes, spread_days, urls, report["histories"])
            else:
                say(f"timing the kept histories of {folder / KEPT} again ...")
                urls = [_on(running, name) for name in kept_before["databases"]]
                report["histories"] = kept_before["histories"]
                report["again"] = True
            postgres = [s.pid for s in running.embedded if s.name == "postgres" and s.pid]
            say("starting a stack on each size ...")
            grown = report["histories"]
            on_copy = [dataclasses.replace(main, database_url=url, redis_url=shared.redis_url())
                       for url in urls[:-1]]  # fmt: skip
            with contextlib.ExitStack() as kept, ThreadPoolExecutor(4) as pool:
                with contextlib.ExitStack() as others:
                    sides = open_sides([
                        *((others, folder / f"stack-{label(h['workflows'])}", on, h["workflows"])
                          for on, h in zip(on_copy, grown, strict=False)),
                        (kept, folder / "stack", main, grown[-1]["workflows"]),
                    ])  # fmt: skip
                    largest = sides[-1]
                    for side, entry in zip(sides, grown, strict=True):
                        probe = _probe(side.http, side.reader)
                        entry["api_total"] = probe.total
                        side.made = calls(side.http, pool, probe, side.scheduler, side.new_run)
                    say("timing every call at each size in turn ...")
                    report["results"] = time_sides(sides, repeat)
                    for side in sides:
                        tab = tab_cost(side.http, pool, [side.api_pid, *postgres], tab_seconds)
                        report["dashboard_tab"].append({"workflows": side.workflows, **tab})
                    if plans:
                        say("reading the plan of every call at the largest size ...")
                        port = make_url(main.database_url).port or 5432
                        log_file = running.data_dir / "logs" / "postgres.log"
                        _read_plans(report, PlanCapture(admin, log_file, database, port), largest)
                if prune:
                    say("pruning all but the last day's runs while new runs are timed ...")
                    report["prune"] = measure_pruning(
                        largest.http, largest.reader, largest.new_run, _CALM_RUNS
                    )
    report["machine"] = {**before, "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    return report


def _run_templates(folder: Path, main: RunningServices, templates: int,
                   report: dict[str, Any], say: Callable[[str], None]) -> float:  # fmt: skip
    """Run the real workflows the history is cloned from (their ids in ``report["_ids"]``);
    how long it took, in seconds."""
    say(f"running {templates} real workflows ...")
    began = time.monotonic()
    with (
        Stack(folder / "stack", workers=2, port=free_port(), services=main) as stack,
        httpx.Client(base_url=stack.api_url, headers=stack.auth_headers, timeout=120) as http,
    ):
        report["_ids"] = run_templates(http, s3_client(main), main.s3_bucket, templates)
    return round(time.monotonic() - began, 1)


def _on(running: RunningServices, database: str) -> str:
    """The URL of ``database`` on the run's Postgres, as the stacks' user."""
    return (
        make_url(running.database_url).set(database=database).render_as_string(hide_password=False)
    )


def _write_kept(folder: Path, sizes: tuple[int, ...], spread_days: int, urls: list[str],
                histories: list[dict[str, Any]]) -> None:  # fmt: skip
    """What was grown, for a later ``again``: database names only (no credentials)."""
    kept = {
        "sizes": list(sizes),
        "spread_days": spread_days,
        "databases": [make_url(url).database for url in urls],
        "histories": histories,
    }
    (folder / KEPT).write_text(json.dumps(kept, indent=1))


def read_kept(folder: Path) -> dict[str, Any]:
    """The histories a run grew in ``folder`` (``KEPT``); ``click.UsageError`` if none."""
    try:
        kept = json.loads((folder / KEPT).read_text())
    except FileNotFoundError:
        raise click.UsageError(
            f"{folder} holds no history to time again (no {KEPT}): grow one first with "
            "--keep and the same --data-dir"
        ) from None
    except ValueError as exc:
        raise click.UsageError(f"{folder / KEPT} is not JSON ({exc})") from None
    fields = {"sizes": list, "spread_days": int, "databases": list, "histories": list}
    if (
        not isinstance(kept, dict)
        or any(not isinstance(kept.get(name), kind) for name, kind in fields.items())
        or not len(kept["databases"]) == len(kept["sizes"]) == len(kept["histories"])
    ):
        raise click.UsageError(f"{folder / KEPT} does not say which databases hold which size")
    return kept


def _read_plans(report: dict[str, Any], capture: PlanCapture, side: Side) -> None:
    """At ``side``: every call's plans checked for whole-table scans, and the plans of the
    slowest calls."""
    p50 = {r["call"]: r["p50_ms"] for r in report["results"] if r["workflows"] == side.workflows}
    report["index_check"] = check_indexes(capture, side.api_pid, side.made)
    slowest = sorted(
        (c for c in side.made if not c.name.startswith(("new", "scheduler"))),
        key=lambda c: -p50[c.name],
    )[:_SLOWEST]
    for call in slowest:
        found = capture.plans(side.api_pid, call.make)
        report["plans"].append({
            "call": call.name, "workflows": side.workflows,
            "statements": [{"duration_ms": p.duration_ms, "plan": p.text} for p in found],
        })  # fmt: skip


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


@click.command("history")
@click.option("--sizes", default="10k,1M", show_default=True,
              help="History sizes in workflows, ascending: 10k, 250000, 1M.")  # fmt: skip
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(1, 100),
              help="Rounds per call, each timing it at every size in turn (medians "
                   "reported, and each size's ratio to the smallest per round).")  # fmt: skip
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
@click.option("--again", is_flag=True,
              help="Time the histories a run with --keep grew in --data-dir again, "
                   "without growing or pruning them (the folder is kept).")  # fmt: skip
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
    again: bool,
    as_json: bool,
) -> None:
    """Every API call, the scrape, the scheduler's tick and a new run, timed at each history
    size (cloned from real runs, spread over --days, a year by default; a stack on each size,
    the sizes timed in turn, a call at one size seconds after the other); at the largest,
    the plan of every call (whole-table scans named)."""
    wanted = parse_sizes(sizes)
    if again:
        wanted = tuple(read_kept(data_dir.absolute())["sizes"])  # (a clear error if none)
    elif templates >= wanted[0]:
        raise click.BadParameter(f"the smallest size must exceed the {templates} templates",
                                 param_hint="--sizes")  # fmt: skip
    signal.signal(signal.SIGTERM, terminated_by_signal)  # unwind: stop what was started
    try:
        with one_run_per_folder(data_dir):
            report = measure_history(
                data_dir, wanted, repeat=repeat, templates=templates, tab_seconds=tab_seconds,
                spread_days=spread_days, prune=prune and not again, again=again,
            )  # fmt: skip
    finally:
        if not (keep or again):
            shutil.rmtree(data_dir, ignore_errors=True)
    click.echo(json.dumps(report, indent=1) if as_json else history_table(report))
