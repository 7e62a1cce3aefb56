"""The worker's keeper as its container's first process (PID 1, as Kubernetes runs it): it
reaps what a body leaves behind, and a stop before a body set up its own handlers ends it with
SIGTERM's status. Run in a PID namespace of its own (``unshare``), where it is PID 1."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# The keeper, as `cdiflow worker` runs it, with bodies that stand for the worker's: the first
# starts a process (a task's) and ends as a body does whose task would not stop; the second
# says whether that process, orphaned and ended, was reaped or stays a zombie.
ORPHAN = """
import os, subprocess, sys, time
from pathlib import Path
from orchestrator.worker.execution import EXIT_TASK_STUCK
from orchestrator.worker.keeper import keep

assert os.getpid() == 1, os.getpid()
marker = Path(sys.argv[1])

def body() -> int:
    if not marker.exists():
        left = subprocess.Popen(["sleep", "0.3"])  # the task's, never waited for
        marker.write_text(str(left.pid))
        return EXIT_TASK_STUCK
    pid = int(marker.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return 0  # reaped
        time.sleep(0.05)  # running, or a zombie its parent may reap any moment now
    return 5 if state == "Z" else 6  # not EXIT_TASK_STUCK: the keeper ends with it

sys.exit(keep(body, "worker-pid1"))
"""

# A body that has not installed its handlers yet (waiting for Redis or its minion).
STOPPED = """
import os, sys, time
from orchestrator.pid_one import stop_on_sigterm
from orchestrator.worker.keeper import keep

stop_on_sigterm()  # what `cdiflow` does first
def body() -> int:
    print("body up", flush=True)
    time.sleep(60)
    return 0

sys.exit(keep(body, "worker-pid1"))
"""


# The same, with the window between a body's fork and its handlers widened (a busy machine):
# the stop is sent while the new body still has the keeper's handler.
STOPPED_WHILE_FORKED = """
import ctypes, sys, time
from orchestrator.pid_one import stop_on_sigterm
from orchestrator.worker.keeper import keep

stop_on_sigterm()
real = ctypes.CDLL
class Slow:  # what the body loads first, right after the fork
    def __init__(self, *args, **kwargs):
        self._lib = real(*args, **kwargs)
    def __getattr__(self, name):
        print("forked", flush=True)
        time.sleep(1.0)
        return getattr(self._lib, name)
ctypes.CDLL = Slow
def body() -> int:
    print("body up", flush=True)
    time.sleep(60)
    return 0

sys.exit(keep(body, "worker-pid1"))
"""


def _in_own_pid_namespace(script: str, *args: str) -> list[str]:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to run a process as PID 1 of a PID namespace")
    return ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-P", "-c", script,
            *args]  # fmt: skip


def test_as_pid_1_the_keeper_reaps_a_process_its_body_left(tmp_path: Path) -> None:
    done = subprocess.run(
        _in_own_pid_namespace(ORPHAN, str(tmp_path / "left")), cwd=ROOT, capture_output=True,
        text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # 5: it left a zombie


def test_as_pid_1_a_stop_before_the_body_is_set_up_ends_it_with_sigterms_status() -> None:
    with subprocess.Popen(
        _in_own_pid_namespace(STOPPED), cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "body up"
            os.kill(_pid_one_of(proc.pid), signal.SIGTERM)  # as the kubelet stops a container
            assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            if proc.poll() is None:
                proc.kill()


def _pid_one_of(unshare_pid: int) -> int:
    """The namespace's PID 1 as this machine sees it: unshare's child."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("unshare started no process")


def test_as_pid_1_a_stop_while_a_body_is_being_forked_ends_it_with_sigterms_status() -> None:
    with subprocess.Popen(
        _in_own_pid_namespace(STOPPED_WHILE_FORKED), cwd=ROOT, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "forked"
            os.kill(_pid_one_of(proc.pid), signal.SIGTERM)  # forwarded within the window
            assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            if proc.poll() is None:
                proc.kill()
