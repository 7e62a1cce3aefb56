"""Letting go of what a failed call's frames hold.

An exception keeps its traceback, and the traceback keeps every frame's locals alive: a mapped
image, a decoder writing into shared memory, a view of a CDI object. While they live the object
stays exported, and a transfer, resize or destroy of it raises ``BufferInUse``. Whoever handles
such an error and must hand the memory on clears the frames first.
"""

from __future__ import annotations

import traceback

__all__ = ["clear_frames"]


def clear_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames in ``exc``'s traceback and its causes'."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__
