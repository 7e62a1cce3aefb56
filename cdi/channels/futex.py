"""Sleeping on a word of shared memory until another process changes it (Linux futexes).

A channel's ring and its readers' cursors are memfds that several processes map; a futex on a
word of such a mapping is keyed by the file and offset, so a process that maps it read-only
can wait on it and wake its sleepers (the kernel reads the word, it never writes it). No file
descriptor has to travel besides the memfds themselves.
"""

from __future__ import annotations

import ctypes
import errno
import math
import mmap
import os
import platform

import numpy as np

from cdi.errors import ConfigError

__all__ = ["WAKE_ALL", "address_of_view", "wait", "wake"]

_SYS_FUTEX = {"x86_64": 202, "AMD64": 202}
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
WAKE_ALL = 0x7FFFFFFF

_machine = platform.machine()
if _machine not in _SYS_FUTEX:  # pragma: no cover - this project runs on x86-64 Linux
    # The ring relies on x86-64's ordering of plain stores (payload, then sequence, then head):
    # elsewhere it would need fences that Python does not offer.
    raise ConfigError(f"cdi.channels needs x86-64 Linux (this is {_machine})")

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_NR = _SYS_FUTEX[_machine]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def address_of_view(buffer: memoryview | mmap.mmap) -> int:
    """The address of ``buffer``'s first byte (read-only mappings too, which ctypes refuses)."""
    probe = np.frombuffer(buffer, dtype=np.uint8, count=1)
    try:
        return int(probe.ctypes.data)
    finally:
        del probe  # no export may outlive this call: the mapping must stay closable


def wait(address: int, expected: int, timeout: float | None) -> bool:
    """Sleep while the 32-bit word at ``address`` holds ``expected``, at most ``timeout``
    seconds (``None``: no limit); False when the time ran out. Wakes early on a signal or a
    spurious wake-up: the caller checks its condition again either way."""
    spec = None
    if timeout is not None:
        if timeout <= 0:
            return False
        fraction, whole = math.modf(timeout)
        spec = ctypes.byref(_Timespec(int(whole), int(fraction * 1e9)))
    result = _syscall(
        _NR, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(expected), spec, None, 0
    )
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ETIMEDOUT:
        return False
    if err in (errno.EAGAIN, errno.EINTR):
        return True
    raise OSError(err, f"futex wait: {os.strerror(err)}")


def wake(address: int, count: int = WAKE_ALL) -> None:
    """Wake up to ``count`` processes sleeping on the word at ``address``."""
    _syscall(_NR, ctypes.c_void_p(address), _FUTEX_WAKE, count, None, None, 0)
