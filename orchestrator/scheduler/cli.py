"""``cdiflow scheduler`` / ``python -m orchestrator.scheduler``."""

from __future__ import annotations

import logging
import os
import signal
import socket

import click

import cdi
from orchestrator.db.engine import make_engine
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.loop import Scheduler, connect_redis
from orchestrator.settings import load_settings

__all__ = ["scheduler_command"]


@click.command("scheduler")
@click.option(
    "--id",
    "scheduler_id",
    default=lambda: f"scheduler-{socket.gethostname()}",
    help="Scheduler id; also its CDI container id. Several may run at once.",
)
@click.option("--log-level", default="INFO", show_default=True)
def scheduler_command(scheduler_id: str, log_level: str) -> None:
    """Run a scheduler: claim workflows, place tasks on workers, move CDI ownership."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    settings = load_settings()
    if not settings.database_url or not settings.redis_url:
        raise click.UsageError("DATABASE_URL and REDIS_URL must be set (`cdiflow up` sets them)")
    engine = make_engine(settings.database_url, synchronous_commit=False)
    client = cdi.connect(os.environ.get("CDI_URL"), scheduler_id)
    scheduler = Scheduler(
        scheduler_id,
        settings,
        SchedulerStore(engine),
        connect_redis(settings.redis_url),
        client,
        ObjectStore(settings),
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: scheduler.stop())
    try:
        scheduler.run_forever()
    finally:
        client.close()
        engine.dispose()
