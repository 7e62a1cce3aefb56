"""What a chaos case counts as the minion's own absence: the longest it answered nothing."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from cdi.minion.process import MinionChild
from loadtest.chaos.sampling import MinionWatch
from tests.cdi.conftest import require_native


def _stack_of(socket_path: str) -> Any:
    """What the watch reads of a stack: its hosts and their minions' sockets."""
    return SimpleNamespace(hosts=1, cdi=SimpleNamespace(socket_of=lambda host: socket_path))


def test_the_watch_times_the_longest_the_minion_was_away(tmp_path: Path) -> None:
    require_native()
    socket_path = str(tmp_path / "minion.sock")
    minion = MinionChild(socket_path).start()
    try:
        with MinionWatch(cast(Any, _stack_of(socket_path))) as watch:
            time.sleep(0.2)
            assert watch.longest_s == 0.0  # it answered every time
            minion.send_signal(signal.SIGKILL)
            minion.wait()
            time.sleep(0.5)  # nobody answers
            minion.start()
            time.sleep(0.2)
        assert 0.5 <= watch.longest_s < 30
    finally:
        minion.stop()
