"""Orchestrator settings, read from the environment.

Nothing needs setting on a developer machine: with no ``DATABASE_URL``, ``REDIS_URL`` or
``S3_ENDPOINT_URL``, ``cdiflow up`` starts embedded services with their data under
``CDIFLOW_DATA_DIR`` (default ``./.data``). Production sets the URLs to managed services.

Use ``load_settings()`` rather than ``Settings()`` in entry points: it turns pydantic's
validation error into ``ConfigError`` naming the environment variable to fix.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Final
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from cdi.auth import placeholder_reason  # one rule for every secret an operator configures
from orchestrator.apikeys import KEY_RE, MIN_KEY_LENGTH, read_key_file
from orchestrator.contract.vocabulary import ResultRetention
from orchestrator.errors import ConfigError
from workflows.sources import TaskSources

__all__ = ["Settings", "load_settings"]

# Schemes SQLAlchemy would map to psycopg2 (not installed); we rewrite them to psycopg 3.
_PLAIN_POSTGRES_SCHEMES = {"postgres", "postgresql"}
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_HOST_NAME = re.compile(r"(\*\.)?[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*\.?")
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_S3_PREFIX = re.compile(r"s3://([^/]+)/(.*)", re.S)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "::1")
_CONTENT_TYPE = re.compile(r"(\*/\*|[a-z0-9][a-z0-9!#$&^_.+-]*/(\*|[a-z0-9][a-z0-9!#$&^_.+-]*))")
# What /api/inputs takes unless the operator says otherwise (CDIFLOW_UPLOAD_TYPES).
DEFAULT_UPLOAD_TYPES: Final = (
    *(f"image/{name}" for name in ("jpeg", "png", "webp", "gif", "bmp", "tiff")),
    "video/*",
    "audio/*",
    "application/x-npy",
    "application/json",
    "text/plain",
    "text/csv",
    "application/octet-stream",
)
_GENERATE_KEY = "python -c 'import secrets; print(\"cdf_\" + secrets.token_urlsafe(32))'"


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
    upload_max_bytes: int | None = Field(
        default=None,
        gt=0,
        validation_alias="CDIFLOW_UPLOAD_MAX_BYTES",
        description="Largest file POST /api/inputs takes; unset: MAX_INPUT_BYTES, which it may "
        "not exceed (a worker reads no input over MAX_INPUT_BYTES).",
    )
    upload_types: Annotated[list[str], NoDecode] = Field(
        default=list(DEFAULT_UPLOAD_TYPES),
        validation_alias="CDIFLOW_UPLOAD_TYPES",
        description="Comma-separated content types POST /api/inputs takes, as detected from a "
        "file's bytes: type/subtype, type/* or */*. Default: the images workers decode, video, "
        "audio, NumPy arrays, JSON, plain text, CSV and raw bytes.",
    )
    admin_key: SecretStr | None = Field(
        default=None,
        validation_alias="CDIFLOW_ADMIN_KEY",
        description="The API's admin key (at least 32 characters); the API stores its digest as "
        "the key named 'admin' at start-up. `cdiflow up` makes one in <data>/api-key.",
    )
    admin_key_file: Path | None = Field(
        default=None,
        validation_alias="CDIFLOW_ADMIN_KEY_FILE",
        description="A file (mode 0600) holding the admin key, instead of CDIFLOW_ADMIN_KEY.",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default=list(LOOPBACK_HOSTS),
        validation_alias="CDIFLOW_ALLOWED_HOSTS",
        description="Comma-separated host names the API answers to (the Host header, without "
        "port); '*.example.com' matches its subdomains. Others get 400 (DNS rebinding).",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        validation_alias="CDIFLOW_CORS_ORIGINS",
        description="Comma-separated origins (https://app.example.com) whose pages may call the "
        "API from a browser; empty (the default): none.",
    )
    task_packages: Annotated[list[str], NoDecode] = Field(
        default=["workflows"],
        validation_alias="CDIFLOW_TASK_PACKAGES",
        description="Comma-separated packages (and their submodules) tasks may be loaded from.",
    )
    task_paths: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        validation_alias="CDIFLOW_TASK_PATHS",
        description="Folders of deployed task modules, separated by ':' like PYTHONPATH: "
        "workers import from them, and their top-level modules may hold tasks.",
    )
    s3_inputs: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        validation_alias="CDIFLOW_S3_INPUTS",
        description="Comma-separated S3 prefixes (s3://bucket/ or s3://bucket/path/) workflow "
        "inputs may come from; empty (the default): the whole S3_BUCKET.",
    )
    s3_results: str | None = Field(
        default=None,
        validation_alias="CDIFLOW_S3_RESULTS",
        description="S3 prefix results are stored under; unset: s3://<S3_BUCKET>/results/.",
    )

    retention_days: int = Field(
        default=30,
        ge=0,
        le=36_500,
        validation_alias="CDIFLOW_RETENTION_DAYS",
        description="Days a finished run is kept (from its end) before it is pruned, for "
        "definitions without a retention of their own; 0 keeps runs for ever.",
    )
    retention_results: ResultRetention = Field(
        default=ResultRetention.KEEP,
        validation_alias="CDIFLOW_RETENTION_RESULTS",
        description="What pruning a run does to its results in S3: keep (the default) or "
        "delete; a definition may say otherwise.",
    )
    archive_uri: str | None = Field(
        default=None,
        validation_alias="CDIFLOW_ARCHIVE_URI",
        description="S3 prefix (s3://bucket/path/) where each pruned run (its detail, task "
        "runs, hand-offs and events) is archived first, as gzipped JSON lines; unset: pruned "
        "runs are not archived.",
    )
    worker_connect_wait_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        validation_alias="CDIFLOW_WORKER_CONNECT_WAIT_S",
        description="Seconds a starting worker waits for Redis and its CDI minion (a worker "
        "restarted with them waits rather than exiting into the supervisor's back-off).",
    )
    input_cache: bool = Field(
        default=False,
        validation_alias="CDIFLOW_INPUT_CACHE",
        description="Fetch each workflow input once per host: the first task on a host that "
        "reads an S3 input keeps its decoded image in a per-host cache of CDI objects, which "
        "later workflows on the host reading the same version copy from (a HEAD checks the "
        "version and the caller's right to read it). Off by default.",
    )
    input_cache_mib: int = Field(
        default=1024,
        gt=0,
        le=1 << 20,
        validation_alias="CDIFLOW_INPUT_CACHE_MIB",
        description="MiB of decoded inputs the input cache keeps per host; the least recently "
        "used go first.",
    )
    retention_interval_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        validation_alias="CDIFLOW_RETENTION_INTERVAL_S",
        description="Seconds between two retention passes of the API's housekeeping.",
    )

    max_active_workflows: int = Field(
        default=64,
        gt=0,
        description="Workflows one scheduler runs at once; the rest wait PENDING in Postgres. "
        "Each active CDI workflow holds its decoded image in memory: a few times the number of "
        "worker slots keeps every worker busy without holding a whole burst in RAM.",
    )

    max_parallel_tasks: int = Field(
        default=16,
        gt=0,
        le=4096,
        description="Step runs of one workflow out at workers at once (parallel branches and "
        "the elements of a fan-out), so one workflow cannot flood the pool; the rest wait in "
        "the scheduler and go out as these come back.",
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

    @field_validator("admin_key")
    @classmethod
    def _key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not KEY_RE.fullmatch(value.get_secret_value()):
            raise ValueError(
                f"not a usable key: use {MIN_KEY_LENGTH}-256 letters, digits or ._~+/=- "
                f"(make one with {_GENERATE_KEY})"
            )
        if value is not None and (why := placeholder_reason(value.get_secret_value())):
            raise ValueError(f"not a secret: {why}; make a random key with {_GENERATE_KEY}")
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _hosts(cls, value: Any) -> list[str]:
        hosts = [h.lower().removeprefix("[").removesuffix("]") for h in _listed(value)]
        for host in hosts:
            if host == "*" or _HOST_NAME.fullmatch(host) or _is_ip(host):
                continue
            raise ValueError(
                f"{host!r} is not a host name or address (give names without port or scheme, "
                "e.g. cdiflow.example.com,*.internal.example.com,10.0.0.5)"
            )
        if not hosts:
            raise ValueError("name at least one host, e.g. localhost")
        return hosts

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> list[str]:
        origins = [o.rstrip("/") for o in _listed(value)]
        for origin in origins:
            parts = urlsplit(origin)
            if parts.scheme not in {"http", "https"} or not parts.hostname or parts.path:
                raise ValueError(
                    f"{origin!r} is not an origin; name each one as scheme://host[:port], "
                    "e.g. https://app.example.com ('*' is not accepted)"
                )
        return origins

    @field_validator("task_packages", mode="before")
    @classmethod
    def _packages(cls, value: Any) -> list[str]:
        packages = _listed(value)
        for package in packages:
            if not _PACKAGE.fullmatch(package):
                raise ValueError(f"{package!r} is not a package name such as mycompany.tasks")
        return packages

    @field_validator("task_paths", mode="before")
    @classmethod
    def _paths(cls, value: Any) -> list[Path]:
        if isinstance(value, str | Path):
            value = str(value).split(os.pathsep)
        parts = list(value or [])
        return [Path(p).expanduser().absolute() for p in parts if str(p).strip()]

    @field_validator("s3_inputs", mode="before")
    @classmethod
    def _inputs(cls, value: Any) -> list[str]:
        return [_s3_prefix(p) for p in _listed(value)]

    @field_validator("upload_types", mode="before")
    @classmethod
    def _types(cls, value: Any) -> list[str]:
        types = [t.lower() for t in _listed(value)]
        for kind in types:
            if not _CONTENT_TYPE.fullmatch(kind):
                raise ValueError(
                    f"{kind!r} is not a content type; name each as type/subtype, type/* or */*, "
                    "e.g. video/mp4,application/x-npy,image/*"
                )
        if not types:
            raise ValueError("name at least one content type, e.g. image/*")
        return types

    @field_validator("s3_results", "archive_uri")
    @classmethod
    def _results(cls, value: str | None) -> str | None:
        return None if value is None else _s3_prefix(value)

    @model_validator(mode="after")
    def _one_admin_key(self) -> Settings:
        if self.admin_key is not None and self.admin_key_file is not None:
            raise ValueError("set CDIFLOW_ADMIN_KEY or CDIFLOW_ADMIN_KEY_FILE, not both")
        return self

    @model_validator(mode="after")
    def _uploads_within_inputs(self) -> Settings:
        if self.upload_max_bytes is not None and self.upload_max_bytes > self.max_input_bytes:
            raise ValueError(
                f"CDIFLOW_UPLOAD_MAX_BYTES ({self.upload_max_bytes}) is over MAX_INPUT_BYTES "
                f"({self.max_input_bytes}): a worker would refuse such an input; raise "
                "MAX_INPUT_BYTES too, or lower CDIFLOW_UPLOAD_MAX_BYTES"
            )
        return self

    @property
    def upload_limit(self) -> int:
        """The largest file ``POST /api/inputs`` takes."""
        return self.upload_max_bytes or self.max_input_bytes

    def task_sources(self) -> TaskSources:
        """Where tasks may be loaded from (``task_packages`` and ``task_paths``)."""
        return TaskSources(tuple(self.task_packages), tuple(self.task_paths))

    def resolved_admin_key(self) -> str | None:
        """The admin key from ``admin_key`` or ``admin_key_file``, or ``None`` when neither is
        set; ``ConfigError`` if that file is unusable or the key is a placeholder (the API
        refuses to start with one: ``cdi.auth.placeholder_reason``)."""
        if self.admin_key is not None:
            key, where = self.admin_key.get_secret_value(), "CDIFLOW_ADMIN_KEY"
        elif self.admin_key_file is not None:
            key = read_key_file(self.admin_key_file)
            where = f"CDIFLOW_ADMIN_KEY_FILE: the key in {self.admin_key_file}"
        else:
            return None
        if why := placeholder_reason(key):
            raise ConfigError(
                f"{where} is not a secret: {why}; make a random key with {_GENERATE_KEY}"
            )
        return key

    @field_validator("aws_region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not value or any(ch.isspace() for ch in value):
            raise ValueError("expected a region name such as us-east-1")
        return value


def _listed(value: Any) -> list[str]:
    """A comma-separated string (from the environment) or a list, as stripped non-empty items."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    return [str(item).strip() for item in items if str(item).strip()]


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _s3_prefix(value: str) -> str:
    """``s3://bucket/`` or ``s3://bucket/path/``, checked, with the trailing slash a prefix of
    whole path segments needs (``results`` must not match ``results-old/``)."""
    match = _S3_PREFIX.fullmatch(value.strip())
    if match is None or not _BUCKET_NAME.fullmatch(match[1]) or ".." in match[1]:
        raise ValueError(f"{value!r} is not an S3 prefix such as s3://bucket/ or s3://bucket/in/")
    key = match[2]
    if _CONTROL.search(key) or any(part in ("", ".", "..") for part in key.split("/")[:-1]):
        raise ValueError(f"{value!r}: the path may not hold empty, '.' or '..' segments")
    if key and not key.endswith("/"):
        key += "/"
    return f"s3://{match[1]}/{key}"


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
