"""Cron expressions and their fire times, for schedules (the API checks and shows them, the
scheduler fires them): ``croniter`` evaluates them, in a named time zone (``zoneinfo``).

An expression has five fields (minute hour day-of-month month day-of-week), or six with the
seconds first (``*/10 * * * * *``: every ten seconds), or is one of ``@yearly``,
``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight``, ``@hourly``. Ticks are
computed in the schedule's zone, so ``0 9 * * *`` in ``Europe/Paris`` fires at 09:00 Paris
time in winter and summer alike; a time a daylight-saving change skips fires at the next
valid moment, as cron does. Every moment returned is aware and in UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, croniter

from orchestrator.contract.vocabulary import CatchUp
from orchestrator.errors import InvalidRequest

__all__ = ["ALIASES", "Cron", "cron_problems"]

ALIASES: Final = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_MAX_LENGTH: Final = 255


def cron_problems(expression: str, timezone: str) -> list[str]:
    """What is wrong with ``expression`` in ``timezone`` (empty: nothing)."""
    problems = []
    fields = expression.split()
    if len(expression) > _MAX_LENGTH:
        problems.append(f"cron: longer than {_MAX_LENGTH} characters")
    elif not (
        (len(fields) == 1 and fields[0] in ALIASES)
        or (len(fields) in (5, 6) and croniter.is_valid(expression, second_at_beginning=True))
    ):
        problems.append(
            f"cron: {expression!r} is not a cron expression: give five fields (minute hour "
            "day-of-month month day-of-week, e.g. '*/15 * * * *'), six with the seconds "
            f"first ('*/10 * * * * *'), or one of {', '.join(sorted(ALIASES))}"
        )
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(
            f"timezone: {timezone!r} is not a time zone name; use an IANA name such as 'UTC' "
            "or 'Europe/Paris'"
        )
        return problems
    if not problems:
        try:
            Cron(expression, zone).next_after(datetime.now(UTC))
        except InvalidRequest as exc:
            problems.extend(exc.problems)
    return problems


@dataclass(frozen=True)
class Cron:
    """A checked expression in its zone (``Cron.of`` checks; the scheduler reads stored ones)."""

    expression: str
    zone: ZoneInfo

    @classmethod
    def of(cls, expression: str, timezone: str) -> Cron:
        """``InvalidRequest`` listing what is wrong."""
        problems = cron_problems(expression, timezone)
        if problems:
            raise InvalidRequest("; ".join(problems), problems)
        return cls(expression, ZoneInfo(timezone))

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``."""
        try:
            it = croniter(self.expression, moment.astimezone(self.zone), second_at_beginning=True)
            return it.get_next(datetime).astimezone(UTC)
        except (CroniterBadCronError, CroniterBadDateError, ValueError) as exc:
            problem = f"cron: {self.expression!r} never fires ({exc})"
            raise InvalidRequest(problem, [problem]) from None

    def next_times(self, moment: datetime, count: int) -> list[datetime]:
        """The ``count`` ticks after ``moment``."""
        times: list[datetime] = []
        for _ in range(count):
            moment = self.next_after(moment)
            times.append(moment)
        return times

    def due(self, first: datetime, now: datetime, most: int) -> tuple[list[datetime], datetime]:
        """The ticks from ``first`` (a tick) up to ``now``, at most ``most`` of them, and the
        tick after the last one listed (where the next look starts)."""
        ticks: list[datetime] = []
        tick = first
        while tick <= now and len(ticks) < most:
            ticks.append(tick)
            tick = self.next_after(tick)
        return ticks, tick

    def to_fire(
        self, first: datetime, now: datetime, catchup: CatchUp, grace_s: float, most: int
    ) -> tuple[list[datetime], datetime]:
        """The ticks to make runs for, of those due from ``first`` (the schedule's next tick)
        until ``now``, and the next tick to look at. A tick more than ``grace_s`` old is
        missed: ``SKIP`` makes no run for it, ``LATEST`` one run for the latest tick due,
        ``ALL`` a run for each (``most`` a look; the next look goes on from there)."""
        if first > now:
            return [], first
        if catchup is CatchUp.ALL:
            return self.due(first, now, most)
        if catchup is CatchUp.LATEST:
            ticks, after = self.due(self._last_before(first, now), now, most)
            return ticks[-1:], after
        late = now - timedelta(seconds=grace_s)
        start = first if first >= late else self.next_after(late - timedelta(microseconds=1))
        return self.due(start, now, most)

    def _last_before(self, first: datetime, now: datetime) -> datetime:
        """The latest tick no later than ``now`` (``first`` is one)."""
        it = croniter(
            self.expression,
            (now + timedelta(microseconds=1)).astimezone(self.zone),
            second_at_beginning=True,
        )
        last: datetime = it.get_prev(datetime).astimezone(UTC)
        return max(first, last)
