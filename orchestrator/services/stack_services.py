"""The stack's three services: configured ones checked, missing ones started, in parallel."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from orchestrator.errors import ServiceError
from orchestrator.services.credentials import ServiceCredentials
from orchestrator.services.managed import ManagedService
from orchestrator.services.postgres import PostgresService, check_postgres
from orchestrator.services.redis_server import RedisService, check_redis
from orchestrator.services.s3 import S3Service, check_s3
from orchestrator.settings import Settings, load_settings

__all__ = ["RunningServices", "resolve_services", "start_services"]

log = logging.getLogger(__name__)

# What one resolver job yields: the URL to use, and the service it started (None if configured).
_Resolved = tuple[str, ManagedService | None]


@dataclass
class RunningServices:
    """Where the stack's services are, and the embedded ones to stop when done."""

    database_url: str = field(repr=False)  # may hold a password
    redis_url: str = field(repr=False)
    s3_endpoint_url: str
    s3_bucket: str
    aws_region: str
    aws_access_key_id: str | None
    aws_secret_access_key: str | None = field(repr=False)
    data_dir: Path
    embedded: tuple[ManagedService, ...] = ()  # started by us; stop() ends them
    admin_database_url: str | None = field(default=None, repr=False)
    """The embedded Postgres's superuser (creating databases); None for a configured one."""

    def stop(self) -> None:
        """Stop the embedded services (configured ones are left alone); idempotent."""
        for service in reversed(self.embedded):
            try:
                service.stop()
            except Exception:  # stop the others even if one misbehaves
                log.exception("could not stop %s", service.name)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_services(data_dir: Path | str | None = None) -> RunningServices:
    """What ``cdiflow up`` calls: settings from the environment, ``data_dir`` overriding."""
    overrides = {} if data_dir is None else {"data_dir": Path(data_dir)}
    return resolve_services(load_settings(**overrides))


def resolve_services(
    settings: Settings, *, check_timeout: float = 5.0, durable: bool = True
) -> RunningServices:
    """Use each configured URL (after checking it answers), start the others embedded.

    Raises ``ServiceError`` after stopping whatever it started when any service fails.
    ``durable=False`` trades the last commits on a crash for speed (tests); see PostgresService.
    """
    began = time.monotonic()
    data_dir = settings.data_dir
    secret = settings.aws_secret_access_key
    secret_key = secret.get_secret_value() if secret is not None else None
    embedding = not (settings.database_url and settings.redis_url and settings.s3_endpoint_url)
    creds = ServiceCredentials.load_or_create(data_dir) if embedding else None

    def database() -> _Resolved:
        if settings.database_url:
            check_postgres(settings.database_url, check_timeout)
            return settings.database_url, None
        service = PostgresService(data_dir, durable=durable, credentials=creds).start()
        return service.url, service

    def redis() -> _Resolved:
        if settings.redis_url:
            check_redis(settings.redis_url, check_timeout)
            return settings.redis_url, None
        service = RedisService(data_dir, credentials=creds).start()
        return service.url, service

    def object_store() -> _Resolved:
        if settings.s3_endpoint_url:
            check_s3(
                settings.s3_endpoint_url,
                settings.s3_bucket,
                region=settings.aws_region,
                access_key_id=settings.aws_access_key_id,
                secret_access_key=secret_key,
                timeout=check_timeout,
            )
            return settings.s3_endpoint_url, None
        service = S3Service(data_dir, bucket=settings.s3_bucket, credentials=creds).start()
        return service.url, service

    results = _run_all({"postgres": database, "redis": redis, "s3": object_store})
    embedded = tuple(service for _, service in results.values() if service is not None)
    s3_service = results["s3"][1]
    pg_service = results["postgres"][1]
    log.info(
        "services ready in %.2fs (embedded: %s)",
        time.monotonic() - began, ", ".join(s.name for s in embedded) or "none",
    )  # fmt: skip
    return RunningServices(
        database_url=results["postgres"][0],
        redis_url=results["redis"][0],
        s3_endpoint_url=results["s3"][0],
        s3_bucket=settings.s3_bucket,
        aws_region=settings.aws_region,
        # The embedded endpoint checks its own keys; a configured one gets the keys set, or
        # boto3's default chain when none are.
        aws_access_key_id=(
            s3_service.access_key_id
            if isinstance(s3_service, S3Service)
            else settings.aws_access_key_id
        ),
        aws_secret_access_key=(
            s3_service.secret_access_key if isinstance(s3_service, S3Service) else secret_key
        ),
        data_dir=data_dir,
        embedded=embedded,
        admin_database_url=(
            pg_service.admin_url if isinstance(pg_service, PostgresService) else None
        ),
    )


def _run_all(jobs: dict[str, Callable[[], _Resolved]]) -> dict[str, _Resolved]:
    """Run the jobs in parallel; on any failure stop what the others started, then raise."""
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="cdiflow-svc") as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        try:
            wait(futures.values())
        except BaseException:  # Ctrl-C: let the starts finish so we can stop them
            pool.shutdown(wait=True)
            _stop_started(futures.values())
            raise
    errors = [exc for f in futures.values() if (exc := f.exception()) is not None]
    if not errors:
        return {name: f.result() for name, f in futures.items()}
    _stop_started(futures.values())
    bugs = [e for e in errors if not isinstance(e, ServiceError)]
    if bugs or len(errors) == 1:
        raise (bugs or errors)[0]
    names = ", ".join(e.service for e in errors if isinstance(e, ServiceError))
    raise ServiceError("\n\n".join(str(e) for e in errors), service=names)


def _stop_started(futures: Iterable[Future[_Resolved]]) -> None:
    for future in futures:
        if future.done() and future.exception() is None:
            service = future.result()[1]
            if service is not None:
                service.stop()
