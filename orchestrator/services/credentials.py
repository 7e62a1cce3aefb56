"""The embedded services' generated secrets, kept in ``<data_dir>/credentials.json`` (0600).

Generated once per data folder and kept: the Postgres cluster stores its roles' password
verifiers, and the S3 endpoint's objects outlive a restart, so the same secrets must come back
with every ``cdiflow up``. Only the folder's owner can read the file; ``cdiflow status`` shows
its content to that owner.

    creds = ServiceCredentials.load_or_create(data_dir)
    creds.redis_password, creds.s3_secret_access_key, ...
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import stat
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Self
from urllib.parse import urlsplit, urlunsplit

from orchestrator.errors import ServiceError
from orchestrator.private import private_dir

__all__ = ["CREDENTIALS_FILE", "ServiceCredentials", "credentials_path", "hide_password"]

log = logging.getLogger(__name__)

CREDENTIALS_FILE = "credentials.json"
_MODE = 0o600


def hide_password(url: str) -> str:
    """``url`` with any password replaced by ``***``: what logs, tables, messages and
    stack.json show of a service's URL."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def credentials_path(data_dir: Path) -> Path:
    return data_dir / CREDENTIALS_FILE


def _secret() -> str:
    # URL-safe: the passwords travel inside postgresql:// and redis:// URLs unquoted.
    return secrets.token_urlsafe(24)


def _access_key() -> str:
    return "CDIFLOW" + secrets.token_hex(8).upper()


@dataclass(frozen=True)
class ServiceCredentials:
    """What the embedded Postgres, Redis and S3 endpoint check; never shown in ``repr``."""

    postgres_admin_password: str = field(default_factory=_secret, repr=False)
    """Of the superuser ``postgres`` (database and role set-up only)."""

    postgres_password: str = field(default_factory=_secret, repr=False)
    """Of the role ``cdiflow``: no superuser, owner of the ``cdiflow`` database alone."""

    redis_password: str = field(default_factory=_secret, repr=False)
    s3_access_key_id: str = field(default_factory=_access_key)
    s3_secret_access_key: str = field(default_factory=_secret, repr=False)

    @classmethod
    def load_or_create(cls, data_dir: Path) -> Self:
        """The folder's credentials; generated and written (0600) on first use.

        A file that others may read is made private again (with a warning); one this
        process cannot read raises ``ServiceError`` saying whose it is.
        """
        path = credentials_path(data_dir)
        try:
            return cls._load(path)
        except FileNotFoundError:
            pass
        private_dir(data_dir)
        created = cls()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _MODE)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(asdict(created), out, indent=2)
                out.write("\n")
            try:
                os.link(tmp, path)  # fails if another process created it meanwhile
            except FileExistsError:
                return cls._load(path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        log.info("generated the embedded services' credentials in %s (mode 0600)", path)
        return created

    @classmethod
    def _load(cls, path: Path) -> Self:
        try:
            st = path.stat()
            text = path.read_text()
        except PermissionError as exc:
            raise ServiceError(
                f"{path} is not readable by this user (uid {os.geteuid()}); run cdiflow as the "
                "data folder's owner, or use another --data-dir",
                service="credentials",
            ) from exc
        if stat.S_IMODE(st.st_mode) & 0o077:
            log.warning("%s could be read by others; making it private (0600)", path)
            path.chmod(_MODE)
        try:
            raw = json.loads(text)
            known = {f.name for f in fields(cls)}
            loaded = cls(**{k: str(v) for k, v in raw.items() if k in known})
        except (ValueError, TypeError) as exc:
            raise ServiceError(
                f"{path} is unreadable ({exc}); restore it from a backup (the embedded "
                "Postgres and S3 data need the same secrets)",
                service="credentials",
            ) from exc
        if known - set(raw):  # written by a version with fewer services: keep the new ones
            _write(path, loaded)
        return loaded


def _write(path: Path, creds: ServiceCredentials) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _MODE)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(creds), out, indent=2)
        out.write("\n")
    os.replace(tmp, path)
