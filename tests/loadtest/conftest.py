"""The load test needs the optional ``bench`` dependencies (locust, Celery, matplotlib).

Absent, their tests are skipped with the reason on a developer's machine and fail in CI
(``CI`` set), where the dependencies must be installed.
"""

from __future__ import annotations

import importlib.util
import os

import pytest


def require(*modules: str) -> None:
    """Skip (locally) or fail (in CI) the calling test unless ``modules`` are installed."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    reason = f"needs {', '.join(missing)} (pip install -e '.[bench]')"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def unavailable(reason: str) -> None:
    """Skip (locally, printing why) or fail (in CI) a test whose system cannot run here."""
    print(f"skipped: {reason}")
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)
