"""``cdiflow scheduler`` / ``python -m orchestrator.scheduler``."""

from __future__ import annotations

import os
import signal
import socket
import time

import click

import cdi
from cdi.controller.client import ControllerClient
from orchestrator.db.engine import make_engine
from orchestrator.db.scheduler_liveness import SchedulerLiveness
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.errors import ConfigError
from orchestrator.logs import log_format_option, setup_logging
from orchestrator.notify.deliverer import Deliverer
from orchestrator.objectstore import ObjectStore
from orchestrator.scheduler.loop import Scheduler, connect_redis
from orchestrator.scheduler.minion_link import MinionLink
from orchestrator.scheduler.object_directory import ObjectDirectory, controller_from_env
from orchestrator.settings import load_settings

__all__ = ["scheduler_command"]

# A scheduler restarted with its stack's minion (which restarts too) waits this long for it,
# rather than exiting at once into the supervisor's growing back-off.
MINION_WAIT_S = 30.0


@click.command("scheduler")
@click.option(
    "--id",
    "scheduler_id",
    default=lambda: f"scheduler-{socket.gethostname()}",
    help="Scheduler id; also its CDI container id. Several may run at once.",
)
@click.option("--log-level", default="INFO", show_default=True)
@log_format_option
def scheduler_command(scheduler_id: str, log_level: str, log_format: str) -> None:
    """Run a scheduler: claim workflows, place tasks on workers, move CDI ownership, fire
    schedules and send webhook deliveries."""
    setup_logging(
        log_level,
        log_format,
        process=scheduler_id,
        text="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    settings = load_settings()
    if not settings.database_url or not settings.redis_url:
        raise click.UsageError("DATABASE_URL and REDIS_URL must be set (`cdiflow up` sets them)")
    engine = make_engine(settings.database_url)
    try:
        controller = controller_from_env()  # every host's objects, with a reader token
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    link = _connect_minion(os.environ.get("CDI_URL"), scheduler_id, controller)
    directory = ObjectDirectory(link, controller)
    scheduler = Scheduler(
        scheduler_id,
        settings,
        SchedulerStore(engine),
        connect_redis(settings.redis_url),
        link,
        ObjectStore(settings),
        liveness=SchedulerLiveness(engine, scheduler_id),
        directory=directory,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: scheduler.stop())
    deliverer = Deliverer(engine)  # webhooks: a thread of its own, beside the loop
    deliverer.start()
    try:
        scheduler.run_forever()
    finally:
        deliverer.stop()
        directory.close()
        link.close()
        engine.dispose()


def _connect_minion(
    url: str | None, scheduler_id: str, directory: ControllerClient | None
) -> MinionLink:
    """The minion link (with the CDI controller's directory when the scheduler was given a
    reader's token for it: ``cdiflow up`` gives it one), waiting up to ``MINION_WAIT_S`` for a
    minion that is (re)starting."""
    deadline = time.monotonic() + MINION_WAIT_S
    while True:
        try:
            return MinionLink(url, scheduler_id, directory=directory)
        except (cdi.MinionUnavailable, cdi.ContainerExists) as exc:
            # ContainerExists: the minion has not yet noticed our previous process is gone.
            if time.monotonic() > deadline:
                raise click.ClickException(f"{exc}; start this host's CDI minion") from exc
            time.sleep(0.2)
