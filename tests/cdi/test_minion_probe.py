"""``python -m cdi.minion.probe``, the minion's liveness probe: 0 while the minion answers;
1 with the reason when it is gone, and when it is alive but stuck (stopped), so that
Kubernetes restarts it in both cases."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.cdi.conftest import MinionProcess


def _probe(socket: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdi.minion.probe", socket, *extra],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_probe_passes_on_a_live_minion_and_fails_on_a_stuck_one(
    minion: MinionProcess,
) -> None:
    alive = _probe(f"unix://{minion.socket_path}")
    assert alive.returncode == 0, alive.stderr
    assert alive.stdout.startswith("ok (")
    os.kill(minion.pid, signal.SIGSTOP)
    try:
        stuck = _probe(minion.socket_path, "--timeout", "1")
    finally:
        os.kill(minion.pid, signal.SIGCONT)
    assert stuck.returncode == 1
    assert "the minion does not answer" in stuck.stderr


def test_the_probe_fails_without_a_minion(tmp_path: Path) -> None:
    gone = _probe(str(tmp_path / "minion.sock"))
    assert gone.returncode == 1
    assert "no CDI minion is listening" in gone.stderr
