"""How many buffer views of an ``mmap`` are alive, and whether views of our own are still in
use, without trying to close or release anything.

``mmap.close()`` is the only public way to learn whether views are still exported, and it unmaps
when none are: ~0.5 ms for a 10 MB mapping, which must not sit between ``transfer()`` and the
new owner's ``access()``. CPython keeps the count in the mmap object's ``exports`` field, whose
offset we find once by probing (0 -> 1 -> 2 -> 0 as views come and go). If probing fails on some
interpreter, ``exports_of`` returns ``None`` and callers fall back to closing synchronously.

Likewise ``memoryview.release()`` is the only public way to learn whether a view is still in
use, and it releases the view when it is not: asked of each of a caller's views in turn, it
would release the first ones before finding that a later one is held, and an operation refused
with ``BufferInUse`` would still have taken the caller's first views away. ``views_in_use``
answers for all of them first, from two counts CPython keeps: a memoryview's ``exports``
(buffers taken from it and still held) and, in the buffer every slice, cast and NumPy array of
a view shares, the number of memoryviews registered on it. Their offsets are probed the same
way; ``None`` where they cannot be found.

Where the client's extension is built (``cdi._hotpath``), it makes the same reads at the same
offsets: a ``ctypes`` object built for each read costs more than the rest of a hand-off's
bookkeeping. ``$CDI_CLIENT_NATIVE=0`` when the module is first imported keeps ``ctypes``.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass

_NATIVE = os.environ.get("CDI_CLIENT_NATIVE", "1") != "0"
try:
    from cdi._hotpath import views_in_use as _native_views_in_use
    from cdi._hotpath import word_at as _native_word_at
except ImportError:  # installed without Rust
    _NATIVE = False

__all__ = ["exports_of", "views_in_use"]

_WORD = ctypes.sizeof(ctypes.c_ssize_t)


def _word(address: int) -> int:
    return int(ctypes.c_ssize_t.from_address(address).value)


def _narrow(candidates: list[int], base: int, expected: int) -> list[int]:
    return [off for off in candidates if _word(base + off) == expected]


def _find_offset() -> int | None:
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        base = id(probe)
        candidates = _narrow(list(range(16, 160, _WORD)), base, 0)
        first = memoryview(probe)
        second = memoryview(probe)
        candidates = _narrow(candidates, base, 2)
        first.release()
        candidates = _narrow(candidates, base, 1)
        second.release()
        candidates = _narrow(candidates, base, 0)
        return candidates[0] if len(candidates) == 1 else None
    finally:
        probe.close()


@dataclass(frozen=True)
class _ViewLayout:
    exports: int  # a memoryview's count of buffers taken from it
    mbuf: int  # a memoryview's pointer to the buffer it shares with its slices
    registered: int  # that shared buffer's count of memoryviews registered on it
    released: int  # the word holding a memoryview's flags, whose lowest bit says "released"


def _find_view_layout() -> _ViewLayout | None:
    data = bytearray(64)
    view = memoryview(data)
    base = id(view)
    # exports: 0 -> 1 -> 2 -> 0 as buffers are taken from the view and given back
    exports = _narrow(list(range(16, 160, _WORD)), base, 0)
    first, second = pickle.PickleBuffer(view), pickle.PickleBuffer(view)
    exports = _narrow(exports, base, 2)
    first.release()
    exports = _narrow(exports, base, 1)
    second.release()
    exports = _narrow(exports, base, 0)
    # mbuf: the field holding the buffer object the view refers to (the garbage collector
    # names it, so no guessed address is ever read)
    referents = gc.get_referents(view)
    if len(referents) != 1:
        return None
    shared = id(referents[0])
    mbuf = [off for off in range(16, 64, _WORD) if _word(base + off) == shared]
    part = view[1:]
    if len(exports) != 1 or len(mbuf) != 1:
        return None
    registered = _narrow(list(range(16, 64, _WORD)), shared, 2)  # view and part
    extra = view[2:]
    registered = _narrow(registered, shared, 3)
    extra.release()
    registered = _narrow(registered, shared, 2)
    part.release()
    registered = _narrow(registered, shared, 1)
    # released: the one word whose lowest bit alone turns on when the view is released
    before = {off: _word(base + off) for off in range(16, 160, _WORD)}
    view.release()
    released = [off for off, word in before.items() if _word(base + off) == word | 1 != word]
    if len(registered) != 1 or len(released) != 1:
        return None
    return _ViewLayout(exports[0], mbuf[0], registered[0], released[0])


_OFFSET = _find_offset()
_VIEWS = _find_view_layout()


def exports_of(mm: mmap.mmap) -> int | None:
    """Number of live buffer exports of ``mm``, or ``None`` if this interpreter hides it."""
    if _OFFSET is None or mm.closed:
        return None
    if _NATIVE:
        return _native_word_at(mm, _OFFSET)
    return _word(id(mm) + _OFFSET)


def views_in_use(handed: Sequence[tuple[memoryview, memoryview]]) -> bool | None:
    """Whether anything but our own views still uses the memory of ``handed``: each pair a
    view we handed out and the base it was sliced from (which nobody else holds), sharing one
    buffer. In use: a buffer taken from a view and still held, or a slice, cast or NumPy array
    made from it (one more memoryview registered on the shared buffer than ours). ``None`` if
    this interpreter hides it. Cheap: two reads per pair, and no exception for a view the
    caller released (asking a released view anything raises, and raising is dear)."""
    layout = _VIEWS
    if layout is None:
        return None
    if _NATIVE and type(handed) is list:
        return _native_views_in_use(
            handed, layout.exports, layout.mbuf, layout.registered, layout.released
        )
    for view, _base in handed:
        head = _head_of(view)
        if head[layout.released // _WORD] & 1:
            ours = 1  # the base alone: a released view counts for nothing
        elif head[layout.exports // _WORD]:
            return True
        else:
            ours = 2
        if _word(head[layout.mbuf // _WORD] + layout.registered) > ours:
            return True
    return False


def _head_of(view: memoryview) -> ctypes.Array[ctypes.c_ssize_t]:
    """The first words of a memoryview's struct, up to its exports and mbuf fields, in one
    read."""
    assert _HEAD is not None
    return _HEAD.from_address(id(view))


_HEAD = (
    None
    if _VIEWS is None
    else ctypes.c_ssize_t * (max(_VIEWS.exports, _VIEWS.mbuf, _VIEWS.released) // _WORD + 1)
)
