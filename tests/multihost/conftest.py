"""A CDI cluster of two hosts (network namespaces, or loopback addresses) for these tests."""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

import cdi
from cdi.cluster import LocalCluster
from tests.cdi.conftest import require_native

# Who receives and who sends: the minion itself (native) or the gateway's Python process.
GATEWAYS = {
    "native": ("native", "native"),
    "native-in": ("native", "python"),
    "python": ("python", "python"),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test of ``cluster`` runs against each of ``GATEWAYS``, or against those its module
    names in ``CLUSTER_GATEWAYS`` (where the sides it does not exercise would only repeat it)."""
    if "cluster" in metafunc.fixturenames:
        chosen = getattr(metafunc.module, "CLUSTER_GATEWAYS", list(GATEWAYS))
        metafunc.parametrize("cluster", chosen, indirect=True, scope="module")


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A controller and two minions with gateways, per module and per implementation of the
    receiving and sending sides (the minion itself, or the gateway's Python process): every
    test of the gateway runs against each; at the end no object may be left on either host."""
    require_native()
    with tempfile.TemporaryDirectory(prefix="cdi-hosts-") as folder:
        # A dropped link is noticed after 2 s without progress (10 by default).
        os.environ["CDI_LINK_TIMEOUT_S"] = "2"
        try:
            inbound, outbound = GATEWAYS[str(request.param)]
            sides = ("--gateway-inbound", inbound, "--gateway-outbound", outbound)
            with LocalCluster.start(2, folder, *sides) as running:
                yield running
                for minion in running.minions:
                    deadline = time.monotonic() + 5  # a closed client's objects are reclaimed
                    while _objects_left(minion.socket_path) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    assert _objects_left(minion.socket_path) == [], "objects leaked"
        finally:
            del os.environ["CDI_LINK_TIMEOUT_S"]


def _objects_left(socket_path: str) -> list[str]:
    with cdi.Client(socket_path) as probe:
        return [o["key"] for o in probe.list_objects()]


_NAMES = itertools.count()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Names never used before in this process: a key destroyed by one test may still be in
    the directory (its minion tells it a moment later) when the next test starts."""
    return lambda prefix: f"{prefix}-{os.getpid()}-{next(_NAMES)}"
