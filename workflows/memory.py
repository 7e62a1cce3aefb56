"""Memory settings for processes that pass large images around (the workers).

A 6.6-megapixel photo is a 26 MB image inside Pillow and a 20 MB buffer when written out, and
every task allocates several of them: its copy of the input, the filters' results and
temporaries, the bytes it writes back. By default glibc serves each of those sizes from a
fresh ``mmap`` and returns it on free, so every pass first touches new pages, which the kernel
must zero: ~0.8 ms per MB on our VMs. Raising glibc's mmap threshold to its maximum (Pillow's
blocks are at most 16 MB, so every one comes from the heap) and keeping freed heap lets a pass
reuse what the last one freed (tests/workflows/test_memory.py counts the faults; ``cdiflow
bench workflows`` shows them per workflow).

*Why not Pillow's own block cache* (``PILLOW_BLOCKS_MAX``): with the heap kept, it only holds
blocks the heap would have reused, and with Pillow 12 and 13 it made a second pass fault in
more pages than with the heap setting alone (the test above checks the settings as applied).
A user's ``PILLOW_BLOCKS_MAX`` is still Pillow's to honour.

*One arena* (``M_ARENA_MAX`` 1): a worker runs its tasks on slot threads, and glibc gives each
thread an arena of its own whose heaps are given back to the kernel whole once their blocks are
free, whatever the trim threshold: there every pass faulted its pages in again (`cdiflow bench
workflows --scenario 1 --sizes 2MB`: ~10,100 faults and ~29 ms of system CPU a three-task
workflow in the workers; 3-16 and 3-4 ms with one arena). With one arena every thread
allocates from the main heap, which keeps what it freed.
Large blocks are few, so the arena's lock is rarely contended.

Costs: a process keeps up to ``TRIM_THRESHOLD`` of freed heap resident between tasks.
``CDIFLOW_MEMORY_TUNING=0`` turns this off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import Final

__all__ = ["ARENAS", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_for_images"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD: Final = 32 << 20  # glibc's maximum: smaller allocations come from the heap
TRIM_THRESHOLD: Final = 256 << 20  # freed heap kept before it is given back to the kernel
ARENAS: Final = 1  # every thread allocates from the main arena
_M_TRIM_THRESHOLD: Final = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD: Final = -3
_M_ARENA_MAX: Final = -8


def tune_for_images() -> dict[str, bool]:
    """Apply the settings above to this process; what took effect (nothing on a libc without
    ``mallopt``, e.g. musl, or with ``CDIFLOW_MEMORY_TUNING=0``)."""
    applied = {"malloc": False}
    if os.environ.get("CDIFLOW_MEMORY_TUNING", "1") == "0":
        return applied
    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    if mallopt is not None:
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
        ok = mallopt(_M_ARENA_MAX, ARENAS) == 1 and ok  # before the threads' first malloc
        applied["malloc"] = ok
        if not ok:
            log.warning("mallopt refused the image memory settings; running with the defaults")
    return applied
