"""Who may speak to the CDI controller, and to a host's gateway: the cluster's credentials.

Two secrets per cluster, each 256 random bits written as URL-safe text:

* the **cluster key**, the controller's alone. It signs the *tokens* every caller of the
  controller sends (gRPC metadata ``authorization: Bearer <token>``): ``cdi1.<role>.<subject>.
  <HMAC-SHA256 of role and subject>``. Roles (``Role``): ``minion`` for one host, named as the
  subject (``*``: any host, for deployments that cannot give each node its own token), which
  may announce and report only that host and ask where a container or an object is;
  ``reader`` (subject: who holds it, e.g. ``api``), which may also list and look up
  everything. A token names no secret: the controller recomputes its HMAC.
* the **gateway key**, every host's gateway's: gateways prove to each other that they hold it
  (a challenge and answer both ways, ``cdi.remote.handshake``) before any object crosses. No
  key travels.

Each process gets what it needs as an environment variable or as a file that others may not
read (``CDI_CLUSTER_KEY[_FILE]``, ``CDI_CONTROLLER_TOKEN[_FILE]``, ``CDI_GATEWAY_KEY[_FILE]``),
never on its command line. ``ClusterCredentials`` makes a set in a folder (``cdiflow up``,
``LocalCluster``, ``cdiflow cdi credentials``).

*Why tokens and not mutual TLS* (docs/security.md): no certificate authority to run and no
certificates to renew; a minion's token names its host, so the controller holds each minion to
it; revoking everything is replacing one key. The cost: a token travels in clear, as the gRPC
channel does, so the controller's port must stay on a network others cannot listen on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from cdi.errors import AccessDenied, ConfigError, NotAuthenticated

__all__ = [
    "ANY_HOST",
    "CLUSTER_KEY_ENV",
    "CONTROLLER_TOKEN_ENV",
    "GATEWAY_KEY_ENV",
    "ClusterCredentials",
    "Credential",
    "Role",
    "check_key",
    "check_token",
    "controller_token",
    "mint_token",
    "new_key",
    "placeholder_reason",
    "read_secret",
    "read_secret_file",
    "require",
    "verify_token",
    "without_secrets",
]

CLUSTER_KEY_ENV: Final = "CDI_CLUSTER_KEY"
CONTROLLER_TOKEN_ENV: Final = "CDI_CONTROLLER_TOKEN"
GATEWAY_KEY_ENV: Final = "CDI_GATEWAY_KEY"
ANY_HOST: Final = "*"
_VERSION: Final = "cdi1"
_MIN_KEY_CHARS: Final = 32  # 24 random bytes or more, as URL-safe base64
_MAX_SECRET_CHARS: Final = 1024
# What an example secret in a manifest or a document says instead of being secret: a
# configured key that reads like one is refused (``placeholder_reason``), so that a forgotten
# edit never deploys a published key (the API's admin key is held to the same rule).
_PLACEHOLDER_WORDS: Final = re.compile(
    r"change[-_.]?me|replace[-_.]?me|placeholder|example|your[-_.]?(admin[-_.]?)?key|"
    r"random[-_.]?key|not[-_.]?a[-_.]?secret",
    re.IGNORECASE,
)
_MIN_DISTINCT: Final = 12  # a random key of 32+ characters has ~30 distinct ones


class Role(StrEnum):
    """What a controller token may do."""

    MINION = "minion"
    """Announce and report its own host (the subject; ``*``: any), route and locate."""
    READER = "reader"
    """Route, locate, look up and list every minion, container and object."""


@dataclass(frozen=True)
class Credential:
    """A token the controller checked: its role and subject."""

    role: Role
    subject: str

    def may_speak_for(self, host: str) -> bool:
        """Whether this credential may announce or report ``host``."""
        return self.role is Role.MINION and self.subject in (host, ANY_HOST)


def new_key() -> str:
    """A fresh cluster or gateway key: 256 random bits, URL-safe text."""
    return secrets.token_urlsafe(32)


def placeholder_reason(secret: str) -> str | None:
    """Why ``secret`` is no secret (a placeholder's words, or too few distinct characters to
    be random), or ``None`` for one that may be."""
    if found := _PLACEHOLDER_WORDS.search(secret):
        return f"it is a placeholder (it says {found.group(0)!r})"
    if len(set(secret)) < _MIN_DISTINCT:
        return f"it has only {len(set(secret))} distinct characters, too few for a random key"
    return None


def check_key(key: str, what: str) -> str:
    """``key`` if it can be a key of ours: long enough, and not a placeholder;
    ``ConfigError`` saying so (never repeating it)."""
    key = key.strip()
    if len(key) < _MIN_KEY_CHARS or len(key) > _MAX_SECRET_CHARS or not key.isascii():
        raise ConfigError(
            f"the {what} must be {_MIN_KEY_CHARS} to {_MAX_SECRET_CHARS} ASCII characters; "
            "make one with `cdiflow cdi credentials`"
        )
    if why := placeholder_reason(key):
        raise ConfigError(
            f"the {what} is not a secret: {why}; make a random one with `cdiflow cdi credentials`"
        )
    return key


def check_token(token: str, role: Role) -> str:
    """``token`` if it reads as a token of ``role`` (the controller alone can tell whether
    its cluster's key signed it); ``ConfigError`` saying what it is instead, never repeating
    it: a placeholder left in a manifest is refused when the process starts."""
    token = token.strip()
    version, _, rest = token.partition(".")
    given, _, rest = rest.partition(".")
    subject, _, mac = rest.rpartition(".")
    if version != _VERSION or given not in {r.value for r in Role} or not subject or not mac:
        raise ConfigError(
            f"the controller token is not a CDI token ({_VERSION}.<role>.<subject>.<signature>)"
            f": a placeholder? `cdiflow cdi credentials` makes this process's {role} token"
        )
    if given != role:
        raise ConfigError(
            f"the controller token is a {given} token; this process needs a {role} token "
            "(`cdiflow cdi credentials` makes each)"
        )
    return token


def controller_token(role: Role) -> str | None:
    """The controller token this process was given (``$CDI_CONTROLLER_TOKEN``, or the file
    ``$CDI_CONTROLLER_TOKEN_FILE`` names), checked to be one of ``role`` (``check_token``);
    ``None`` when it was given none."""
    token = read_secret(CONTROLLER_TOKEN_ENV, what="controller token")
    try:
        return None if token is None else check_token(token, role)
    except ConfigError as exc:
        where = f"{CONTROLLER_TOKEN_ENV} (or {CONTROLLER_TOKEN_ENV}_FILE)"
        raise ConfigError(f"{where}: {exc}") from None


def _mac(key: str, role: str, subject: str) -> str:
    message = f"{_VERSION}\0{role}\0{subject}".encode()
    digest = hmac.new(key.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def mint_token(key: str, role: Role, subject: str) -> str:
    """The token of ``role`` for ``subject`` under the cluster ``key``."""
    if not subject or any(c.isspace() or c == "\0" for c in subject) or len(subject) > 256:
        raise ConfigError(f"a token's subject {subject!r} must be 1-256 characters, no spaces")
    return f"{_VERSION}.{role}.{subject}.{_mac(key, role, subject)}"


def verify_token(key: str, token: str | None) -> Credential:
    """The credential ``token`` carries if ``key`` signed it; ``NotAuthenticated`` otherwise
    (the message never repeats the token)."""
    if not token:
        raise NotAuthenticated(
            "the CDI controller wants a token of this cluster (CDI_CONTROLLER_TOKEN or "
            "CDI_CONTROLLER_TOKEN_FILE); none was sent"
        )
    version, _, rest = token.partition(".")
    role, _, rest = rest.partition(".")
    subject, _, mac = rest.rpartition(".")
    known = role in {r.value for r in Role}
    if version != _VERSION or not known or not subject or not mac:
        raise NotAuthenticated("the token sent to the CDI controller is not a CDI token")
    if not hmac.compare_digest(mac.encode(), _mac(key, role, subject).encode()):
        raise NotAuthenticated(
            "the token sent to the CDI controller was not issued by this cluster's key"
        )
    return Credential(Role(role), subject)


def require(credential: Credential, role: Role, *, host: str | None = None) -> None:
    """``AccessDenied`` unless ``credential`` may act as ``role`` (a reader may do what a
    minion may, except speak for a host) and, given ``host``, speak for it."""
    if host is not None:
        if not credential.may_speak_for(host):
            raise AccessDenied(
                f"a {credential.role} token for {credential.subject!r} may not speak for host "
                f"{host!r}"
            )
        return
    if role is Role.READER and credential.role is not Role.READER:
        raise AccessDenied(f"a {credential.role} token may not list or look up the directory")


def without_secrets(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` without the cluster's secrets, for a process that needs none."""
    secret = (CLUSTER_KEY_ENV, CONTROLLER_TOKEN_ENV, GATEWAY_KEY_ENV)
    return {k: v for k, v in environment.items() if k not in secret}


def read_secret(variable: str, *, what: str) -> str | None:
    """The secret in ``$variable``, else in the file ``$variable_FILE``; ``None`` if neither
    is set. A file that other users may read is refused (``ConfigError``), as is one that
    cannot be read; the message names the file, never what is in it."""
    value = os.environ.get(variable)
    if value:
        return value.strip()
    path = os.environ.get(f"{variable}_FILE")
    return read_secret_file(Path(path), what=what) if path else None


def read_secret_file(path: Path, *, what: str) -> str:
    """The secret in ``path`` (see ``read_secret``)."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from exc
    if mode & stat.S_IRWXO:
        raise ConfigError(
            f"the {what} file {path} may be read by other users (mode {stat.S_IMODE(mode):o}); "
            f"make it private: chmod 600 {path}"
        )
    if not text or len(text) > _MAX_SECRET_CHARS:
        raise ConfigError(f"the {what} file {path} holds no {what}")
    return text


def _write_secret(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")
    os.replace(tmp, path)


@dataclass(frozen=True)
class ClusterCredentials:
    """A cluster's key files in ``folder`` (each 0600, the folder 0700), made on first use
    and kept: ``cluster.key`` (the controller's), ``gateway.key`` (every gateway's),
    ``reader.token`` (a ``reader`` token for the cluster's own tools) and
    ``minion-<host>.token`` (each host's minion's)."""

    folder: Path

    @property
    def cluster_key_file(self) -> Path:
        return self.folder / "cluster.key"

    @property
    def gateway_key_file(self) -> Path:
        return self.folder / "gateway.key"

    @property
    def reader_token_file(self) -> Path:
        return self.folder / "reader.token"

    def minion_token_file(self, host: str) -> Path:
        """``minion-<host>.token`` (``minion-any-host.token`` for ``*``)."""
        mint_token("x" * _MIN_KEY_CHARS, Role.MINION, host)  # a host a token can name
        if "/" in host or host in (".", ".."):
            raise ConfigError(f"host {host!r} cannot name a token file")
        return self.folder / f"minion-{'any-host' if host == ANY_HOST else host}.token"

    @classmethod
    def ensure(cls, folder: Path, hosts: tuple[str, ...] | list[str] = ()) -> ClusterCredentials:
        """The credentials in ``folder``: the keys made if missing, the reader's token and a
        token for each of ``hosts`` (re)written from the cluster key."""
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(stat.S_IMODE(folder.stat().st_mode) & ~0o077)
        made = cls(folder)
        for path in (made.cluster_key_file, made.gateway_key_file):
            if not path.exists():
                _write_secret(path, new_key())
        key = made.cluster_key()
        _write_secret(made.reader_token_file, mint_token(key, Role.READER, "cluster-tools"))
        for host in hosts:
            _write_secret(made.minion_token_file(host), mint_token(key, Role.MINION, host))
        return made

    def cluster_key(self) -> str:
        return check_key(read_secret_file(self.cluster_key_file, what="cluster key"), "cluster key")

    def reader_token(self) -> str:
        return read_secret_file(self.reader_token_file, what="controller token")
