"""Embedded Postgres, Redis and S3 for ``cdiflow up`` and the tests, or the configured ones.

    services = start_services()          # DATABASE_URL etc. from the environment, else embedded
    try:
        ...                              # services.database_url, .redis_url, .s3_endpoint_url
    finally:
        services.stop()

Each embedded service is a child process bound to 127.0.0.1 with its data and log under the data
folder (``CDIFLOW_DATA_DIR``, default ``./.data``): ``postgres/`` (persists), ``redis/``,
``s3/`` and ``logs/<service>.log``.
"""

from orchestrator.services.managed import HOST, ManagedService
from orchestrator.services.postgres import PostgresService, check_postgres
from orchestrator.services.redis_server import RedisService, check_redis
from orchestrator.services.s3 import S3Service, check_s3
from orchestrator.services.stack_services import RunningServices, resolve_services, start_services

__all__ = [
    "HOST",
    "ManagedService",
    "PostgresService",
    "RedisService",
    "RunningServices",
    "S3Service",
    "check_postgres",
    "check_redis",
    "check_s3",
    "resolve_services",
    "start_services",
]
