"""A minion started with --controller keeps the CDI controller's directory current."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import cdi
from cdi.auth import ClusterCredentials
from cdi.controller.client import ControllerClient
from cdi.controller.process import ControllerChild
from tests.cdi.conftest import MinionProcess, start_minion, stop_minion


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 15
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def directory(shared_dir: Path) -> Iterator[tuple[ControllerClient, MinionProcess]]:
    url = f"grpc://127.0.0.1:{free_port()}"
    folder = shared_dir / "directory"
    folder.mkdir()
    credentials = ClusterCredentials.ensure(folder / "credentials", ["host-a"])
    token = str(credentials.minion_token_file("host-a"))
    with ControllerChild(url, str(folder / "controller.log"), credentials) as controller:
        minion = start_minion(
            folder, "--controller", url, "--host", "host-a", "--controller-token-file", token
        )
        try:
            with controller.client() as client:
                yield client, minion
        finally:
            stop_minion(minion)


def test_objects_and_owners_appear_in_the_controller(
    directory: tuple[ControllerClient, MinionProcess],
) -> None:
    controller, minion = directory
    a, b = minion.client("dir-a"), minion.client("dir-b")
    eventually(
        lambda: {c.container_id for c in controller.list_containers()} >= {"dir-a", "dir-b"},
        "both containers in the registry",
    )
    assert controller.lookup_container("dir-a").host == "host-a"
    obj = a.create("dir-key", 1234)
    eventually(lambda: _owner(controller, "dir-key") == "dir-a", "the new object")
    assert controller.lookup_object("dir-key").size == 1234
    obj.transfer("dir-b")
    eventually(lambda: _owner(controller, "dir-key") == "dir-b", "the new owner")
    b.use("dir-key").destroy()
    eventually(lambda: _owner(controller, "dir-key") is None, "the object to leave")
    with pytest.raises(cdi.UnknownContainer):
        controller.lookup_container("nobody")


def _owner(controller: ControllerClient, key: str) -> str | None:
    try:
        return controller.lookup_object(key).owner
    except cdi.ObjectNotFound:
        return None
