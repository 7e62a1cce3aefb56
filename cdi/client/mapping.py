"""A process's mapping of an object's segment, and the views of it the client handed out."""

from __future__ import annotations

import mmap
from contextlib import suppress
from dataclasses import dataclass, field

from cdi.client.exports import exports_of, views_in_use
from cdi.errors import BufferInUse

__all__ = ["Mapping", "in_use"]


@dataclass(eq=False)
class Mapping:
    """This process's mapping of an object's segment, and the views it handed out."""

    mm: mmap.mmap
    size: int
    capacity: int
    generation: int
    segment: int | None
    """The minion's id of the memory this maps (a memfd): a cached mapping is reused only for
    the same id."""
    cacheable: bool
    """Cooperative objects only: a strict object's old segment is truncated on transfer."""
    writable: bool = True
    """False for a reader's mapping of a shared object (read-only fd, ``PROT_READ``)."""
    views: list[tuple[memoryview, memoryview]] = field(default_factory=list)
    """Each view handed out, with the base it was sliced from (``views_in_use``)."""

    def view(self) -> memoryview:
        """The object's bytes (read-only if the mapping is); revoked with the mapping."""
        base = memoryview(self.mm)
        view = base[: self.size]
        self.views.append((view, base))
        return view

    def read_view(self) -> memoryview:
        """The object's bytes, read-only; revoked with the mapping."""
        base = memoryview(self.mm)
        view = base[: self.size].toreadonly()
        self.views.append((view, base))
        return view

    def revoke(self, key: str, *, all_or_nothing: bool = True) -> None:
        """Release every view we handed out; refuse if anything else still holds the buffer.

        ``all_or_nothing``: refuse before releasing any view, so that an operation refused
        with ``BufferInUse`` leaves the caller's views usable (where the interpreter lets us
        tell, ``views_in_use``); otherwise release every view that can be released."""
        if all_or_nothing and views_in_use(self.views):
            raise in_use(key)
        try:
            for pair in self.views:
                for view in pair:
                    view.release()
        except BufferError as exc:
            raise in_use(key) from exc
        self.views.clear()
        exports = exports_of(self.mm)
        if exports is None:
            self.close(key)  # this interpreter hides the count: find out by closing
        elif exports:
            raise in_use(key)

    def close_quietly(self) -> None:
        """Release our views and unmap; a view the caller still holds keeps the memory mapped
        until it is dropped."""
        for pair in self.views:
            for view in pair:
                with suppress(BufferError):
                    view.release()
        with suppress(BufferError):
            self.mm.close()

    def close(self, key: str) -> None:
        if self.mm.closed:
            return
        try:
            self.mm.close()
        except BufferError as exc:
            raise in_use(key) from exc


def in_use(key: str) -> BufferInUse:
    return BufferInUse(
        f"views of {key!r} (a memoryview slice or a NumPy array) are still referenced; drop "
        "them, or use `with obj.view() as buf:`, before transfer, share, resize, destroy or "
        "release"
    )
