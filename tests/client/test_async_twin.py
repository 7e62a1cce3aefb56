"""``AsyncClient`` is ``Client`` made async by ``tools/unasync_client.py``: the file in the
tree must be what the tool writes, so the two clients cannot drift apart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_async_client_is_written_from_the_sync_one() -> None:
    spec = importlib.util.spec_from_file_location(
        "unasync_client", ROOT / "tools/unasync_client.py"
    )
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("unasync_client", tool)
    spec.loader.exec_module(tool)
    expected = tool.async_source(tool.SYNC.read_text())
    assert tool.ASYNC.read_text() == expected, "run: .venv/bin/python tools/unasync_client.py"
