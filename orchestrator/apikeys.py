"""API keys: what one looks like, how it is hashed, and the roles a key may have.

A key is ``cdf_`` and 43 URL-safe characters (32 random bytes, 256 bits). The API stores only
its SHA-256 digest. *Why SHA-256, not bcrypt or Argon2:* a slow hash protects secrets people
choose, which a stolen table lets an attacker guess; a 256-bit random key cannot be guessed
whatever the hash, and a slow hash would cost every request tens of milliseconds of CPU. A
digest is also a lookup key: the API finds a key by its digest, so no comparison of secrets
runs in user-controlled time.

The stack's admin key lives in ``<data>/api-key`` (mode 0600): ``ensure_key_file`` makes it
once and returns the same key afterwards, so clients keep working across restarts.
"""

from __future__ import annotations

import enum
import hashlib
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Final

from orchestrator.errors import ConfigError
from orchestrator.private import private_dir

__all__ = [
    "ADMIN_KEY_NAME",
    "KEY_FILE",
    "KEY_RE",
    "MIN_KEY_LENGTH",
    "Role",
    "ensure_key_file",
    "generate_key",
    "hash_key",
    "read_key_file",
]

KEY_FILE: Final = "api-key"
ADMIN_KEY_NAME: Final = "admin"  # the configured admin key's name; no other key may take it
MIN_KEY_LENGTH: Final = 32
_PREFIX: Final = "cdf_"
# RFC 6750's b64token alphabet, bounded: a header that is not a key never reaches a query.
KEY_RE: Final = re.compile(rf"[A-Za-z0-9._~+/=-]{{{MIN_KEY_LENGTH},256}}")


class Role(enum.StrEnum):
    """What a key may do; each role may do everything the ones before it may."""

    VIEWER = "viewer"  # read workflows, definitions, workers, statistics, images
    OPERATOR = "operator"  # and start, cancel and retry workflows
    ADMIN = "admin"  # and register or delete tasks and definitions, and manage keys

    def allows(self, needed: Role) -> bool:
        """Whether this role may do what ``needed`` may."""
        return _RANK[self] >= _RANK[needed]


_RANK: Final = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


def generate_key() -> str:
    """A new random key (256 bits)."""
    return _PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The hex SHA-256 digest stored in place of ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


def read_key_file(path: Path) -> str:
    """The key in ``path``; ``ConfigError`` when it is unreadable, malformed, or readable by
    users other than its owner."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the API key file {path}: {exc.strerror or exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the API key file {path} is readable by other users (mode {stat.S_IMODE(mode):o}); "
            f"make it private: chmod 600 {path}"
        )
    if not KEY_RE.fullmatch(text):
        raise ConfigError(
            f"{path} does not hold an API key ({MIN_KEY_LENGTH}-256 characters of letters, "
            "digits and ._~+/=-); remove it to have a new one made"
        )
    return text


def ensure_key_file(data_dir: Path) -> tuple[Path, str]:
    """``<data_dir>/api-key`` and its key, made now (mode 0600) if it does not exist."""
    path = data_dir / KEY_FILE
    private_dir(data_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return path, read_key_file(path)
    key = generate_key()
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return path, key
