"""Gateways between hosts take objects only from a gateway that proves it holds the cluster's
gateway key, and send them only to one that proves it too (``cdi.remote.handshake``)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

import cdi
from cdi.auth import new_key
from cdi.cluster import LocalCluster
from cdi.errors import TransferFailed
from cdi.remote import handshake
from cdi.remote.handshake import answer
from cdi.remote.outbound import Sender
from cdi.remote.transport import TcpTransport, parse_address
from cdi.remote.wire import receive_header, send_frame

Unique = Callable[[str], str]


def _gateway_of(cluster: LocalCluster, host: str) -> str:
    with cluster.controller.client() as directory:
        return next(m.rpc_address for m in directory.list_minions() if m.host == host)


def _offer(to: str, key: str, size: int) -> dict[str, object]:
    return {"op": "offer", "xfer": key, "key": key, "size": size, "to": to, "recovery": "",
            "isolation": "cooperative", "from": "intruder", "generation": 1}  # fmt: skip


def _refused(link: socket.socket) -> bool:
    """Whether the gateway turned the link down: a refusal, or the link closed on us."""
    try:
        reply = receive_header(link)
    except OSError:
        return True
    return reply is None or reply.get("ok") is False


@pytest.mark.parametrize("intruder", ["offers at once", "says hello, then a wrong proof"])
def test_a_link_without_the_gateway_key_hands_over_nothing(
    cluster: LocalCluster, unique: Unique, intruder: str
) -> None:
    """Whoever reaches a gateway's port without the key cannot hand an object to a container
    there (the gateway refuses, and creates nothing), nor ask about transfers."""
    receiver = cdi.connect(cluster.minions[1].socket_path, unique("b"))
    assert receiver.container_id is not None
    key, payload = unique("forged"), b"not from this cluster"
    address = _gateway_of(cluster, receiver.host or "")
    try:
        with socket.create_connection(parse_address(address), timeout=10) as link:
            if intruder == "says hello, then a wrong proof":
                send_frame(link, {"op": "hello", "from": "intruder", "nonce": b"n" * 16})
                challenge = receive_header(link)
                assert challenge is not None and challenge.get("ok") is True
                send_frame(link, {"op": "proof", "proof": b"p" * 32})
            with contextlib.suppress(OSError):  # the gateway may close before it all goes
                send_frame(link, _offer(receiver.container_id, key, len(payload)),
                           memoryview(payload))  # fmt: skip
                send_frame(link, {"op": "resolve", "xfer": key})
            assert _refused(link)
        with pytest.raises(cdi.ObjectNotFound):
            receiver.use(key).access(timeout=0)
    finally:
        receiver.close()


@contextlib.contextmanager
def _impostor(key: str) -> Iterator[str]:
    """A gateway that holds another key: it answers the handshake with its own proof."""
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"

    def serve() -> None:
        with contextlib.suppress(OSError, cdi.CDIError):
            conn, _ = server.accept()
            with conn:
                answer(conn, key)
                receive_header(conn)  # whatever it is offered

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield address
    finally:
        server.close()
        thread.join(5)


def test_a_gateway_sends_nothing_to_one_that_cannot_prove_the_key() -> None:
    """An address that is not this cluster's gateway (another cluster's, or a process that
    took the port) gets no payload: the transfer fails, not in doubt, and no outcome it
    claims is believed."""
    sender = Sender(TcpTransport(), new_key(), "host1")
    with _impostor(new_key()) as address:
        with pytest.raises(TransferFailed, match="did not prove") as failed:
            sender.send(address, {"key": "k", "to": "b"}, memoryview(b"secret bytes"))
        assert not failed.value.in_doubt
    with _impostor(new_key()) as address:
        assert sender.resolve(address, "some-transfer") == "unknown"
    sender.close()


def test_resolve_knows_a_refused_connection_from_one_it_cannot_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused connection means no gateway (so no copy) is there: aborted. A link that
    fails otherwise says nothing: unknown, and the sender keeps asking."""
    monkeypatch.setattr(handshake, "LINK_TIMEOUT_S", 0.5)  # the silent one: not 10 s
    sender = Sender(TcpTransport(), new_key(), "host1", connect_timeout=1.0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens there
    assert sender.resolve(closed, "x") == "aborted"
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        assert sender.resolve(address, "x") == "unknown"
    sender.close()
