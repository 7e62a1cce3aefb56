"""Every history size served at once, so that the sizes are timed side by side.

The history grows to the smallest size first and its database is copied
(``CREATE DATABASE … TEMPLATE``: the same rows, pages and statistics), then grows to the next
size and is copied again; the largest stays in the database the template runs were made in.
Each size then gets a stack of its own (API, scheduler, two workers, its own Redis database),
all started alike, and every call is timed in rounds, a round making it at every size one
after another: a ratio compares times taken seconds apart, which the load of a shared machine
moves alike.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from loadtest.history.calls import Call, median, time_rounds
from loadtest.history.grow import History, connect
from loadtest.history.plans import preload_auto_explain
from loadtest.history.report import label
from orchestrator.child_process import free_port
from orchestrator.services import RunningServices
from orchestrator.stack import Stack

__all__ = ["Side", "copy_database", "grow_sizes", "open_sides", "time_sides"]


def copy_database(admin: psycopg.Connection[Any], database_url: str, suffix: str) -> str:
    """A copy of ``database_url``'s database, its name ending in ``suffix``; its URL.
    Postgres refuses while a session is open on the source. The copy loads ``auto_explain``
    as the source does (a database's own settings are not copied)."""
    url = make_url(database_url)
    source, name = url.database or "", f"{url.database}_{suffix.lower()}"
    admin.execute(
        sql.SQL("CREATE DATABASE {} TEMPLATE {} OWNER {}").format(
            sql.Identifier(name), sql.Identifier(source), sql.Identifier(url.username or "")
        )
    )
    preload_auto_explain(admin, name)
    return url.set(database=name).render_as_string(hide_password=False)


def grow_sizes(
    history: History,
    sizes: Sequence[int],
    admin: psycopg.Connection[Any],
    histories: list[dict[str, Any]],
    say: Callable[[str], None],
) -> list[str]:
    """Grow ``history`` to each size in turn, its database copied at each but the largest;
    each size's database URL. What each holds is appended to ``histories``. Closes
    ``history``."""
    urls = []
    try:
        for size in sizes:
            say(f"growing the history to {label(size)} workflows ...")
            grown = history.grow_to(size)
            entry = {**history.proportions().as_dict(), "grow_s": round(grown, 1)}
            url = history.url
            if size != sizes[-1]:
                began = time.monotonic()
                with history.disconnected():
                    url = copy_database(admin, history.url, label(size))
                entry["copy_s"] = round(time.monotonic() - began, 1)
            say(f"  {entry}")
            histories.append(entry)
            urls.append(url)
    finally:
        history.close()
    return urls


@dataclass
class Side:
    """One history size as the benchmark reaches it: its stack's API, a connection the
    scheduler's tick is made on, and one (autocommit) for the benchmark's own reads."""

    workflows: int
    stack: Stack
    http: httpx.Client
    scheduler: psycopg.Connection[Any]
    reader: psycopg.Connection[Any]
    made: list[Call] = field(default_factory=list)  # the calls, once the history is probed

    @property
    def api_pid(self) -> int:
        pid = self.stack.pid_of("api")
        assert pid is not None
        return pid

    def new_run(self) -> None:
        body = {"workflow": "noop_pipeline", "input": {}, "policy": "affinity"}
        reply = self.http.post("/api/workflows", params={"wait_s": 30}, json=body)
        run = reply.raise_for_status().json()
        if run["status"] != "COMPLETED":
            raise RuntimeError(f"the new run ended {run['status']}: {run['error']}")


def open_sides(specs: Sequence[tuple[contextlib.ExitStack, Path, RunningServices, int]]
               ) -> list[Side]:  # fmt: skip
    """A stack per (``held``, folder, services, workflows in its database), started at once
    (each start waits mostly on its processes), each stopped by its ``held``."""
    stacks = []
    for held, folder, services, _ in specs:
        stack = Stack(folder, workers=2, port=free_port(), services=services)
        held.callback(stack.stop)  # a stack that never started stops at once
        stacks.append(stack)
    with ThreadPoolExecutor(len(stacks)) as pool:
        list(pool.map(Stack.start, stacks))
    sides = []
    for (held, _, services, workflows), stack in zip(specs, stacks, strict=True):
        http = held.enter_context(
            httpx.Client(base_url=stack.api_url, headers=stack.auth_headers, timeout=120)
        )
        scheduler = held.enter_context(connect(services.database_url))
        reader = held.enter_context(connect(services.database_url, autocommit=True))
        sides.append(Side(workflows, stack, http, scheduler, reader))
    return sides


def time_sides(sides: Sequence[Side], repeat: int) -> list[dict[str, Any]]:
    """Every call at every size in ``repeat`` rounds (a new run in three times as many): a row
    per call and size with its median, its times and when each began, and ``ratio``, the
    median over the rounds of its time over the smallest size's in the same round (1.0 at
    the smallest)."""
    since = time.perf_counter()
    rows = []
    for at_sizes in zip(*(side.made for side in sides), strict=True):
        name = at_sizes[0].name
        assert all(call.name == name for call in at_sizes)
        timed = time_rounds(at_sizes, repeat * (3 if name.startswith("new") else 1), since)
        first = [ms for _, ms in timed[0]]
        for side, times in zip(sides, timed, strict=True):
            took = [ms for _, ms in times]
            rows.append({
                "call": name,
                "workflows": side.workflows,
                "p50_ms": round(median(took), 2),
                "ratio": round(median([t / f for t, f in zip(took, first, strict=True)]), 3),
                "samples_ms": [round(t, 3) for t in took],
                "started_s": [round(s, 4) for s, _ in times],
            })  # fmt: skip
    return rows
