"""What the history's tallies tests share: runs ended over hours, read in one snapshot, and
every delta folded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, text

from orchestrator.db import tallies

__all__ = ["SPAN_MIN", "end_runs", "fold_all", "snapshot"]

SPAN_MIN = 300  # the runs end over the last five hours


def end_runs(conn: Connection, flow: str, seed: int) -> None:
    """Runs of ``flow`` that ended, one every minute of the span (some failed), each with a
    task run that finished with it; latencies and task times vary with ``seed``."""
    conn.execute(
        text(
            "WITH w AS ("
            " INSERT INTO workflows (id, definition, definition_version, status, policy,"
            "  data_plane, input, created_at, finished_at)"
            " SELECT gen_random_uuid(), :flow, 1,"
            "  CASE WHEN i % 7 = 0 THEN 'FAILED' ELSE 'COMPLETED' END::workflow_status,"
            "  'affinity', 'cdi', '{}',"
            "  now() - i * interval '1 minute' - ((i * :seed) % 97 + 1) * interval '130 ms',"
            "  now() - i * interval '1 minute'"
            " FROM generate_series(0, :span - 1) i RETURNING id, created_at, finished_at)"
            " INSERT INTO task_runs (workflow_id, ref, task, attempt, status, queued_at,"
            "  started_at, finished_at, queue_wait_ms, run_ms)"
            " SELECT id, 'a', 'noop', 1, 'COMPLETED', created_at, created_at, finished_at,"
            "  extract(epoch FROM finished_at - created_at) * 100,"
            "  extract(epoch FROM finished_at - created_at) * 900 FROM w"
        ),
        {"flow": flow, "seed": seed, "span": SPAN_MIN},
    )


@contextmanager
def snapshot(engine: Engine) -> Iterator[Connection]:
    """A transaction that sees one moment throughout (housekeeping folds meanwhile)."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


def fold_all(engine: Engine) -> None:
    """Until no delta is left: folded here, or by housekeeping when it holds the fold."""
    for _ in range(1000):
        with engine.begin() as conn:
            tallies.fold(conn)
            if conn.execute(text("SELECT count(*) FROM tally_deltas")).scalar_one() == 0:
                return
        time.sleep(0.01)
    raise AssertionError("deltas left after a thousand folds")
