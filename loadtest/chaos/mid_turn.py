"""Postgres killed while the scheduler is inside a loop turn's transaction.

A turn's writes go in one transaction, committed at the turn's end, and nothing it did is seen
outside before that commit (``scheduler.context.Turn``). A kill at a random moment mostly
lands between turns, where there is nothing to lose; this one is aimed at the inside of a turn
from outside the scheduler, with signals alone (no code path of the scheduler's is there for
it):

1. stop the scheduler (SIGSTOP to its process group) at a random moment and, once a statement
   it had sent has ended, look at its own Postgres connections (matched by their client
   ports): one *idle in transaction* with a transaction id is a turn that has written and not
   committed, and cannot commit now; if none is, let it go on (SIGCONT) and try again a few
   milliseconds later. *Why stop first:* what is seen is the scheduler's state, not a race
   between a watch's poll and a turn's commit (a watch that polled a running scheduler could
   miss every turn of a loaded machine). Every ``FEED_EVERY`` stops without a catch it starts
   a few workflows of the case's own (``Workload.feed``, judged with the rest): a fast
   scheduler may have ended all of the case's before the first stop, and an idle one writes
   nothing;
2. SIGKILL the turn's backend and the postmaster (the supervisor starts Postgres again), then
   SIGCONT the scheduler: it goes on mid-turn, on a connection that is gone.

Postgres, back, is asked whether the turn's transaction was lost (``pg_xact_status``:
aborted); if its commit slipped through (sent just before the stop, read by a backend the
machine's load kept waiting), Postgres is killed again inside another turn. The case then
judges every workflow as any other, and the fault's own check asks once more.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import random
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import psutil
import psycopg
from sqlalchemy import make_url

if TYPE_CHECKING:
    from loadtest.chaos.checks import Facts
    from loadtest.chaos.faults import Target

__all__ = ["SCHEDULER", "Caught", "kill_postgres_mid_turn", "turn_lost"]

log = logging.getLogger(__name__)

SCHEDULER: Final = "scheduler-1"
CATCH_S: Final = 60.0  # how long to try for a turn with writes not yet committed
SETTLE_S: Final = 0.05  # after the stop: a statement already sent has ended by then
GAP_S: Final = 0.03  # the scheduler runs a random time up to this between two stops
PORTS_EVERY_S: Final = 0.25  # how often its connections are listed again
FEED_EVERY: Final = 10  # stops without a turn caught, then more workflows are started...
FEED: Final = 3  # ...this many (the case's may all have ended: nothing to write)...
FEED_MAX: Final = 60  # ...at most this many in all
KILLS: Final = 5  # kills of Postgres at most, until one lands inside a turn
BACK_S: Final = 60.0  # for Postgres to answer again after a kill

_RECENT_RUNS: Final = """
SELECT status, count(*) FROM workflows WHERE created_at > now() - interval '5 minutes' GROUP BY 1
"""
# The scheduler's connections (by client port): a transaction id when it has written.
_STATES: Final = """
SELECT pid, backend_xid::text::bigint, state FROM pg_stat_activity
WHERE datname = current_database() AND client_port = ANY(%(ports)s)
"""


@dataclass(frozen=True)
class Caught:
    """The turn a kill landed in: its transaction's id (32 bits as seen, then the full 64), and
    the Postgres backend that held it."""

    xid: int
    backend: int


def _connect(database_url: str) -> psycopg.Connection[tuple[object, ...]]:
    url = make_url(database_url)
    return psycopg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password,
        dbname=url.database, autocommit=True, connect_timeout=5,
    )  # fmt: skip


def _ports(pid: int, postgres_port: int) -> list[int]:
    """The local ports of the connections ``pid``'s process tree has open to Postgres."""
    root = psutil.Process(pid)
    ports: list[int] = []
    for process in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            for c in process.net_connections(kind="tcp"):
                if c.raddr and c.raddr.port == postgres_port:
                    ports.append(c.laddr.port)
    return ports


def kill_postgres_mid_turn(target: Target) -> Caught:
    """Catch the scheduler inside a turn that has written, hold it there, SIGKILL Postgres and
    let the scheduler go on, until Postgres, back, says a caught turn was lost (a commit that
    the backend had read before the stop slips through: then Postgres is killed again, inside
    another turn); what was caught. ``RuntimeError`` when no turn was caught."""
    for _ in range(KILLS):
        caught = _kill_inside_a_turn(target)
        status = _status(target, caught)
        if status == "aborted":
            return caught
        log.info("turn %d was %s before the kill landed: once more", caught.xid, status)
    raise RuntimeError(f"no kill of {KILLS} landed inside a turn")


