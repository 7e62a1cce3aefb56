"""Postgres refuses to run as root, so as root we run it as an unprivileged system user.

The user is ``cdiflow`` by default, created on first use with ``useradd --system`` (no home, no
login shell), which is what a fresh CI machine running as root needs. Without ``useradd`` we fall
back to ``nobody``. Not running as root, nothing changes: the service runs as the caller.

That user must be able to reach its data directory (and the Postgres binaries), so we add the
search bit (x, not read) on the directories above them that lack it, and log each one; the
data folder itself, which stays private, gets that user's own group and the group's search bit
(0710) instead.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ServiceError

__all__ = ["DEFAULT_SERVICE_USER", "RunAs", "chown_tree", "ensure_searchable", "service_identity"]

log = logging.getLogger(__name__)

DEFAULT_SERVICE_USER = "cdiflow"
_FALLBACK_USER = "nobody"


@dataclass(frozen=True)
class RunAs:
    """The account a child process switches to before it executes."""

    user: str
    uid: int
    gid: int


def service_identity(user: str = DEFAULT_SERVICE_USER) -> RunAs | None:
    """``None`` unless we are root; then ``user``, created when missing."""
    if os.geteuid() != 0:
        return None
    entry = _lookup(user) or _create(user)
    if entry is None:
        log.warning("cannot create system user %r; running Postgres as %r", user, _FALLBACK_USER)
        entry = _lookup(_FALLBACK_USER)
    if entry is None or entry.pw_uid == 0:
        raise ServiceError(
            f"running as root, Postgres needs an unprivileged user but {user!r} could not be "
            f"created and {_FALLBACK_USER!r} is unusable; create one (useradd --system {user}) "
            "or run cdiflow as a normal user",
            service="postgres",
        )
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _lookup(user: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(user)
    except KeyError:
        return None


def _create(user: str) -> pwd.struct_passwd | None:
    useradd = shutil.which("useradd")
    if useradd is None:
        return None
    shell = next(
        (s for s in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false") if Path(s).exists()),
        "/bin/false",
    )
    cmd = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
           "--shell", shell, "--comment", "cdiflow embedded services", user]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode == 0:
        log.warning("created system user %r to run Postgres (we are root)", user)
    else:
        log.debug("useradd %s failed: %s", user, result.stderr.strip())
    return _lookup(user)  # also right when a concurrent process created it first


def _can_search(st: os.stat_result, who: RunAs) -> bool:
    # Unix checks only the first class that matches: owner, then group, then others.
    if st.st_uid == who.uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == who.gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def ensure_searchable(path: Path, who: RunAs, *, quiet_under: Path | None = None) -> None:
    """Let ``who`` reach ``path`` by adding the search bit where missing, from ``/`` down.

    ``quiet_under``: our own folder (the data folder), kept private: a folder there that we
    own gets ``who``'s own group and the group's search bit, never the others' one."""
    for directory in [*reversed(path.parents), path]:
        st = directory.stat()
        if _can_search(st, who):
            continue
        ours = quiet_under is not None and directory.is_relative_to(quiet_under)
        if ours and st.st_uid == os.geteuid() and st.st_uid != who.uid:
            os.chown(directory, -1, who.gid)
            directory.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXGRP)
            log.debug("gave %s to group %d (search only) so user %r can reach %s",
                      directory, who.gid, who.user, path)  # fmt: skip
            continue
        if st.st_uid == who.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == who.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        directory.chmod(stat.S_IMODE(st.st_mode) | bit)
        log.log(
            logging.DEBUG if ours else logging.WARNING,
            "added search permission on %s so user %r can reach %s",
            directory, who.user, path,
        )  # fmt: skip


def chown_tree(root: Path, who: RunAs) -> None:
    """Give ``root`` and everything below it to ``who`` (Postgres insists on owning its data)."""
    os.chown(root, who.uid, who.gid)
    for parent, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.chown(os.path.join(parent, name), who.uid, who.gid, follow_symlinks=False)
