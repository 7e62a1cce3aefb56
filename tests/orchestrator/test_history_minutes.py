"""Minutes' summaries (``tally_minutes``): always what each kept minute's rows say, whichever
statement folds them; a window read from them (and live from the first minute not yet folded)
draws the same chart as one read minute by minute from the rows; pruning drops them with the
minutes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine, text

from orchestrator.db import tallies
from orchestrator.db.repository import stats
from tests.orchestrator.history_support import SPAN_MIN, end_runs, fold_all, snapshot

_WIDTH = 6 * 60


def _live(conn: Connection, since: datetime) -> list[stats.Minute]:
    """The window's minutes read from the rows alone, as before there were summaries."""
    figures = stats.Window(
        since,
        _WIDTH,
        summaries={},
        counts=tallies.window_counts(conn, since),
        latency=tallies.minute_quantiles(conn, since, "latency", (0.5, 0.95)),
        histograms={},
        totals={},
    )
    return stats.minutes(figures)


def _same_chart(conn: Connection) -> stats.Window:
    since = stats.window(conn, _WIDTH)[1]  # type: ignore[arg-type]
    figures = stats.read_window(conn, since, _WIDTH)  # type: ignore[arg-type]
    read, live = stats.minutes(figures), _live(conn, since)
    assert [m.minute for m in read] == [m.minute for m in live]
    for got, want in zip(read, live, strict=True):
        assert (got.completed, got.failed, got.created) == (
            want.completed,
            want.failed,
            want.created,
        ), got.minute
        assert got.p50_ms == pytest.approx(want.p50_ms), got.minute
        assert got.p95_ms == pytest.approx(want.p95_ms), got.minute
    assert sum(m.completed for m in read) > 0 and sum(m.failed for m in read) > 0
    return figures


def test_a_window_from_summaries_draws_the_chart_its_rows_do(api_engine: Engine, flow: str) -> None:
    with api_engine.begin() as conn:
        end_runs(conn, flow, seed=5)
    fold_all(api_engine)  # the minutes' rows inserted: their summaries written
    with snapshot(api_engine) as conn:
        figures = _same_chart(conn)
        # Everything folded: every minute with runs comes from its summary, none read live.
        assert figures.counts == {} and len(figures.summaries) >= SPAN_MIN - 1
    with snapshot(api_engine) as conn:
        # Runs in the same minutes not yet folded: read live from the first of them on.
        end_runs(conn, flow, seed=13)
        figures = _same_chart(conn)
        assert figures.counts and all(m < min(figures.counts) for m in figures.summaries)
    fold_all(api_engine)  # the same minutes' rows raised: their summaries rewritten
    with snapshot(api_engine) as conn:
        figures = _same_chart(conn)
        assert figures.counts == {}
        stored = conn.execute(
            text("SELECT sum(completed), sum(failed) FROM tally_minutes WHERE minute >= :since"),
            {"since": figures.since},
        ).one()
        chart = stats.minutes(figures)
        assert tuple(stored) == (sum(m.completed for m in chart), sum(m.failed for m in chart))


def test_pruning_drops_summaries_as_old_as_the_minutes_it_drops(api_engine: Engine) -> None:
    old = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=2, minutes=5)
    with api_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tally_minutes (minute, completed, failed, created) "
                "VALUES (:old, 1, 0, 1) ON CONFLICT DO NOTHING"
            ),
            {"old": old},
        )
        conn.execute(tallies.PRUNE_MINUTES, {"keep": tallies.KEEP_MINUTES})
        oldest = conn.execute(text("SELECT min(minute) FROM tally_minutes")).scalar()
    assert oldest is None or oldest > old
