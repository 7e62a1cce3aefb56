"""``/api/stats``: counts by status, throughput and latency over the last minutes (Postgres).

The dashboard's overview polls this; the figures are the database's (``repository.stats``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from orchestrator.controller.api.deps import SessionDep
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db.repository import stats
from orchestrator.schemas import (
    LatencyPublic,
    MinutePublic,
    StatsPublic,
    TaskTimingPublic,
)

router = APIRouter(prefix="/stats", tags=["stats"], route_class=StrictJsonRoute)


@router.get("")
def get_stats(
    session: SessionDep,
    window_minutes: Annotated[
        int, Query(ge=1, le=24 * 60, description="How many minutes, the current one included.")
    ] = 15,
) -> StatsPublic:
    """Workflows by status (all time) and, per minute of the window, completions, failures,
    starts and latency percentiles; plus the window's latency and task timing summary."""
    now, since = stats.window(session, window_minutes)
    return StatsPublic(
        counts={status: n for status, n in stats.status_counts(session).items()},
        window_minutes=window_minutes,
        now=now,
        minutes=[
            MinutePublic.model_validate(m, from_attributes=True)
            for m in stats.minutes(session, since, window_minutes)
        ],
        latency=LatencyPublic.model_validate(stats.latency(session, since), from_attributes=True),
        tasks=TaskTimingPublic.model_validate(
            stats.task_timing(session, since), from_attributes=True
        ),
    )
