"""Figures kept as runs change, read without touching the runs: counts by status, runs ended
and created per minute, and histograms of how long runs and task runs took.

Statement-level triggers on ``workflows``, ``task_runs`` and ``handoffs`` (migration 0010)
append what each statement changed to ``tally_deltas``: one row per (minute, series, bucket),
``-infinity`` for all-time figures, bucket -1 for plain counts. Appending takes no lock and
touches no index, so concurrent statements (the API's starts, every scheduler's reports) never
wait on a shared counter row. ``fold`` (housekeeping, about once a second) moves the deltas
into ``tallies``, a bounded batch a statement; readers add both, so a figure is exact whenever
it is read. A trigger on ``tallies`` sums its per-minute rows by hour (UTC) into
``tally_hours`` (migration 0011): a window's histograms read its whole hours there and only its
first partial hour by the minute, so their cost follows the window's hours, not how many runs
each minute saw. Another trigger keeps each kept minute's overview figures in ``tally_minutes``
(migration 0012: runs started, completed and failed, the p50 and p95 of its completions), so a
window's chart reads a row a minute and only the minutes not yet folded from the rows above.

The series (the triggers' words):

* ``workflows:<STATUS>``, ``task_runs:<STATUS>`` — rows on record by status (all time; a
  pruned run leaves them);
* ``ended:<STATUS>`` — runs ended (all time and per minute; pruning leaves them);
* ``created`` — runs started, per minute;
* ``latency`` — created → finished of completed runs, ms (all time and per minute);
* ``queue_wait``, ``task_run``, ``task_finished`` — finished task runs' queue wait and run
  time (ms) and their number (``queue_wait`` all time too);
* ``run:<task>`` — completed task runs' run time by task, ms (all time);
* ``handoffs`` — hand-offs made and their bytes (``total``), all time;
* ``pruned``, ``archived`` — runs retention removed and archived (all time and per minute).

Histograms count by bucket: bucket ``i`` holds values in ``(MS_BOUNDS[i-1], MS_BOUNDS[i]]``
(bucket 0 from 0, the last above the last bound), ``total`` sums the values and ``peak`` keeps
the largest. Bounds step by at most 1/6, so a percentile read from them is within about 8 %
of the exact one; every bound of ``metrics.DURATION_BUCKETS_S`` is one of them, so the
Prometheus histograms are exact.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from threading import Event
from typing import Any, Final

from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

__all__ = [
    "FOLD",
    "FOLD_BATCH",
    "FOLD_LOCK",
    "KEEP_MINUTES",
    "MS_BOUNDS",
    "PRUNE_MINUTES",
    "SUMMED_SERIES",
    "Folded",
    "Histogram",
    "Summary",
    "Tally",
    "all_time",
    "counts",
    "fold",
    "fold_all",
    "minute_quantiles",
    "per_minute",
    "summaries",
    "unfolded_since",
    "whole_hour",
    "window_counts",
    "window_histograms",
    "window_sums",
    "within",
]

_MANTISSAS: Final = (1, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2, 2.2, 2.5, 2.8, 3, 3.5, 4, 4.5, 5,
                     5.5, 6, 7, 8, 9)  # fmt: skip
# 0.1 ms to 1,000 s; the migration's ``history_ms_bounds()`` holds the same (a test compares).
MS_BOUNDS: Final[tuple[float, ...]] = (
    *(round(m * 10.0**e, 6) for e in range(-1, 6) for m in _MANTISSAS),
    1_000_000.0,
)
KEEP_MINUTES: Final = timedelta(days=2)  # per-minute and hourly rows kept (windows <= 1 day)
FOLD_LOCK: Final = 0x6364_6966_7461_6C79  # "cdiftaly": one fold at a time

FOLD_BATCH: Final = 10_000  # deltas a fold statement moves (its sort stays small)

# Move the next ``:batch`` deltas after row ``:after`` (in the table's physical order, a range
# of its pages read) into ``tallies``, in key order (two folds never lock rows crosswise),
# unless another fold holds the lock (then it folds them). A batch at a time, so that deltas
# that piled up (an API down for hours while schedulers ended runs) are folded in statements
# of bounded size rather than one sort of them all. The deltas moved, the rows written, and
# the last row read (where the next batch starts).
FOLD: Final = text(
    f"""
    WITH lock AS (SELECT pg_try_advisory_xact_lock({FOLD_LOCK}) AS held),
    batch AS MATERIALIZED (
        SELECT ctid FROM tally_deltas
        WHERE (SELECT held FROM lock) AND ctid > CAST(:after AS tid) LIMIT :batch
    ), moved AS (
        DELETE FROM tally_deltas WHERE ctid = ANY(ARRAY(SELECT ctid FROM batch))
        RETURNING minute, series, bucket, n, total, peak
    ), folded AS (
        INSERT INTO tallies (minute, series, bucket, n, total, peak)
        SELECT minute, series, bucket, sum(n), sum(total), max(peak) FROM moved
        GROUP BY minute, series, bucket ORDER BY minute, series, bucket
        ON CONFLICT (minute, series, bucket) DO UPDATE SET
            n = tallies.n + excluded.n,
            total = tallies.total + excluded.total,
            peak = greatest(tallies.peak, excluded.peak)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM folded),
           CAST((SELECT max(ctid) FROM batch) AS text)
    """
)
_FIRST_ROW: Final = "(0,0)"  # before every row


@dataclass(frozen=True)
class Folded:
    """What one fold statement did: deltas moved, rows of ``tallies`` written, and the row the
    next batch starts after (``None`` when this one moved none)."""

    moved: int
    written: int
    last: str | None


def fold(db: Session | Connection, *, after: str | None = None,
         batch: int = FOLD_BATCH) -> Folded:  # fmt: skip
    """Fold one batch of deltas, those after row ``after`` (from the first when ``None``), in
    the caller's transaction. Fewer than ``batch`` moved: none was left after ``after`` (or
    another fold holds the lock)."""
    row = db.execute(FOLD, {"after": after or _FIRST_ROW, "batch": batch}).one()
    return Folded(moved=int(row[0]), written=int(row[1]), last=row[2])


def fold_all(engine: Engine, *, stop: Event | None = None, batch: int = FOLD_BATCH) -> int:
    """Fold the deltas a batch a transaction (a backlog never makes one long statement) until
    a batch finds none left after the last, or ``stop`` is set; the rows written."""
    written, after = 0, None
    while True:
        with engine.begin() as conn:
            done = fold(conn, after=after, batch=batch)
        written += done.written
        if done.moved < batch or (stop is not None and stop.is_set()):
            return written
        after = done.last


# Per-minute and hourly rows and minutes' summaries older than ``KEEP_MINUTES`` (the all-time
# ones stay).
PRUNE_MINUTES: Final = text(
    """
    WITH hours AS (DELETE FROM tally_hours WHERE hour < now() - CAST(:keep AS interval)),
    summaries AS (DELETE FROM tally_minutes WHERE minute < now() - CAST(:keep AS interval))
    DELETE FROM tallies WHERE minute > '-infinity' AND minute < now() - CAST(:keep AS interval)
    """
)

_ALL_TIME: Final = text(
    """
    SELECT series, bucket, sum(n), sum(total), max(peak) FROM (
        SELECT series, bucket, n, total, peak FROM tallies WHERE minute = '-infinity'
        UNION ALL
        SELECT series, bucket, n, total, peak FROM tally_deltas WHERE minute = '-infinity'
    ) t GROUP BY series, bucket
    """
)
_COUNTS: Final = text(
    """
    SELECT series, sum(n) FROM (
        SELECT series, n FROM tallies
        WHERE minute = '-infinity' AND bucket = -1 AND starts_with(series, :prefix)
        UNION ALL
        SELECT series, n FROM tally_deltas
        WHERE minute = '-infinity' AND bucket = -1 AND starts_with(series, :prefix)
    ) t GROUP BY series
    """
)


def _in_window(condition: str) -> str:
    """The rows, kept and not yet folded alike, of the minutes from ``:since`` on that meet
    ``condition`` (the primary key's range of minutes)."""
    return f"""(
        SELECT minute, series, bucket, n, total, peak FROM tallies
        WHERE minute >= :since AND minute < 'infinity' AND {condition}
        UNION ALL
        SELECT minute, series, bucket, n, total, peak FROM tally_deltas
        WHERE minute >= :since AND minute < 'infinity' AND {condition}
    ) t"""


_PER_MINUTE: Final = text(
    f"SELECT minute, series, bucket, sum(n), sum(total), max(peak) FROM {_in_window('true')} "
    "GROUP BY minute, series, bucket"
)
# Plain counts per minute (a few series a minute), a row a minute: the series and their counts.
_WINDOW_COUNTS: Final = text(
    f"""
    SELECT minute, array_agg(series), array_agg(n) FROM (
        SELECT minute, series, CAST(sum(n) AS bigint) AS n FROM {_in_window("bucket = -1")}
        GROUP BY minute, series
    ) m GROUP BY minute
    """
)
# Histograms and counts of the whole window, summed by the database (at most a row a bucket):
# the hours from ``:whole`` (the window's first whole hour) on, the kept minutes before it, and
# the deltas not yet folded (into minutes and hours alike) of every minute from ``:since``.
_WINDOW_SUMS: Final = text(
    """
    SELECT series, bucket, sum(n), sum(total), max(peak) FROM (
        SELECT series, bucket, n, total, peak FROM tally_hours
        WHERE hour >= :whole AND hour < 'infinity' AND series = ANY(:series)
        UNION ALL
        SELECT series, bucket, n, total, peak FROM tallies
        WHERE minute >= :since AND minute < :whole AND series = ANY(:series)
        UNION ALL
        SELECT series, bucket, n, total, peak FROM tally_deltas
        WHERE minute >= :since AND minute < 'infinity' AND series = ANY(:series)
    ) t GROUP BY series, bucket
    """
)
# The series each kept minute's summary (``tally_minutes``, migration 0012) is made of: runs
# started and ended, and the latency of those completed.
SUMMED_SERIES: Final = ("created", "latency", "ended:COMPLETED", "ended:FAILED",
                        "ended:CANCELLED", "ended:TIMED_OUT")  # fmt: skip
# The earliest minute from ``:since`` on with figures of the summed series not yet folded (so
# missing from its summary); NULL when every one is folded.
_UNFOLDED_SINCE: Final = text(
    "SELECT min(minute) FROM tally_deltas "
    "WHERE minute >= :since AND minute < 'infinity' AND series = ANY(:series)"
)
_SUMMARIES: Final = text(
    "SELECT minute, completed, failed, created, p50_ms, p95_ms FROM tally_minutes "
    "WHERE minute >= :since AND minute < :until"
)
# Each minute's quantile of one histogram for every share q, a row a minute (the shares'
# places, from 1, and the quantiles): the database walks the buckets (a window of hours holds
# thousands of rows) to the one where the q-quantile lies and interpolates as ``within`` does.
_MINUTE_QUANTILES: Final = text(
    f"""
    WITH h AS (
        SELECT minute, bucket, sum(n) AS n, max(peak) AS peak
        FROM {_in_window("series = :series AND bucket >= 0")} GROUP BY minute, bucket
    ), c AS (
        SELECT minute, bucket, n,
               sum(n) OVER (PARTITION BY minute ORDER BY bucket) AS upto,
               sum(n) OVER (PARTITION BY minute) AS total,
               max(peak) OVER (PARTITION BY minute) AS top
        FROM h
    )
    , at AS (
        SELECT c.minute, q.i, c.top, c.n,
               greatest(0, q.q * c.total - (c.upto - c.n)) AS rank,
               CASE WHEN c.bucket > 0 THEN b.ms[c.bucket] ELSE 0 END AS low,
               b.ms[c.bucket + 1] AS high  -- NULL above the last bound
        FROM c CROSS JOIN unnest(CAST(:qs AS float8[])) WITH ORDINALITY q(q, i)
        CROSS JOIN (SELECT history_ms_bounds() AS ms) b
        WHERE c.n > 0 AND c.upto - c.n < q.q * c.total AND c.upto >= q.q * c.total
    )
    SELECT minute, array_agg(i),
           array_agg(least(low + (coalesce(high, nullif(top, 0), low) - low) * rank / n, top))
    FROM at GROUP BY minute
    """
)


@dataclass
class Histogram:
    """Counts by ``MS_BOUNDS`` bucket, their sum and the largest value."""

    counts: dict[int, int] = field(default_factory=dict)
    total: float = 0.0
    peak: float | None = None

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def add(self, bucket: int, n: int, total: float, peak: float | None) -> None:
        self.counts[bucket] = self.counts.get(bucket, 0) + n
        self.total += total
        if peak is not None:
            self.peak = peak if self.peak is None else max(self.peak, peak)

    def merge(self, other: Histogram) -> None:
        for bucket, n in other.counts.items():
            self.add(bucket, n, 0.0, None)
        self.total += other.total
        if other.peak is not None:
            self.peak = other.peak if self.peak is None else max(self.peak, other.peak)

    def quantile(self, q: float) -> float | None:
        """The value under which a share ``q`` of them lie, interpolated within its bucket
        (never above the largest)."""
        count = self.count
        if count == 0:
            return None
        target, seen = q * count, 0
        for bucket in sorted(self.counts):
            n = self.counts[bucket]
            if n <= 0:
                continue
            if seen + n >= target:
                return within(bucket, n, target - seen, self.peak)
            seen += n
        return self.peak

    def at_or_under(self, bound_ms: float) -> int:
        """How many are at most ``bound_ms``, which must be one of ``MS_BOUNDS``."""
        index = bisect.bisect_left(MS_BOUNDS, bound_ms)
        if index == len(MS_BOUNDS) or MS_BOUNDS[index] != bound_ms:
            raise ValueError(f"{bound_ms} ms is not a bucket bound")
        return sum(n for bucket, n in self.counts.items() if bucket <= index)


def within(bucket: int, n: int, rank: float, peak: float | None) -> float:
    """The value of rank ``rank`` (from 0 to ``n``) among the ``n`` values of ``bucket``, the
    values taken as spread evenly over it (the last bucket reaches up to ``peak``); never
    above ``peak``."""
    low = MS_BOUNDS[bucket - 1] if bucket > 0 else 0.0
    high = MS_BOUNDS[bucket] if bucket < len(MS_BOUNDS) else (peak or low)
    value = low + (high - low) * max(0.0, rank) / n
    return min(value, peak) if peak is not None else value


@dataclass
class Tally:
    """The series of one moment (all time, or one minute): counts and histograms by name."""

    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    histograms: dict[str, Histogram] = field(default_factory=lambda: defaultdict(Histogram))

    def add(self, series: str, bucket: int, n: int, total: float, peak: float | None) -> None:
        if bucket < 0:
            self.counts[series] += n
            self.sums[series] += total
        else:
            self.histograms[series].add(bucket, n, total, peak)

    def count(self, series: str) -> int:
        return self.counts.get(series, 0)

    def histogram(self, series: str) -> Histogram:
        return self.histograms.get(series) or Histogram()

    def with_prefix(self, prefix: str) -> Mapping[str, int]:
        """Counts of the series named ``<prefix><key>``, by key."""
        return {s.removeprefix(prefix): n for s, n in self.counts.items() if s.startswith(prefix)}

    def histograms_with_prefix(self, prefix: str) -> Mapping[str, Histogram]:
        return {
            s.removeprefix(prefix): h for s, h in self.histograms.items() if s.startswith(prefix)
        }


def _rows(rows: Iterable[Any]) -> Iterable[tuple[str, int, int, float, float | None]]:
    for series, bucket, n, total, peak in rows:
        yield str(series), int(bucket), int(n), float(total or 0.0), peak


def all_time(db: Session | Connection) -> Tally:
    """Every all-time figure (one query over the tallies, however many runs there are)."""
    tally = Tally()
    for row in _rows(db.execute(_ALL_TIME)):
        tally.add(*row)
    return tally


def counts(db: Session | Connection, prefix: str) -> dict[str, int]:
    """The all-time counts of the series named ``<prefix><key>``, by key (e.g. ``workflows:``:
    the runs on record by status)."""
    return {
        str(series).removeprefix(prefix): int(n)
        for series, n in db.execute(_COUNTS, {"prefix": prefix})
    }


def window_counts(db: Session | Connection, since: datetime) -> dict[datetime, dict[str, int]]:
    """The plain counts of each minute from ``since`` on, by series."""
    return {
        minute: dict(zip(names, counts, strict=True))
        for minute, names, counts in db.execute(_WINDOW_COUNTS, {"since": since})
    }


def window_histograms(
    db: Session | Connection, since: datetime, series: Iterable[str]
) -> dict[str, Histogram]:
    """Histograms of ``series`` summed over the minutes from ``since`` on (a minute's start;
    read by the hour from the first whole one)."""
    return window_sums(db, since, series)[0]


def window_sums(
    db: Session | Connection, since: datetime, series: Iterable[str]
) -> tuple[dict[str, Histogram], dict[str, int]]:
    """Of ``series`` summed over the minutes from ``since`` on (read by the hour from the first
    whole one): the histograms, and the plain counts, by series."""
    histograms: dict[str, Histogram] = defaultdict(Histogram)
    counted: dict[str, int] = defaultdict(int)
    params = {"since": since, "whole": whole_hour(since), "series": list(series)}
    for name, bucket, n, total, peak in _rows(db.execute(_WINDOW_SUMS, params)):
        if bucket < 0:
            counted[name] += n
        else:
            histograms[name].add(bucket, n, total, peak)
    return histograms, counted


@dataclass(frozen=True)
class Summary:
    """A kept minute's overview figures (``tally_minutes``)."""

    completed: int
    failed: int  # FAILED, CANCELLED or TIMED_OUT
    created: int
    p50_ms: float | None
    p95_ms: float | None


def unfolded_since(db: Session | Connection, since: datetime) -> datetime | None:
    """The earliest minute from ``since`` on whose runs started or ended are not all folded
    into its summary yet (``None``: every one is)."""
    found = db.execute(_UNFOLDED_SINCE, {"since": since, "series": list(SUMMED_SERIES)})
    moment: datetime | None = found.scalar()
    return moment


def summaries(
    db: Session | Connection, since: datetime, until: datetime | None = None
) -> dict[datetime, Summary]:
    """The kept minutes' summaries from ``since`` up to ``until`` (excluded; ``None``: on),
    by minute; a minute with no runs may have none."""
    bound = until if until is not None else datetime.max.replace(tzinfo=UTC)
    return {
        minute: Summary(int(done), int(failed), int(created), p50, p95)
        for minute, done, failed, created, p50, p95 in db.execute(
            _SUMMARIES, {"since": since, "until": bound}
        )
    }


def whole_hour(moment: datetime) -> datetime:
    """The first hour (UTC, as ``tally_hours`` counts them) that starts at or after
    ``moment``."""
    hour = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return hour if hour == moment else hour + timedelta(hours=1)


def minute_quantiles(
    db: Session | Connection, since: datetime, series: str, shares: Iterable[float]
) -> dict[datetime, dict[float, float]]:
    """Of each minute from ``since`` on with values of histogram ``series``: its quantile
    for each share, by share."""
    qs = [float(q) for q in shares]
    params = {"since": since, "series": series, "qs": qs}
    return {
        minute: {qs[i - 1]: float(value) for i, value in zip(places, values, strict=True)}
        for minute, places, values in db.execute(_MINUTE_QUANTILES, params)
    }


def per_minute(db: Session | Connection, since: datetime) -> dict[datetime, Tally]:
    """The figures of each minute from ``since`` on that has any."""
    minutes: dict[datetime, Tally] = defaultdict(Tally)
    for minute, *rest in db.execute(_PER_MINUTE, {"since": since}):
        series, bucket, n, total, peak = next(iter(_rows([rest])))
        minutes[minute].add(series, bucket, n, total, peak)
    return minutes
