"""``cdiflow worker`` / ``python -m orchestrator.worker``: run one worker in the foreground.

The process started is the worker's keeper (``keeper``): it imports the task code once and
runs the worker itself in a child process, which it starts afresh at once when a task would
not stop. Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot start (the message says why),
4 after losing the CDI minion (restart it).
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
from orchestrator.listen import LOOPBACK, BindAddress
from orchestrator.logs import log_format_option, setup_logging
from orchestrator.objectstore import ObjectStore
from orchestrator.settings import Settings, load_settings
from orchestrator.worker.held import DEFAULT_HOLD_BYTES, HeldImages
from orchestrator.worker.input_cache_host import HostInputCache
from orchestrator.worker.keeper import keep
from orchestrator.worker.metrics import WorkerMetrics
from orchestrator.worker.plane_parts import LazyStore, PlaneParts
from orchestrator.worker.planes import build_planes
from orchestrator.worker.streams import StreamHub
from orchestrator.worker.worker import Worker
from workflows.loader import TaskCatalog, load_deployed, with_sources
from workflows.memory import tune_for_images
from workflows.sources import TaskSources

__all__ = ["load_tasks", "run_worker", "task_sources", "worker_command"]

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
    "--tasks",
    "extra_sources",
    multiple=True,
    type=click.Path(),  # a folder, a .py file, or a module name (not a path at all)
    metavar="FOLDER|FILE.py|MODULE",
    help="Task code beside CDIFLOW_TASK_PATHS and CDIFLOW_TASK_PACKAGES, repeatable: a folder "
    "(its modules), a .py file or an installed module. The worker imports all of it when it "
    "starts and announces what loaded; the bundled tasks are always loaded.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    envvar="CDIFLOW_WORKER_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on this port (/metrics); 0: none.",
)
@click.option(
    "--metrics-host",
    type=BindAddress(),
    default=LOOPBACK,
    show_default=True,
    envvar="CDIFLOW_WORKER_METRICS_HOST",
    show_envvar=True,
    help="Address the metrics listen on: this machine only unless another is configured "
    "(0.0.0.0 for a scraper elsewhere, e.g. in a container); they need no key.",
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
@log_format_option
@click.pass_context
def worker_command(
    ctx: click.Context,
    worker_id: str,
    concurrency: int,
    access_timeout: float,
    hold_mib: int,
    extra_sources: tuple[str, ...],
    metrics_port: int,
    metrics_host: str,
    cdi_url: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run a worker: pop task instructions from Redis and run them on CDI (or S3) data."""
    setup_logging(
        log_level,
        log_format,
        process=worker_id,
        text=f"%(asctime)s %(levelname)s {worker_id} %(name)s [%(threadName)s] %(message)s",
    )
    tune_for_images()  # tasks churn through large image buffers
    try:
        code = run_worker(
            worker_id,
            concurrency=concurrency,
            access_timeout_s=access_timeout,
            hold_bytes=hold_mib * 2**20,
            cdi_url=cdi_url,
            extra_sources=extra_sources,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
    except OrchestratorError as exc:  # a setting the keeper cannot use (the body says its own)
        raise click.ClickException(str(exc)) from exc
    ctx.exit(code)


def task_sources(settings: Settings, extra: tuple[str, ...] = ()) -> TaskSources:
    """Where tasks may come from: the settings' packages and folders, and ``extra`` (the
    ``--tasks`` sources); ``ConfigError`` for a source that names nothing."""
    try:
        return with_sources(settings.task_sources(), extra)
    except ValueError as exc:
        raise ConfigError(f"--tasks: {exc}") from exc


def load_tasks(sources: TaskSources) -> TaskCatalog:
    """Import the task code of ``sources`` (``workflows.loader``) and log what loaded. A module
    that fails to import is logged and announced, not fatal: the worker runs what did load."""
    catalog = load_deployed(sources)
    for module, tasks in sorted(catalog.modules.items()):
        log.info("loaded task module %s: %s", module, ", ".join(sorted(tasks)) or "no @task")
    for module, error in sorted(catalog.errors.items()):
        log.error("could not load task module %s: %s", module, error)
    return catalog


def run_worker(
    worker_id: str,
    *,
    concurrency: int = 1,
    access_timeout_s: float = 5.0,
    hold_bytes: int = DEFAULT_HOLD_BYTES,
    cdi_url: str | None = None,
    settings: Settings | None = None,
    extra_sources: tuple[str, ...] = (),
    metrics_port: int = 0,
    metrics_host: str = LOOPBACK,
) -> int:
    """Load the task code, then keep the worker's body running (``keeper``) until SIGTERM or
    SIGINT, or a failure it cannot recover from; the exit code."""
    settings = settings or load_settings()
    redis_url = settings.redis_url
    if redis_url is None:
        raise ConfigError(
            "REDIS_URL is not set: a worker joins a running stack; set it to the stack's Redis "
            "(redis://host:6379/0)"
        )
    sources = task_sources(settings, extra_sources)
    sources.activate()  # deployed task folders import like installed packages
    log.info("tasks may come from %s", sources.describe())
    catalog = load_tasks(sources)  # once, here: every body the keeper forks has it loaded

    def body() -> int:
        try:
            return _run_body(
                worker_id, redis_url, settings, sources, catalog,
                concurrency=concurrency, access_timeout_s=access_timeout_s,
                hold_bytes=hold_bytes, cdi_url=cdi_url, metrics_port=metrics_port,
                metrics_host=metrics_host,
            )  # fmt: skip
        except (OrchestratorError, cdi.CDIError) as exc:
            click.ClickException(str(exc)).show()
        except redis.RedisError as exc:  # Redis went away between the ping and the first beat
            click.ClickException(f"Redis (REDIS_URL) failed: {exc}").show()
        return 1

    return keep(body, worker_id)


def _run_body(
    worker_id: str,
    redis_url: str,
    settings: Settings,
    sources: TaskSources,
    catalog: TaskCatalog,
    *,
    concurrency: int,
    access_timeout_s: float,
    hold_bytes: int,
    cdi_url: str | None,
    metrics_port: int,
    metrics_host: str,
) -> int:
    """The worker itself, in the keeper's child: connect, run until SIGTERM/SIGINT (or a task
    that would not stop), clean up; the exit code."""
    # A worker restarted with its stack's Redis or minion waits for them (the settings' wait)
    # rather than exiting at once into the supervisor's growing back-off.
    redis_client = _connect_redis(redis_url, settings.worker_connect_wait_s)
    try:
        client = _connect_cdi(cdi_url, worker_id, settings.worker_connect_wait_s)
        cache = (
            HostInputCache(cdi_url, worker_id, settings.input_cache_mib << 20)
            if settings.input_cache
            else None
        )
        try:
            parts = PlaneParts(
                client,
                HeldImages(hold_bytes),
                # One S3 client for every plane, reading and writing only the policy's places.
                LazyStore(lambda: ObjectStore(settings, enforce=True)),
                access_timeout_s,
                max_input_bytes=settings.max_input_bytes,
                max_pixels=settings.max_pixels,
                input_cache=cache,
            )
            worker = Worker(
                worker_id,
                redis_client=redis_client,
                planes=build_planes(parts),
                host=client.host,
                held=parts.held.usage,
                input_cache=(
                    (lambda: parts.input_stats.figures(cache)) if cache is not None else None
                ),
                concurrency=concurrency,
                sources=sources,
                tasks=catalog,
                streams=StreamHub(client, redis_client),
            )
            if metrics_port:
                worker.metrics = WorkerMetrics(
                    running=worker.running,
                    held=parts.held.usage,
                    inputs=parts.input_stats,
                    cached=cache.held if cache is not None else None,
                )
                try:
                    worker.metrics.serve(metrics_port, metrics_host)
                except OSError as exc:
                    raise ConfigError(
                        f"--metrics-port {metrics_port} on {metrics_host}: cannot listen there "
                        f"({exc}); choose another port or address"
                    ) from exc
                log.info("metrics on %s:%d/metrics", metrics_host, metrics_port)
            with _stop_on_signals(worker):
                return worker.run()
        finally:
            if cache is not None:
                cache.close()  # the host's cached inputs, if we held them, go with us
            # Objects still ours (kept for affinity) go back to their recovery containers.
            client.close()
    finally:
        redis_client.close()


def _connect_redis(url: str, wait_s: float) -> redis.Redis:
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


def _connect_cdi(url: str | None, worker_id: str, wait_s: float) -> cdi.Client:
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
