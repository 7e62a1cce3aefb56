"""``StartStop``: what runs between ``start()`` and ``stop()`` (an embedded service, the stack,
a benchmarked system) used as a context manager: ``with`` starts it, and stops it however the
block ends."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self

__all__ = ["StartStop"]


class StartStop(abc.ABC):
    """Started on entering a ``with`` block, stopped on leaving it."""

    @abc.abstractmethod
    def start(self) -> object:
        """Start it; return once it is up."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop it (nothing to do if it is not running)."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
