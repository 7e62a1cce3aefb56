"""Several hosts on one machine: namespaces are made, joined, and removed without a trace."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.cluster import LocalCluster
from cdi.errors import ConfigError
from cdi.hosts import HostNetwork, namespaces_available
from tests.cdi.conftest import require_native

NETNS, WHY_NOT = namespaces_available()
needs_netns = pytest.mark.skipif(not NETNS, reason=f"no network namespaces here: {WHY_NOT}")

_ECHO = (
    "import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2]))); "
    "s.sendall(s.recv(64))"
)
_SERVE = (
    "import socket,sys; s=socket.create_server((sys.argv[1], 7077)); print('up', flush=True); "
    "c,_=s.accept(); c.sendall(b'host2')"
)
_DIAL = "import socket,sys; print(socket.create_connection((sys.argv[1], 7077)).recv(5).decode())"


def _names() -> tuple[set[str], set[str]]:
    """This process's namespaces and links (a parallel run makes and removes its own)."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    mine = f"cdi{os.getpid()}x"
    return (
        {line.split()[0] for line in namespaces.splitlines() if line.startswith(mine)},
        {name for line in links.splitlines()
         if (name := line.split(":")[1].strip().split("@")[0]).startswith(mine)},
    )  # fmt: skip


def _echo_from(host_argv: list[str], address: str) -> bytes:
    """A server in this (root) namespace; a client on the host dials it and echoes a line."""
    with socket.create_server((address, 0)) as server:
        server.settimeout(20)
        port = server.getsockname()[1]
        client = subprocess.Popen([*host_argv, sys.executable, "-c", _ECHO, address, str(port)])
        try:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"hello from the root namespace")
                return conn.recv(64)
        finally:
            client.wait(timeout=20)


@needs_netns
def test_namespaces_reach_each_other_and_the_root_and_are_removed() -> None:
    before = _names()
    with HostNetwork.create(2, fallback=False) as net:
        assert net.kind == "netns"
        one, two = net.hosts
        assert one.address != two.address and net.gateway not in (one.address, two.address)
        # Each host has its own stack: only its own address besides loopback.
        shown = subprocess.run(one.wrap(["ip", "-o", "-4", "addr"]), capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
        assert one.address in shown and two.address not in shown
        # The root namespace (where Postgres, Redis, S3 and the controller run) is reachable.
        assert _echo_from(one.wrap([]), net.gateway) == b"hello from the root namespace"
        # Host to host: a server in host 2, dialled from host 1.
        with subprocess.Popen(
            two.wrap([sys.executable, "-c", _SERVE, two.address]), stdout=subprocess.PIPE
        ) as server:
            assert server.stdout is not None and server.stdout.readline() == b"up\n"
            dial = one.wrap([sys.executable, "-c", _DIAL, two.address])
            got = subprocess.run(dial, capture_output=True, text=True, timeout=20)
            server.wait(timeout=20)
        assert got.stdout.strip() == "host2", got
        made = _names()
        assert {h.namespace for h in net.hosts} <= made[0]
    assert _names() == before, "the namespaces, veths or bridge outlived close()"


def test_loopback_fallback_gives_distinct_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cdi.hosts.namespaces_available", lambda: (False, "not root"))
    net = HostNetwork.create(3)
    assert net.kind == "loopback" and net.reason == "not root"
    assert len({h.address for h in net.hosts}) == 3
    assert all(h.address.startswith("127.") and h.namespace is None for h in net.hosts)
    assert net.hosts[0].wrap(["true"]) == ["true"]
    # Each address is a real one to bind: two servers on one port, one per host.
    servers = [socket.create_server((h.address, 0)) for h in net.hosts[:1]]
    port = servers[0].getsockname()[1]
    servers.append(socket.create_server((net.hosts[1].address, port)))
    for server in servers:
        server.close()
    with pytest.raises(ConfigError, match="not root"):
        HostNetwork.create(2, fallback=False)


def test_host_count_is_checked() -> None:
    with pytest.raises(ConfigError, match="between 1 and 200"):
        HostNetwork.create(0)


@needs_netns
def test_a_thread_visits_a_host_and_comes_back() -> None:
    """Sockets made during ``visit`` are on that host; after it, the thread is back."""
    with HostNetwork.create(1, fallback=False) as net:
        host = net.hosts[0]
        with host.visit():
            server = socket.create_server((host.address, 0))  # only that host has the address
        with server:
            with pytest.raises(OSError):
                socket.create_server((host.address, 0)).close()  # not here
            port = server.getsockname()[1]
            with socket.create_connection((host.address, port), timeout=5):  # across the bridge
                pass


@needs_netns
def test_a_cluster_removes_only_the_network_it_made(tmp_path: Path) -> None:
    """A network passed to ``LocalCluster.start`` outlives the cluster (the next system of a
    benchmark runs on it); one the cluster made goes with it."""
    require_native()
    before = _names()
    with HostNetwork.create(2, fallback=False) as net:
        with LocalCluster.start(2, tmp_path / "given", network=net):
            pass
        assert _names() != before, "the network passed in was removed with the cluster"
    assert _names() == before
    with LocalCluster.start(2, tmp_path / "made"):
        assert _names() != before
    assert _names() == before
