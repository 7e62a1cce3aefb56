"""Hourly tallies (``tally_hours``): always the per-minute rows summed by hour, whichever
statement folds them; a window's histograms, read by the hour with the minutes of its first
partial hour, equal the same window summed minute by minute, folded or not, over runs that
span hour boundaries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine, text

from orchestrator.db import tallies
from tests.orchestrator.history_support import end_runs, fold_all, snapshot

_SERIES = ("latency", "queue_wait", "task_run")


def _by_minute(conn: Connection, since: datetime) -> dict[str, tallies.Histogram]:
    """The window's histograms summed in Python from its per-minute figures."""
    merged = {series: tallies.Histogram() for series in _SERIES}
    for tally in tallies.per_minute(conn, since).values():
        for series in _SERIES:
            merged[series].merge(tally.histogram(series))
    return merged


def _same(read: dict[str, tallies.Histogram], summed: dict[str, tallies.Histogram]) -> None:
    for series in _SERIES:
        got, want = read.get(series, tallies.Histogram()), summed[series]
        assert got.counts == {b: n for b, n in want.counts.items() if n}, series
        assert got.peak == want.peak, series
        assert got.total == pytest.approx(want.total), series


def _check(conn: Connection, since: list[datetime] | None = None) -> None:
    """Every hour is its minutes' sum, and windows that start on, just after and between hour
    boundaries read the same histograms by the hour as by the minute."""
    by_hour = conn.execute(
        text(
            "SELECT date_trunc('hour', minute, 'UTC'), series, bucket, sum(n), max(peak) "
            "FROM tallies WHERE minute > '-infinity' AND minute < 'infinity' GROUP BY 1, 2, 3"
        )
    ).all()
    hours = conn.execute(text("SELECT hour, series, bucket, n, peak FROM tally_hours")).all()
    assert by_hour and sorted(map(tuple, hours)) == sorted(map(tuple, by_hour))
    now = conn.execute(text("SELECT now()")).scalar_one()
    hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    starts = since or [
        hour - timedelta(hours=4),  # on a boundary: hours only, and the current one's minutes
        hour - timedelta(hours=4) + timedelta(minutes=1),  # a partial first hour
        hour - timedelta(hours=2) - timedelta(minutes=37),
        now.replace(second=0, microsecond=0) - timedelta(minutes=14),  # the overview's 15 min
    ]
    for start in starts:
        assert tallies.whole_hour(start) >= start
        _same(tallies.window_histograms(conn, start, _SERIES), _by_minute(conn, start))


def test_a_windows_hours_and_edge_minutes_equal_its_minutes_folded_or_not(
    api_engine: Engine, flow: str
) -> None:
    with api_engine.begin() as conn:
        end_runs(conn, flow, seed=3)
    fold_all(api_engine)  # new minute rows: the hours' insert
    with snapshot(api_engine) as conn:
        _check(conn)
    with snapshot(api_engine) as conn:
        # Runs in the same minutes, not yet folded (this transaction's deltas): read beside
        # the kept hours and minutes.
        end_runs(conn, flow, seed=11)
        assert conn.execute(text("SELECT count(*) FROM tally_deltas")).scalar_one() > 0
        now = datetime.now(UTC).replace(second=0, microsecond=0)
        _check(conn, since=[now - timedelta(hours=3, minutes=21), now - timedelta(hours=3)])
    fold_all(api_engine)  # the same minute rows raised: the hours' update
    with snapshot(api_engine) as conn:
        _check(conn)


def test_pruning_drops_hours_as_old_as_the_minutes_it_drops(api_engine: Engine) -> None:
    with api_engine.begin() as conn:
        for age in ("3 days", "1 hour"):
            conn.execute(
                text(
                    "INSERT INTO tallies (minute, series, bucket, n) VALUES "
                    "(date_trunc('minute', now() - CAST(:age AS interval)), 'prune-test', -1, 1)"
                ),
                {"age": age},
            )
        conn.execute(tallies.PRUNE_MINUTES, {"keep": tallies.KEEP_MINUTES})
        left = conn.execute(
            text("SELECT hour < now() - interval '2 days' FROM tally_hours "
                 "WHERE series = 'prune-test'")
        ).scalars().all()  # fmt: skip
    assert left == [False]  # the recent hour stays
