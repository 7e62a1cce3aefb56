"""Sending to another host: the minion itself, or the gateway's Python process (``cluster``
runs each test against both), and what a sender does when the other host does not answer."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cdi
from cdi.cluster import LocalCluster
from tests.multihost.test_cross_host import _digest, _filled, cid

Unique = Callable[[str], str]


def _binary_pid(socket_path: str) -> int:
    """The pid of the minion binary serving ``socket_path`` (its launcher's child)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"cdi-minion") and socket_path.encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no minion binary serves {socket_path}")


def _keys(socket_path: str) -> list[str]:
    with cdi.Client(socket_path) as probe:
        return [o["key"] for o in probe.list_objects()]


def test_a_sending_minion_needs_no_python_on_the_path(
    request: pytest.FixtureRequest, cluster: LocalCluster, unique: Unique
) -> None:
    """With the minion sending, a client asks its gateway for its slot once and never to
    forward: every crossing is one ``transfer … via`` answered by the minion."""
    if request.node.callspec.params["cluster"] != "native":
        pytest.skip("the gateway's Python process sends here")
    with (
        cdi.connect(cluster.minions[0].socket_path, unique("a")) as a,
        cdi.connect(cluster.minions[1].socket_path, unique("b")) as b,
    ):
        asked: list[str] = []
        real = a._session.gateway.call

        def spy(op: str, **args: Any) -> dict[str, Any]:
            asked.append(op)
            return real(op, **args)

        a._session.gateway.call = spy  # type: ignore[method-assign]
        for size in (10_000, 3_000_001):
            key = unique("k")
            obj, digest = _filled(a, key, size)
            obj.transfer(cid(b))
            assert key not in _keys(cluster.minions[0].socket_path)
            with b.use(key).view(timeout=10) as got:
                assert _digest(got) == digest
            b.use(key).destroy()
        assert asked == ["reserve"]


def test_an_offer_left_unanswered_is_in_doubt_until_the_other_host_says(
    request: pytest.FixtureRequest, cluster: LocalCluster, unique: Unique
) -> None:
    """The other host's minion stops after the whole offer went out: the sender's link times
    out, ``resolve`` gets no answer either, and the caller hears the outcome is in doubt; the
    object is nobody's to use here meanwhile. Once the other host goes on, it commits, says
    so, and the copy here goes. (A Python receiver answers ``resolve`` while its minion is
    stopped: it fences the transfer, and the object is back with its sender at once.)"""
    fences = request.node.callspec.params["cluster"] == "python"
    here, there = cluster.minions[0].socket_path, cluster.minions[1].socket_path
    with cdi.connect(here, unique("a")) as a, cdi.connect(there, unique("b")) as b:
        warm, _ = _filled(a, unique("warm"), 100)
        warm.transfer(cid(b))  # the slot and the route are known: the next offer goes at once
        b.use(warm.key).destroy()
        key = unique("k")
        obj, digest = _filled(a, key, 10_000)
        stopped = _binary_pid(there)
        errors: list[BaseException] = []

        def send() -> None:
            try:
                obj.transfer(cid(b))
            except BaseException as exc:
                errors.append(exc)

        os.kill(stopped, signal.SIGSTOP)
        try:
            sender = threading.Thread(target=send)
            sender.start()
            sender.join(60)
            assert not sender.is_alive()
            assert len(errors) == 1 and isinstance(errors[0], cdi.TransferFailed), errors
            assert ("in doubt" in str(errors[0])) is not fences, errors[0]
            if not fences:
                with pytest.raises(cdi.NotOwner):
                    a.use(key, check=False).access(timeout=0)
        finally:
            os.kill(stopped, signal.SIGCONT)
        if fences:
            with a.use(key, check=False).view(timeout=10) as back:
                assert _digest(back) == digest
            a.use(key).destroy()
            return
        with b.use(key, check=False).view(timeout=20) as got:
            assert _digest(got) == digest
        deadline = time.monotonic() + 20
        while key in _keys(here):
            assert time.monotonic() < deadline, "the copy here outlived the other host's commit"
            time.sleep(0.1)
        b.use(key).destroy()
