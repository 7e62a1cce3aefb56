"""The query plans behind an API call, as Postgres ran them (``auto_explain``).

The benchmark's database loads ``auto_explain`` into every session
(``session_preload_libraries``), logging nothing. To see what a call ran, ``PlanCapture``
turns logging of every statement's plan on (``EXPLAIN ANALYZE`` with buffers) for the API's
sessions' statements, makes the call, turns it off and reads those plans from Postgres's log:
the statements the API really sent, not a copy of them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psutil
import psycopg
from psycopg import sql

__all__ = ["Plan", "PlanCapture", "preload_auto_explain"]

_ENTRY: Final = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ \[(\d+)\] (\w+):  ")
_DURATION: Final = re.compile(r"duration: ([\d.]+) ms\s+plan:")
_SETTINGS: Final = {
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_buffers": "on",
    "auto_explain.log_nested_statements": "on",
}


@dataclass(frozen=True)
class Plan:
    duration_ms: float
    text: str  # "Query Text: …" and the plan


def preload_auto_explain(admin: psycopg.Connection[Any], database: str) -> None:
    """Every new session of ``database`` loads ``auto_explain`` (which logs nothing until
    ``PlanCapture`` says so)."""
    admin.execute(
        sql.SQL("ALTER DATABASE {} SET session_preload_libraries = 'auto_explain'").format(
            sql.Identifier(database)
        )
    )


class PlanCapture:
    """The plans of what the API process's sessions run during a call."""

    def __init__(
        self, admin: psycopg.Connection[Any], log_file: Path, database: str, pg_port: int
    ) -> None:
        self._admin = admin  # a superuser's, autocommit
        self._log = log_file
        self._database = database
        self._pg_port = pg_port

    def plans(self, api_pid: int, make: Callable[[], None], keep: int = 3) -> list[Plan]:
        """The ``keep`` slowest statements the API ran while ``make()`` ran."""
        self._admin.execute("LOAD 'auto_explain'")
        self._set(True)
        try:
            offset = self._log.stat().st_size
            make()
            time.sleep(0.5)  # the log is written by each backend as it goes
            backends = self._api_backends(api_pid)
        finally:
            self._set(False)
        with self._log.open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        found = [p for pid, p in _entries(text) if pid in backends]
        return sorted(found, key=lambda p: -p.duration_ms)[:keep]

    def _set(self, on: bool) -> None:
        for name, value in _SETTINGS.items():
            if on:
                statement = sql.SQL("ALTER SYSTEM SET {} = {}").format(
                    sql.Identifier(*name.split(".")), sql.Literal(value)
                )
            else:
                statement = sql.SQL("ALTER SYSTEM RESET {}").format(
                    sql.Identifier(*name.split("."))
                )
            self._admin.execute(statement)
        self._admin.execute("SELECT pg_reload_conf()")
        time.sleep(0.3)  # each session reads the configuration before its next statement

    def _api_backends(self, api_pid: int) -> set[int]:
        """The server processes serving the API's connections (matched by client port)."""
        ports = set()
        for proc in [psutil.Process(api_pid), *psutil.Process(api_pid).children(recursive=True)]:
            for conn in proc.net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == self._pg_port:
                    ports.add(conn.laddr.port)
        rows = self._admin.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE datname = %s",
            (self._database,),
        ).fetchall()
        return {int(pid) for pid, port in rows if port in ports}


def _entries(text: str) -> list[tuple[int, Plan]]:
    """The ``auto_explain`` entries of a stretch of the log: (backend pid, plan)."""
    out: list[tuple[int, Plan]] = []
    current: list[str] | None = None
    pid = 0
    for line in [*text.splitlines(), "2000-01-01 00:00:00 UTC [0] END:  "]:
        head = _ENTRY.match(line)
        if head is None:
            if current is not None:
                current.append(line)
            continue
        if current is not None:
            body = "\n".join(current)
            duration = _DURATION.search(body)
            if duration:
                plan = body[duration.end() :].strip("\n")
                out.append((pid, Plan(float(duration[1]), plan)))
        pid = int(head[1])
        current = [line[head.end() :]] if head[2] == "LOG" else None
    return out
