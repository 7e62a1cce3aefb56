"""Orchestrator settings, read from the environment.

Nothing needs setting on a developer machine: with no ``DATABASE_URL``, ``REDIS_URL`` or
``S3_ENDPOINT_URL``, ``cdiflow up`` starts embedded services with their data under
``CDIFLOW_DATA_DIR`` (default ``./.data``). Production sets the URLs to managed services.

Use ``load_settings()`` rather than ``Settings()`` in entry points: it turns pydantic's
validation error into ``ConfigError`` naming the environment variable to fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from orchestrator.errors import ConfigError

__all__ = ["Settings", "load_settings"]

# Schemes SQLAlchemy would map to psycopg2 (not installed); we rewrite them to psycopg 3.
_PLAIN_POSTGRES_SCHEMES = {"postgres", "postgresql"}
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class Settings(BaseSettings):
    """Where the orchestrator keeps its state. Field names are the environment variables."""

    model_config = SettingsConfigDict(
        env_ignore_empty=True,  # DATABASE_URL= (empty) means "not set", not "invalid"
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,  # URLs and keys may hold secrets
        validate_by_name=True,
        validate_by_alias=True,
    )

    data_dir: Path = Field(
        default=Path(".data"),
        validation_alias="CDIFLOW_DATA_DIR",
        description="Folder holding the embedded services' data and logs (made absolute).",
    )
    database_url: str | None = Field(
        default=None,
        repr=False,
        description="SQLAlchemy URL of an existing PostgreSQL server "
        "(postgresql+psycopg://user:pass@host:5432/db); unset starts an embedded one.",
    )
    redis_url: str | None = Field(
        default=None,
        repr=False,
        description="URL of an existing Redis (redis://, rediss:// or unix://); "
        "unset starts an embedded one.",
    )
    s3_endpoint_url: str | None = Field(
        default=None,
        description="HTTP(S) endpoint of an existing S3-compatible store; "
        "unset starts an embedded one.",
    )
    s3_bucket: str = Field(
        default="cdiflow",
        description="Bucket holding task data; created on the embedded endpoint.",
    )
    aws_access_key_id: str | None = Field(
        default=None,
        description="S3 access key of a configured endpoint; unset: boto3's default credential "
        "chain (profile, IAM role). The embedded endpoint uses its own generated keys.",
    )
    aws_secret_access_key: SecretStr | None = Field(
        default=None,
        description="S3 secret key; unset behaves like aws_access_key_id.",
    )
    aws_region: str = Field(
        default="us-east-1",
        validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"),
        description="S3 region (AWS_REGION, else AWS_DEFAULT_REGION).",
    )

    max_input_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Largest workflow input (encoded image) a worker downloads; a larger "
        "one fails its workflow with that reason.",
    )
    max_pixels: int = Field(
        default=50_000_000,
        gt=0,
        description="Largest decoded image, in pixels (a guard against decompression bombs).",
    )
    max_active_workflows: int = Field(
        default=64,
        gt=0,
        description="Workflows one scheduler runs at once; the rest wait PENDING in Postgres. "
        "Each active CDI workflow holds its decoded image in memory: a few times the number of "
        "worker slots keeps every worker busy without holding a whole burst in RAM.",
    )

    @field_validator("data_dir")
    @classmethod
    def _absolute_dir(cls, value: Path) -> Path:
        path = value.expanduser().absolute()
        if path.exists() and not path.is_dir():
            raise ValueError(f"{path} exists and is not a directory")
        return path

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError(
                "not a URL; expected postgresql+psycopg://user:pass@host:5432/cdiflow"
            ) from None
        if url.drivername in _PLAIN_POSTGRES_SCHEMES:
            url = url.set(drivername="postgresql+psycopg")
        if url.drivername != "postgresql+psycopg":
            raise ValueError(
                f"scheme {url.drivername!r} is not supported: cdiflow needs PostgreSQL through "
                "psycopg 3, e.g. postgresql+psycopg://user:pass@host:5432/cdiflow"
            )
        if not url.host and "host" not in url.query:
            raise ValueError("the URL names no host")
        return url.render_as_string(hide_password=False)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in {"redis", "rediss", "unix"}:
            raise ValueError(
                f"scheme {parts.scheme!r} is not supported; expected redis://host:6379/0, "
                "rediss:// or unix://"
            )
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError("the URL names no host")
        return value

    @field_validator("s3_endpoint_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError("expected an http(s) URL with a host, e.g. https://s3.amazonaws.com")
        return value.rstrip("/")

    @field_validator("s3_bucket")
    @classmethod
    def _bucket_name(cls, value: str) -> str:
        if not _BUCKET_NAME.fullmatch(value) or ".." in value:
            raise ValueError(
                "not a valid S3 bucket name (3-63 characters: lowercase letters, digits, "
                "dots and hyphens, starting and ending with a letter or digit)"
            )
        return value

    @field_validator("aws_region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not value or any(ch.isspace() for ch in value):
            raise ValueError("expected a region name such as us-east-1")
        return value


def _env_name(field: str) -> str:
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info else None
    if isinstance(alias, str):
        return alias
    if isinstance(alias, AliasChoices):
        return " / ".join(str(choice) for choice in alias.choices)
    return field.upper()


def load_settings(**overrides: Any) -> Settings:
    """Read ``Settings`` from the environment (``overrides`` win), raising ``ConfigError``."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = _env_name(str(err["loc"][0])) if err["loc"] else "settings"
            problems.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError(f"invalid cdiflow settings: {'; '.join(problems)}") from None
