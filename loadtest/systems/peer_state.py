"""A peer's own state: a private folder instead of the user's home, temp folder and settings.

A peer's tools keep state where they keep a user's: Ray 2.60's ``ray.init()`` leaves
``~/.ray/auth_token``, and every ``ray start`` after it turns token authentication on with
that token while a driver given an address does not: every point would fail with
``InvalidAuthToken``. SDKs read settings from ``RAY_*``, ``CELERY_*``, ``CONDUCTOR_*`` or
``TEMPORAL_*`` variables and from files under ``~/.config``. So every process of a peer runs
with ``HOME``, ``TMPDIR`` and the XDG folders in a fresh folder of its own (mode 0700, under
the system's temp folder: Ray's socket paths must stay short), none of those variables, and
what the peer needs set explicitly (``PeerState.env``). Nothing of the user's is read or
changed, and the folder is removed at stop.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = ["FOREIGN_PREFIXES", "PeerState"]

# Settings a user's own installs of the peers may have exported; never passed to a peer.
FOREIGN_PREFIXES: Final = ("RAY_", "CELERY_", "CONDUCTOR_", "TEMPORAL_")


class PeerState:
    """``state = PeerState("ray")``: ``state.root`` (the peer's own folder), ``state.home``,
    ``state.tmp``; ``state.env(base)`` for its processes; ``state.remove()`` at stop."""

    def __init__(self, name: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"cdiflow-{name}-"))  # mode 0700
        self.home = self.root / "home"
        self.tmp = self.root / "tmp"
        for folder in (self.home, self.tmp):
            folder.mkdir(mode=0o700)

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` without the peers' own settings, its home and temp folders this state's."""
        env = {k: v for k, v in base.items() if not k.startswith(FOREIGN_PREFIXES)}
        env.update(
            HOME=str(self.home),
            TMPDIR=str(self.tmp),
            XDG_CONFIG_HOME=str(self.home / ".config"),
            XDG_CACHE_HOME=str(self.home / ".cache"),
            XDG_DATA_HOME=str(self.home / ".local" / "share"),
            XDG_STATE_HOME=str(self.home / ".local" / "state"),
        )
        return env

    def secret_file(self, relative: str) -> Path:
        """A fresh random secret in a file under ``home`` readable by its owner alone."""
        path = self.home / relative
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
        return path

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
