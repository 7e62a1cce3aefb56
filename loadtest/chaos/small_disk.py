"""A data folder on a disk of its own that a fault can fill: a size-limited tmpfs.

    with SmallDisk(root / "disk", size_mb=256) as disk:   # mounted; removed at the end
        Stack(disk.folder / "data", ...)                  # Postgres, S3, logs: all on it
        disk.fill(); ...; disk.free()

``fill`` writes a file of zeros until the kernel answers ENOSPC and keeps it topped up (a
process that deletes something, Postgres recycling its WAL, gets no room for long), as when
some other writer fills a shared disk; ``free`` deletes it. Mounting needs root
(``CAP_SYS_ADMIN``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import Final, Self

__all__ = ["SmallDisk"]

_CHUNKS: Final = (1 << 20, 64 << 10, 4 << 10)  # write the largest that still fits
TOP_UP_EVERY_S: Final = 0.2


class SmallDisk:
    def __init__(self, folder: Path, size_mb: int) -> None:
        self.folder = folder
        self.size_mb = size_mb
        self._filler = folder / "chaos-filler"
        self._stop = threading.Event()
        self._topping: threading.Thread | None = None
        self._mounted = False

    def mount(self) -> Self:
        if os.geteuid() != 0:
            raise RuntimeError(
                f"a disk of its own for the data folder needs root (mount -t tmpfs); running "
                f"as uid {os.geteuid()}"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", "cdiflow-chaos",
             str(self.folder)],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        self._mounted = True
        return self

    @property
    def free_bytes(self) -> int:
        stat = os.statvfs(self.folder)
        return stat.f_bavail * stat.f_frsize

    def fill(self) -> None:
        """Fill the disk to its last byte, and keep it so until ``free``."""
        self._stop.clear()
        self._top_up()
        self._topping = threading.Thread(target=self._keep_full, daemon=True)
        self._topping.start()

    def free(self) -> None:
        """Delete what ``fill`` wrote."""
        self._stop.set()
        if self._topping is not None:
            self._topping.join(10)
            self._topping = None
        self._filler.unlink(missing_ok=True)

    def close(self) -> None:
        """Free, unmount (lazily if a process still holds a file there) and remove."""
        self.free()
        if self._mounted:
            done = subprocess.run(["umount", str(self.folder)], capture_output=True, timeout=30)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(self.folder)], capture_output=True, timeout=30)
            self._mounted = False
        with contextlib.suppress(OSError):
            self.folder.rmdir()

    def _keep_full(self) -> None:
        while not self._stop.wait(TOP_UP_EVERY_S):
            self._top_up()

    def _top_up(self) -> None:
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in _CHUNKS:
                zeros = bytes(size)
                while True:
                    try:
                        os.write(fd, zeros)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)

    def __enter__(self) -> Self:
        return self.mount()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
