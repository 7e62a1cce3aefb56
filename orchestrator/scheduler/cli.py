"""``cdiflow scheduler`` / ``python -m orchestrator.scheduler``."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

import click

import cdi
from orchestrator.db.engine import make_engine, make_session_factory
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.journal import Journal
from orchestrator.scheduler.minion_link import MinionLink
from orchestrator.scheduler.reconciler import Reconciler
from orchestrator.scheduler.scheduler import Scheduler, connect_redis
from orchestrator.settings import load_settings
from workflows.memory import tune_for_images

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
    tune_for_images()  # it decodes every input and encodes every result
    settings = load_settings()
    if not settings.database_url or not settings.redis_url:
        raise click.UsageError("DATABASE_URL and REDIS_URL must be set (`cdiflow up` sets them)")
    engine = make_engine(settings.database_url, synchronous_commit=False)
    client = _connect_minion(os.environ.get("CDI_URL"), scheduler_id)
    scheduler = Scheduler(
        scheduler_id,
        settings,
        make_session_factory(engine),
        connect_redis(settings.redis_url),
        client,
        ObjectStore(settings),
        journal=Journal(engine),
        reconciler=Reconciler(engine, scheduler_id),
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: scheduler.stop())
    try:
        scheduler.run_forever()
    finally:
        client.close()
        engine.dispose()


def _connect_minion(url: str | None, scheduler_id: str, wait_s: float = 30.0) -> MinionLink:
    """The minion link, waiting up to ``wait_s`` for a minion that is (re)starting."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return MinionLink(url, scheduler_id)
        except cdi.MinionUnavailable as exc:
            if time.monotonic() > deadline:
                raise click.ClickException(f"{exc}; start this host's CDI minion") from exc
            time.sleep(0.2)
