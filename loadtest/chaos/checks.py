"""What a case checks after its fault beyond how each workflow ended: that every piece of the
stack runs again (no crash loop), that a cut-off or killed host took its place again, and that
Postgres is intact after its disk was full. Each check returns the problems it found (none:
``[]``), each a sentence for the report."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import psycopg
from sqlalchemy import make_url

from loadtest.chaos.mid_turn import turn_lost
from loadtest.chaos.workload import api_client

if TYPE_CHECKING:  # faults strikes with these checks
    from loadtest.chaos.faults import Target

__all__ = [
    "Facts",
    "all_running",
    "check_for",
    "disk_said_so",
    "host_back",
    "postgres_intact",
    "s3_said_so",
    "turn_was_lost",
]

SETTLE_S: Final = 60.0  # how long a piece may take to be back once its fault has ended


@dataclass(frozen=True)
class Facts:
    """What the case saw: when the fault ended (None: it never did), and what the API said
    when it refused a start (status -> the first such answer's body)."""

    ended_at: float | None
    refusals: Mapping[str, str] = field(default_factory=dict)


Check = Callable[["Target", Facts], list[str]]


def all_running(target: Target, wait_s: float = SETTLE_S) -> list[str]:
    """Every process of the stack is up (none left restarting or given up on)."""
    deadline = time.monotonic() + wait_s
    while True:
        down = [p.name for p in target.stack.processes() if p.pid is not None and not p.alive()]
        if not down or time.monotonic() > deadline:
            return [f"{name} is not running {wait_s:g} s after the case" for name in down]
        time.sleep(0.5)


def host_back(target: Target, facts: Facts, worker: str = "worker-2") -> list[str]:
    """Host 2's worker beats again after the fault's end (it reaches Redis), and its minion
    runs (it reaches the controller again or was restarted)."""
    ended_at = facts.ended_at
    if ended_at is None:
        return ["the fault never ended"]
    problems = all_running(target)
    with api_client(target.stack) as api:
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            reply = api.get("/api/workers")
            beats = {w["id"]: w for w in reply.json()} if reply.status_code == 200 else {}
            if (beats.get(worker, {}).get("last_heartbeat") or 0) > ended_at:
                return problems
            time.sleep(0.5)
    return [*problems, f"{worker} (host 2) sent no heartbeat in the {SETTLE_S:g} s after the end"]


def disk_said_so(target: Target, facts: Facts) -> list[str]:
    """While the disk was full, the API's refusals said so (not "unreachable"), and Postgres
    is intact after (``postgres_intact``)."""
    problems = [
        f"a {status} while the disk was full did not say so: {text[:200]}"
        for status, text in facts.refusals.items()
        if status.startswith("5") and "disk of its data folder is full" not in text
    ]
    return [*problems, *postgres_intact(target, facts)]


def postgres_intact(target: Target, facts: Facts) -> list[str]:
    """Every table's heap and every B-tree index of the stack's database checked by
    ``amcheck`` (the extension is made for the check and dropped after)."""
    problems = all_running(target)
    services = target.stack.services
    if services.admin_database_url is None:
        return [*problems, "no superuser URL for the embedded Postgres: amcheck not run"]
    admin = make_url(services.admin_database_url)
    database = make_url(services.database_url).database
    with psycopg.connect(
        host=admin.host, port=admin.port, user=admin.username, password=admin.password,
        dbname=database, autocommit=True,
    ) as conn:  # fmt: skip
        conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
        try:
            heap = conn.execute(
                "SELECT c.relname, v.blkno, v.msg FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "CROSS JOIN LATERAL verify_heapam(c.oid) v "
                "WHERE n.nspname = 'public' AND c.relkind = 'r'"
            ).fetchall()
            problems += [f"table {name}, block {block}: {msg}" for name, block, msg in heap]
            indexes = conn.execute(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "JOIN pg_am a ON a.oid = c.relam "
                "WHERE n.nspname = 'public' AND a.amname = 'btree'"
            ).fetchall()
            for (name,) in indexes:
                try:
                    conn.execute("SELECT bt_index_check(%s::regclass, true)", (name,))
                except psycopg.Error as exc:
                    problems.append(f"index {name}: {exc}")
        finally:
            conn.execute("DROP EXTENSION IF EXISTS amcheck")
    return problems


def s3_said_so(target: Target, facts: Facts) -> list[str]:
    """While S3 was down, the API's own S3 routes answered 503 (not a 500), and everything
    runs again after."""
    problems = all_running(target)
    if not target.observed:
        problems.append("no answer of the API's S3 routes was recorded while S3 was down")
    for route, answer in target.observed.items():
        if not answer.startswith("503 "):
            problems.append(f"{route} answered {answer} while S3 was down (expected 503)")
    return problems


def _running(target: Target, facts: Facts) -> list[str]:
    return all_running(target)


def turn_was_lost(target: Target, facts: Facts) -> list[str]:
    """Everything runs again, and the turn Postgres was killed inside never committed."""
    return [*all_running(target), *turn_lost(target, facts, target.turn)]


# By fault name; every other fault gets ``all_running``.
CHECKS: Final[dict[str, Check]] = {
    "partition": host_back,
    "host-kill": host_back,
    "disk-full": disk_said_so,
    "s3-outage": s3_said_so,
    "postgres-mid-turn": turn_was_lost,
}


def check_for(name: str) -> Check:
    return CHECKS.get(name, _running)
