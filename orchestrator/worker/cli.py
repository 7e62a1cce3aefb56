"""``cdiflow worker`` / ``python -m orchestrator.worker``: run one worker in the foreground.

Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot start (the message says why),
3 after a task overran its timeout and 4 after losing the CDI minion (restart it in both cases).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import click
import redis

import cdi
from orchestrator.errors import ConfigError, OrchestratorError, ServiceError
from orchestrator.objectstore import ObjectStore
from orchestrator.settings import Settings, load_settings
from orchestrator.worker.cdi_plane import CdiPlane
from orchestrator.worker.held import DEFAULT_HOLD_BYTES, HeldImages
from orchestrator.worker.store_plane import StorePlane
from orchestrator.worker.worker import Worker
from workflows.memory import tune_for_images

__all__ = ["run_worker", "worker_command"]

log = logging.getLogger(__name__)


@click.command("worker")
@click.option(
    "--id",
    "worker_id",
    required=True,
    envvar="CDIFLOW_WORKER_ID",
    show_envvar=True,
    help="Worker id: its CDI container id and the name of its Redis queue.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Instructions run at once (threads sharing one CDI connection).",
)
@click.option(
    "--access-timeout",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds to wait for an instruction's CDI object to become this worker's.",
)
@click.option(
    "--hold-memory",
    "hold_mib",
    type=click.IntRange(min=0),
    default=DEFAULT_HOLD_BYTES // 2**20,
    show_default=True,
    envvar="CDIFLOW_WORKER_HOLD_MIB",
    show_envvar=True,
    help="MiB of images held between a workflow's tasks under affinity instead of being "
    "written to a CDI object; 0 writes every new image.",
)
@click.option(
    "--cdi-url",
    envvar="CDI_URL",
    show_envvar=True,
    default=None,
    help="unix:///path/to/minion.sock of this host's CDI minion.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
@click.pass_context
def worker_command(
    ctx: click.Context,
    worker_id: str,
    concurrency: int,
    access_timeout: float,
    hold_mib: int,
    cdi_url: str | None,
    log_level: str,
) -> None:
    """Run a worker: pop task instructions from Redis and run them on CDI (or S3) data."""
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s %(levelname)s {worker_id} %(name)s [%(threadName)s] %(message)s",
    )
    tune_for_images()  # tasks churn through large image buffers
    try:
        code = run_worker(
            worker_id,
            concurrency=concurrency,
            access_timeout_s=access_timeout,
            hold_bytes=hold_mib * 2**20,
            cdi_url=cdi_url,
        )
    except (OrchestratorError, cdi.CDIError) as exc:
        raise click.ClickException(str(exc)) from exc
    except redis.RedisError as exc:  # Redis went away between the ping and the first beat
        raise click.ClickException(f"Redis (REDIS_URL) failed: {exc}") from exc
    ctx.exit(code)


def run_worker(
    worker_id: str,
    *,
    concurrency: int = 1,
    access_timeout_s: float = 5.0,
    hold_bytes: int = DEFAULT_HOLD_BYTES,
    cdi_url: str | None = None,
    settings: Settings | None = None,
) -> int:
    """Connect, run until SIGTERM/SIGINT (or a fatal task), clean up; return the exit code."""
    settings = settings or load_settings()
    if settings.redis_url is None:
        raise ConfigError(
            "REDIS_URL is not set: a worker joins a running stack; set it to the stack's Redis "
            "(redis://host:6379/0)"
        )
    sources = settings.task_sources()
    sources.activate()  # deployed task folders import like installed packages
    log.info("tasks may come from %s", sources.describe())
    redis_client = _connect_redis(settings.redis_url)
    try:
        client = _connect_cdi(cdi_url, worker_id)
        try:
            store_plane = StorePlane(
                lambda: ObjectStore(settings, enforce=True),  # only the policy's locations
                max_input_bytes=settings.max_input_bytes,
                max_pixels=settings.max_pixels,
            )
            worker = Worker(
                worker_id,
                redis_client=redis_client,
                cdi_plane=CdiPlane(
                    client,
                    access_timeout_s,
                    HeldImages(hold_bytes),
                    store=lambda: store_plane.store,  # one S3 client for both planes
                    max_input_bytes=settings.max_input_bytes,
                    max_pixels=settings.max_pixels,
                ),
                store_plane=store_plane,
                concurrency=concurrency,
                sources=sources,
            )
            with _stop_on_signals(worker):
                return worker.run()
        finally:
            # Objects still ours (kept for affinity) go back to their recovery containers.
            client.close()
    finally:
        redis_client.close()


# A worker restarted with its stack's Redis or minion (both restart too) waits this long for
# them, rather than exiting at once into the supervisor's growing back-off.
CONNECT_WAIT_S = 30.0


def _connect_redis(url: str, wait_s: float = CONNECT_WAIT_S) -> redis.Redis:
    client = redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.ping()
            return client
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            problem: redis.RedisError = exc
        except redis.RedisError as exc:
            problem = exc
        client.close()
        raise ServiceError(
            f"cannot reach Redis at REDIS_URL: {problem}; check the stack is up and the URL "
            "(and its password) is right",
            service="redis",
        ) from problem


def _connect_cdi(url: str | None, worker_id: str, wait_s: float = CONNECT_WAIT_S) -> cdi.Client:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return cdi.connect(url, worker_id)
        except (cdi.MinionUnavailable, cdi.ContainerExists):
            # Restarting: the minion may not answer yet, or not yet have noticed that our
            # previous process (same id) is gone.
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
    try:
        return cdi.connect(url, worker_id)
    except cdi.MinionUnavailable as exc:
        raise ServiceError(
            f"{exc}. A worker needs its host's CDI minion: start it, or set CDI_URL "
            "(unix:///path/to/minion.sock) to the socket it listens on",
            service="cdi",
        ) from exc
    except cdi.ContainerExists as exc:
        raise ConfigError(f"{exc}; give every worker on this host its own --id") from exc
    except (cdi.ConfigError, cdi.InvalidArgument) as exc:
        raise ConfigError(
            f"cannot register worker {worker_id!r} with the CDI minion: {exc}"
        ) from exc


@contextmanager
def _stop_on_signals(worker: Worker) -> Iterator[None]:
    """SIGTERM/SIGINT: finish the running instructions, then exit 0."""

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if worker.stopping:
            log.warning("%s: already stopping, waiting for the running instructions", name)
        else:
            log.info("%s: finishing the running instructions, then exiting", name)
        worker.request_stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
