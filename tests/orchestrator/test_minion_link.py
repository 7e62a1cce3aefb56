"""The scheduler's link to its minion: it notices a restarted minion (whose objects are gone)
and connects again, tried with a real minion killed and started on the same socket."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import pytest

import cdi
from cdi.minion.process import MinionChild
from orchestrator.scheduler.minion_link import MinionLink


def test_a_restarted_minion_starts_a_new_epoch_and_the_link_works_again() -> None:
    with tempfile.TemporaryDirectory(prefix="cdiflow-link-") as tmp:
        socket = str(Path(tmp) / "minion.sock")
        minion = MinionChild(socket).start()
        try:
            link = MinionLink(socket, "scheduler-link-test")
            assert link.check() is False and link.epoch == 1
            with cdi.connect(socket, "creator") as creator:
                creator.create("before", 16).transfer("scheduler-link-test")
            assert [o["key"] for o in link.list_objects()] == ["before"]

            minion.send_signal(signal.SIGKILL)
            minion.wait()
            with pytest.raises(cdi.MinionUnavailable):
                link.check()  # no minion yet: the caller tries again later
            minion = MinionChild(socket).start()
            assert link.check() is True and link.epoch == 2
            assert link.check() is False
            assert link.list_objects() == []  # what the old minion held is gone
            link.close()
        finally:
            minion.stop()


def test_a_minion_that_kept_its_objects_is_no_new_epoch() -> None:
    """With a state folder the restarted minion holds what it held: the link's client carries
    on under the same registration, and nothing is driven again (docs/minion-restart.md)."""
    with tempfile.TemporaryDirectory(prefix="cdiflow-link-") as tmp:
        socket, state = str(Path(tmp) / "minion.sock"), str(Path(tmp) / "state")
        minion = MinionChild(socket, "--state-dir", state).start()
        try:
            link = MinionLink(socket, "scheduler-link-kept")
            with cdi.connect(socket, "creator") as creator:
                creator.create("kept", 16).transfer("scheduler-link-kept")
            minion.send_signal(signal.SIGKILL)
            minion.wait()
            minion = MinionChild(socket, "--state-dir", state).start()
            assert link.check() is False and link.epoch == 1
            assert [o["key"] for o in link.list_objects()] == ["kept"]
            link.close()
        finally:
            minion.stop()
