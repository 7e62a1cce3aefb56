"""The supervisor's watch over alive stamps, on real child processes: a process whose stamp stops
moving is killed and restarted; one that renews it is left alone."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from cdi.child import ChildProcess
from orchestrator.contract.alive import ALIVE_FILE_ENV, AliveStamp, stamp_age
from orchestrator.stack import RestartPolicy
from orchestrator.stack.supervision import Supervisor

# Renews its stamp as the scheduler's loop does, every 0.1 s, until stopped by a signal.
RENEWING = """
import time
from orchestrator.contract.alive import AliveStamp
stamp = AliveStamp.from_env()
stamp.every_s = 0.1
while True:
    stamp.renew()
    time.sleep(0.1)
"""
# The child stamps every 0.1 s once started (its start has the supervisor's start grace):
# 2 s without a stamp leaves room for a loaded 2-core machine.
STALL_AFTER_S = 2.0
# Takes a while before its first stamp, as the scheduler's imports do on a loaded machine.
SLOW_START_S = 2 * STALL_AFTER_S
SLOW_STARTER = f"import time; time.sleep({SLOW_START_S})\n" + RENEWING


def _eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g}s: {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def _child(tmp_path: Path, name: str, code: str) -> Iterator[tuple[ChildProcess, Path]]:
    stamp = tmp_path / f"{name}.alive"
    child = ChildProcess(
        name,
        [sys.executable, "-c", code],
        env={"PATH": "/usr/bin:/bin", ALIVE_FILE_ENV: str(stamp)},
        log_path=tmp_path / f"{name}.log",
    )
    child.start()
    try:
        yield child, stamp
    finally:
        child.stop(5.0)


@pytest.fixture
def renewing(tmp_path: Path) -> Iterator[tuple[ChildProcess, Path]]:
    with _child(tmp_path, "renewing", RENEWING) as running:
        yield running


def _supervise(child: ChildProcess, stamp: Path) -> Supervisor:
    # The start grace is the default (a minute): ``stall_after`` counts from the first stamp.
    policy = RestartPolicy(initial_backoff=0.05, stall_after=STALL_AFTER_S)
    supervisor = Supervisor([child], policy, interval=0.1, alive_files={child.name: stamp})
    supervisor.start()
    return supervisor


def test_a_process_that_renews_its_stamp_is_left_alone(
    renewing: tuple[ChildProcess, Path],
) -> None:
    child, stamp = renewing
    pid = child.pid
    supervisor = _supervise(child, stamp)
    try:
        time.sleep(3 * STALL_AFTER_S)
        assert (supervisor.stalls(child.name), supervisor.restarts(child.name)) == (0, 0)
        assert child.pid == pid and child.poll() is None
    finally:
        supervisor.stop()


def test_a_stopped_process_is_killed_and_restarted_and_its_successor_kept(
    renewing: tuple[ChildProcess, Path],
) -> None:
    child, stamp = renewing
    first = child.pid
    assert first is not None
    supervisor = _supervise(child, stamp)
    try:
        _eventually(stamp.exists, "the first stamp")
        child.send_signal(signal.SIGSTOP)  # stuck: alive, holding whatever it holds
        _eventually(lambda: supervisor.restarts(child.name) == 1, "a restart")
        assert supervisor.stalls(child.name) == 1
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"
        second = child.pid
        assert second is not None and second != first
        # The successor renews the stamp the first one left: it is not taken for stuck.
        time.sleep(3 * STALL_AFTER_S)
        assert (supervisor.stalls(child.name), child.pid) == (1, second)
    finally:
        supervisor.stop()


def test_a_slow_start_is_not_taken_for_a_stall(tmp_path: Path) -> None:
    """Its first stamp comes after more than ``stall_after``: it is starting, left alone, and
    once it stamps, a stop is caught as soon as ever."""
    with _child(tmp_path, "slow", SLOW_STARTER) as (child, stamp):
        first = child.pid
        supervisor = _supervise(child, stamp)
        try:
            _eventually(stamp.exists, "the first stamp")
            assert (supervisor.stalls(child.name), child.pid) == (0, first)
            child.send_signal(signal.SIGSTOP)
            _eventually(lambda: supervisor.stalls(child.name) == 1, "the stop caught")
        finally:
            supervisor.stop()


def test_a_process_that_never_stamps_counts_from_its_launch(tmp_path: Path) -> None:
    missing = tmp_path / "never"
    assert stamp_age(missing, running_s=0.5) == 0.5
    old = tmp_path / "old"
    old.touch()
    earlier = time.time() - 100.0
    os.utime(old, (earlier, earlier))
    assert stamp_age(old, running_s=2.0) == 2.0  # left by a process before this one
    assert 99.0 < stamp_age(old, running_s=1000.0) < 101.0


def test_a_stamp_that_cannot_be_written_does_not_stop_its_process(tmp_path: Path) -> None:
    stamp = AliveStamp(tmp_path / "no-such-folder" / "alive", every_s=0.0)
    stamp.renew()  # logged once, never raised
    stamp.renew()
    assert not (tmp_path / "no-such-folder").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full to stand for a full disk")
def test_a_full_disk_does_not_keep_a_process_from_starting() -> None:
    """Its log cannot take a byte (``/dev/full`` answers every write with ENOSPC): the process
    starts all the same, as the supervisor's restart of it must while the disk is full."""
    child = ChildProcess("full", ["/bin/sh", "-c", "exit 3"], log_path=Path("/dev/full"))
    child.start()
    _eventually(lambda: child.poll() is not None, "the child to run and exit")
    assert child.poll() == 3
