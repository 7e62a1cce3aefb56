"""Postgres, Redis and S3 for one benchmark run, shared by every system it starts.

Always embedded (a user's DATABASE_URL is never touched: the benchmark creates databases).
Each cdiflow system gets a fresh database and its own Redis logical database, so no system
inherits another's rows, queues or task-time estimates. With ``link="regional"`` the systems
reach S3 through a ``LinkProxy`` (``cdi.link_emulator``: ~10 ms a round trip, ~100 MB/s a
connection); the benchmark's own uploads go straight to the endpoint.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import uuid
from pathlib import Path
from typing import Any, Final, Self
from urllib.parse import urlsplit, urlunsplit

import boto3
import redis
from botocore.config import Config

from cdi.link_emulator import Link, LinkProxy
from loadtest import harness_env
from orchestrator.services import RunningServices, resolve_services
from orchestrator.services.postgres import create_database
from orchestrator.settings import load_settings
from orchestrator.started import StartStop

__all__ = ["LINKS", "BenchServices", "clear_prefixes", "peer_env", "s3_client"]

LINKS: Final = ("loopback", "regional")
REGIONAL: Final = Link(mbit=800, rtt_ms=10)  # an S3 bucket in the same region
_REDIS_DBS: Final = 16


def s3_client(services: RunningServices) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=services.s3_endpoint_url,
        region_name=services.aws_region,
        aws_access_key_id=services.aws_access_key_id,
        aws_secret_access_key=services.aws_secret_access_key,
        config=Config(max_pool_connections=16),
    )


def clear_prefixes(services: RunningServices, prefixes: tuple[str, ...]) -> int:
    """Delete every object under ``prefixes`` (results pile up in the embedded S3's data folder)."""
    s3, deleted = s3_client(services), 0
    for prefix in prefixes:
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=services.s3_bucket, Prefix=prefix
        )
        for page in pages:
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=services.s3_bucket, Delete={"Objects": keys})
                deleted += len(keys)
    return deleted


class BenchServices(StartStop):
    """``with BenchServices(folder, link) as services:`` start, share, stop."""

    def __init__(
        self,
        folder: Path,
        link: str = "loopback",
        spec: Link = REGIONAL,
        *,
        given: RunningServices | None = None,
        first_redis_db: int = 1,
    ) -> None:
        """``given``: running services to use (and leave running) instead of starting them;
        systems then take Redis logical databases from ``first_redis_db`` up."""
        if link not in LINKS:
            raise ValueError(f"unknown link {link!r}; choose from {LINKS}")
        self.folder = folder
        self.link = link
        self._spec = spec
        self._running: RunningServices | None = None
        self._proxy: LinkProxy | None = None
        self._s3_url = ""
        self._given = given
        self._first_redis_db = first_redis_db
        self._redis_db = itertools.count()  # databases handed out so far

    @property
    def running(self) -> RunningServices:
        """The services as started (S3 reached directly, on loopback)."""
        if self._running is None:
            raise RuntimeError("BenchServices is not started")
        return self._running

    @property
    def s3_url(self) -> str:
        """The S3 endpoint the systems under test use (the proxy's on a regional link)."""
        return self._s3_url

    def start(self) -> Self:
        if self._given is not None:
            self._running = self._given
            return self._with_link()
        settings = load_settings(
            data_dir=self.folder.absolute(),
            database_url=None,
            redis_url=None,
            s3_endpoint_url=None,
            s3_bucket="cdiflow",
            aws_access_key_id=None,
            aws_secret_access_key=None,
            aws_region="us-east-1",
        )
        self._running = resolve_services(settings)
        return self._with_link()

    def _with_link(self) -> Self:
        assert self._running is not None
        try:
            self._s3_url = self._running.s3_endpoint_url
            if self.link == "regional":
                self._proxy = LinkProxy(
                    self._running.s3_endpoint_url, self._spec, self.folder / "s3-link"
                )
                self._s3_url = self._proxy.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy = None
        if self._running is not None and self._given is None:
            self._running.stop()
        self._running = None

    def redis_url(self) -> str:
        """A Redis logical database no running system of this run uses. Systems run one after
        another and a run may start more of them than Redis has databases (ten systems,
        three rounds): past the last database the numbers start again from the first, each
        emptied before it is handed out again."""
        count = next(self._redis_db)
        span = _REDIS_DBS - self._first_redis_db
        if span < 1:
            raise ValueError(f"Redis has databases 0-{_REDIS_DBS - 1}; the first to use "
                             f"was {self._first_redis_db}")  # fmt: skip
        index = self._first_redis_db + count % span
        url = urlunsplit(urlsplit(self.running.redis_url)._replace(path=f"/{index}"))
        if count >= span:
            with redis.Redis.from_url(url) as client:
                client.flushdb()
        return url

    def create_database(self, label: str) -> str:
        """An empty database on the run's Postgres; returns its URL."""
        name = f"bench_{label.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
        running = self.running
        return create_database(running.database_url, name, admin_url=running.admin_database_url)

    def for_system(self, label: str) -> RunningServices:
        """Services for one cdiflow stack: its own database and Redis db, the run's S3 link.

        ``embedded=()``: the stack must not stop what this run shares.
        """
        return dataclasses.replace(
            self.running,
            database_url=self.create_database(label),
            redis_url=self.redis_url(),
            s3_endpoint_url=self.s3_url,
            embedded=(),
        )


def peer_env(services: BenchServices) -> dict[str, str]:
    """This environment plus S3 as the systems under test reach it (through the regional
    link's proxy if there is one), for ``orchestrator.settings.load_settings``, and the
    harness on ``PYTHONPATH`` (``loadtest.harness_env``)."""
    running = services.running
    env = harness_env(os.environ) | dict(
        S3_ENDPOINT_URL=services.s3_url,
        S3_BUCKET=running.s3_bucket,
        AWS_REGION=running.aws_region,
        PYTHONUNBUFFERED="1",
    )
    env["AWS_ACCESS_KEY_ID"] = running.aws_access_key_id or "testing"
    env["AWS_SECRET_ACCESS_KEY"] = running.aws_secret_access_key or "testing"
    return env
