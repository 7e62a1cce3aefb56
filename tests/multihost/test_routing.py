"""The controller's directory tells a minion where a container lives (host, transfer address)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdi.auth import ClusterCredentials
from cdi.controller.client import ControllerClient
from cdi.controller.models import Changes, ContainerRecord, ObjectRecord
from cdi.controller.process import ControllerChild
from cdi.controller.state import ControllerState
from cdi.errors import UnknownContainer
from cdi.remote.local import LocalService


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_route_names_the_host_and_its_minions_transfer_address() -> None:
    clock = Clock()
    state = ControllerState(clock=clock, monotonic=clock)
    state.register_minion("a", "/a", "10.0.0.2:7100", containers=[ContainerRecord("w1", 1, 0)])
    state.register_minion("b", "/b", "", containers=[ContainerRecord("w2", 2, 0)])
    route = state.route("w1")
    assert (route.host, route.rpc_address, route.alive) == ("a", "10.0.0.2:7100", True)
    assert state.route("w2").rpc_address == ""  # b serves no transfers: the caller says so
    with pytest.raises(UnknownContainer, match="'nobody' on any host"):
        state.route("nobody")
    clock.now += 60  # a's minion stopped heartbeating: the route says so
    assert not state.route("w1").alive


def test_a_home_moves_forward_only() -> None:
    """A cross-host move carries the generation on; the former home's lingering report of an
    older generation must not move the object back."""
    state = ControllerState()
    epoch_a = state.register_minion("a", "/a", objects=[ObjectRecord("k", 8, "w1", 3)])
    epoch_b = state.register_minion("b", "/b")
    state.report_changes("b", epoch_b, Changes(upsert_objects=[ObjectRecord("k", 8, "w2", 4)]))
    assert (state.lookup_object("k").host, state.lookup_object("k").owner) == ("b", "w2")
    state.report_changes("a", epoch_a, Changes(upsert_objects=[ObjectRecord("k", 8, "w1", 3)]))
    assert (state.lookup_object("k").host, state.lookup_object("k").owner) == ("b", "w2")
    # A move back to a (generation 5) is a real one.
    state.report_changes("a", epoch_a, Changes(upsert_objects=[ObjectRecord("k", 8, "w1", 5)]))
    assert state.lookup_object("k").host == "a"
    assert [m.objects for m in state.list_minions()] == [1, 0]


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerChild]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"grpc://127.0.0.1:{port}"
    credentials = ClusterCredentials.ensure(tmp_path / "credentials", ["h2"])
    with ControllerChild(url, str(tmp_path / "controller.log"), credentials) as child:
        yield child


def test_route_through_a_real_controller(controller: ControllerChild) -> None:
    token = controller.credentials.minion_token_file("h2").read_text().strip()
    with ControllerClient(controller.url, token=token) as client:  # as host h2's minion
        client.register_minion(
            "h2", "/run/h2.sock", "10.1.2.3:7100", containers=[ContainerRecord("worker", 5, 0)]
        )
        route = client.route_container("worker")
        assert (route.container_id, route.host, route.rpc_address) == (
            "worker",
            "h2",
            "10.1.2.3:7100",
        )
        assert route.alive
        with pytest.raises(UnknownContainer, match="ghost"):
            client.route_container("ghost")


def test_a_restarted_gateway_never_reuses_a_slot_id(tmp_path: Path) -> None:
    """A client still naming a slot of a gateway that restarted must not reach another
    client's slot: each life of the gateway numbers its slots under a token of its own."""
    slots = []
    for life in range(2):
        service = LocalService(str(tmp_path / f"g{life}.sock"), str(tmp_path / "minion.sock"),
                               "cdi-gateway.h1.out", _never, _never, _never)  # fmt: skip
        service.start()
        try:
            slots += [service._answer({"op": "reserve"}, None)["slot"] for _ in range(2)]
        finally:
            service.close()
    assert len(set(slots)) == 4, slots
    assert all(s.startswith("cdi-gateway.h1.out") for s in slots)


def _never(*args: object) -> Any:
    raise AssertionError("not called by a reserve")
