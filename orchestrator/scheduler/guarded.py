"""What keeps one workflow's trouble from stopping the scheduler's loop."""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["guarded"]

log = logging.getLogger(__name__)


def guarded(action: Callable[[], None]) -> None:
    """Run ``action``; an exception is logged, not raised: one bad workflow must not stop the
    others."""
    try:
        action()
    except Exception:
        log.exception("scheduler step failed")
