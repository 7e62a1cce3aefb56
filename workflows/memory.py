"""Memory settings for processes that pass large images around (the workers).

A 6.6-megapixel photo is a 26 MB image inside Pillow and a 20 MB buffer when written out, and
every task allocates several of them: its copy of the input, the filters' results and
temporaries, the bytes it writes back. By default Pillow frees its memory blocks at once and
glibc serves each of those sizes from a fresh ``mmap`` and returns it on free, so every pass
first touches new pages, which the kernel must zero: ~0.8 ms per MB on our VMs. Keeping freed
memory for reuse lets a pass reuse what the last one freed (tests/workflows/test_memory.py
counts the faults; ``cdiflow bench workflows`` shows them per workflow).

Costs: a process keeps up to ``PILLOW_BLOCKS`` x 16 MB of Pillow blocks and up to
``TRIM_THRESHOLD`` of freed heap resident between tasks. ``CDIFLOW_MEMORY_TUNING=0`` turns this
off; ``PILLOW_BLOCKS_MAX`` set by the user wins over ours.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import Final

from PIL import _imaging as pillow_core  # the C module behind Image.core

__all__ = ["MMAP_THRESHOLD", "PILLOW_BLOCKS", "TRIM_THRESHOLD", "tune_for_images"]

log = logging.getLogger(__name__)

PILLOW_BLOCKS: Final = 16  # of Pillow's 16 MB blocks kept for reuse
MMAP_THRESHOLD: Final = 32 << 20  # glibc's maximum: smaller allocations come from the heap
TRIM_THRESHOLD: Final = 256 << 20  # freed heap kept before it is given back to the kernel
_M_TRIM_THRESHOLD: Final = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD: Final = -3


def tune_for_images() -> dict[str, bool]:
    """Apply the settings above to this process; what took effect (nothing on a libc without
    ``mallopt``, e.g. musl, or with ``CDIFLOW_MEMORY_TUNING=0``)."""
    applied = {"pillow_blocks": False, "malloc": False}
    if os.environ.get("CDIFLOW_MEMORY_TUNING", "1") == "0":
        return applied
    if "PILLOW_BLOCKS_MAX" not in os.environ:
        pillow_core.set_blocks_max(PILLOW_BLOCKS)
        applied["pillow_blocks"] = True
    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    if mallopt is not None:
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
        applied["malloc"] = ok
        if not ok:
            log.warning("mallopt refused the image memory settings; running with the defaults")
    return applied