def _kill_inside_a_turn(target: Target) -> Caught:
    services = target.stack.services
    scheduler = target.pid(SCHEDULER)
    if scheduler is None:
        raise RuntimeError(f"{SCHEDULER} is not running")
    postgres_port = make_url(services.database_url).port
    assert postgres_port is not None
    deadline, stops = time.monotonic() + CATCH_S, 0
    seen: collections.Counter[str] = collections.Counter()  # the states its connections were in
    ports, looked = [], -math.inf
    with _connect(services.database_url) as watch:
        while time.monotonic() < deadline:
            if time.monotonic() - looked > PORTS_EVERY_S:
                ports, looked = _ports(scheduler, postgres_port), time.monotonic()
            if target.load is not None and stops % FEED_EVERY == 0:
                for _ in range(min(FEED, FEED_MAX - len(target.load.fed))):
                    target.load.feed()
            time.sleep(random.uniform(0.0, GAP_S))
            os.killpg(scheduler, signal.SIGSTOP)
            stops += 1
            try:
                time.sleep(SETTLE_S)
                caught = _open_turn(watch, ports, seen)
                if caught is not None:
                    caught = _durable_past(watch, caught)
                    # The turn's backend first: a backend outlives its postmaster until it
                    # notices, and would take the commit sent once the scheduler goes on.
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(caught.backend, signal.SIGKILL)
                    target.kill("postgres")
                    log.info("caught a turn after %d stops of the scheduler", stops)
                    return caught
            finally:
                os.killpg(scheduler, signal.SIGCONT)
        runs = {str(row[0]): row[1] for row in watch.execute(_RECENT_RUNS).fetchall()}
    raise RuntimeError(
        f"no turn of the scheduler's had writes not yet committed at any of {stops} stops "
        f"in {CATCH_S:g} s (its connections were seen: {dict(seen)}; runs of the last "
        f"5 min by status: {runs})"
    )


def _open_turn(
    watch: psycopg.Connection[tuple[object, ...]],
    ports: list[int],
    seen: collections.Counter[str],
) -> Caught | None:
    """A connection of the (stopped) scheduler's idle inside a transaction that has written;
    ``seen`` counts the states its connections are in."""
    rows = watch.execute(_STATES, {"ports": ports}).fetchall()
    seen.update(f"{state}{'' if xid is None else ', written'}" for _pid, xid, state in rows)
    seen["no connection"] += not rows
    for backend, xid, state in rows:
        if xid is not None and state == "idle in transaction":
            return Caught(int(str(xid)), int(str(backend)))
    return None


def _durable_past(watch: psycopg.Connection[tuple[object, ...]], caught: Caught) -> Caught:
    """``caught`` with its full (64-bit) transaction id, after a transaction of the watch's own
    has committed durably past it. *Why:* a turn whose writes never reached the disk leaves no
    trace, and a Postgres recovered from the crash would hand its id out again; with a later
    id durable, it cannot, and the turn's transaction reads committed or aborted, never another
    transaction's fate."""
    watch.execute("SET synchronous_commit = on")
    with watch.transaction():
        # A transaction that writes no WAL commits without a flush: this one writes some (a
        # table that lives only until the commit).
        watch.execute("CREATE TEMP TABLE mid_turn_marker ON COMMIT DROP AS SELECT 1 AS one")
        row = watch.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    marker = int(str(row[0]))
    full = (marker >> 32 << 32) | caught.xid
    if full > marker:  # assigned before the marker: in the epoch before, if the ids wrapped
        full -= 1 << 32
    return Caught(full, caught.backend)


def _status(target: Target, caught: Caught) -> str | None:
    """``pg_xact_status`` of the caught turn's transaction, once Postgres answers again."""
    database_url = target.stack.services.database_url
    deadline = time.monotonic() + BACK_S
    while True:
        try:
            with _connect(database_url) as conn:
                row = conn.execute(
                    "SELECT pg_xact_status(%(xid)s::text::xid8)", {"xid": caught.xid}
                ).fetchone()
            return None if row is None else str(row[0])
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def turn_lost(target: Target, facts: Facts, caught: Caught | None) -> list[str]:
    """Postgres, restarted, says the caught turn's transaction never committed."""
    if caught is None:
        return ["the fault caught no turn of the scheduler's"]
    try:
        status = _status(target, caught)
    except psycopg.OperationalError as exc:
        return [f"Postgres did not answer within {BACK_S:g} s of the case's end: {exc}"]
    if status != "aborted":
        return [f"the turn's transaction {caught.xid} is {status}: the kill did not land inside it"]
    return []
