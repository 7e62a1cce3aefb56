"""The data folder and what is in it, private to the user that runs the stack.

The folder holds the admin key, the services' credentials and data, the logs and the minion's
socket: it is made 0700 and every file in it 0600, whatever the umask, and a folder or file an
earlier run left readable by others is made private again (with a warning). As root, the
embedded Postgres runs as a system user of its own, which is given the search bit on the
folder through its own group (0710): that group has no other member.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import Final

__all__ = ["PRIVATE_DIR", "PRIVATE_FILE", "open_private", "private_dir", "write_private"]

log = logging.getLogger(__name__)

PRIVATE_DIR: Final = 0o700
PRIVATE_FILE: Final = 0o600
_FORBIDDEN: Final = 0o077  # bits nobody but the owner may have


def private_dir(path: Path) -> Path:
    """``path`` and its missing parents, made 0700; an existing ``path`` others may enter is
    made private, with a warning. Only a group given the folder on purpose (not its owner's
    own: the embedded Postgres' as root, ``ensure_searchable``) keeps its search bit.
    Returns ``path``."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    st = path.stat()
    mode = stat.S_IMODE(st.st_mode)
    allowed = stat.S_IXGRP if st.st_gid != os.getegid() else 0
    if mode & _FORBIDDEN & ~allowed and st.st_uid == os.geteuid():  # not another's to change
        log.warning("%s could be entered or read by others (mode %o); making it private",
                    path, mode)  # fmt: skip
        path.chmod(mode & ~(_FORBIDDEN & ~allowed))
    return path


def open_private(path: Path, flags: int) -> int:
    """``os.open`` of ``path`` with mode 0600 if it is created, and made 0600 if it exists
    with more (a log an earlier run left readable)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & _FORBIDDEN:
            os.fchmod(fd, mode & ~_FORBIDDEN)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``, mode 0600: a reader sees the old file or the
    new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as out:
            out.write(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
