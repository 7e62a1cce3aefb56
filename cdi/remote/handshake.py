"""Two gateways prove to each other that they hold the cluster's gateway key (``cdi.auth``)
before any offer or question crosses their link; the key itself never travels.

The side that connects says ``hello`` with a fresh nonce; the other answers with its own nonce
and its proof (an HMAC of both nonces under the key, labelled ``server``); the first checks it
and sends its proof (labelled ``client``, over both nonces and its host name). Fresh nonces on
both sides: no proof can be replayed, and the labels keep one side's proof from serving as the
other's. A side that fails to prove itself gets ``{"ok": false, "code": "unauthenticated"}``
and the link is closed. *What it does not do:* encrypt, or protect a frame after the
handshake from someone on the path between the hosts (docs/security.md).

Both sides also say which version of the protocol they speak (``version``; a gateway that
says none speaks 1, which has no channels): ``cdi/remote/PROTOCOL.md``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
from typing import Any, Final

from cdi.errors import NotAuthenticated, ProtocolError
from cdi.remote.wire import LINK_TIMEOUT_S, receive_header, send_frame

__all__ = ["VERSION", "answer", "greet", "version_of"]

VERSION: Final = 2
"""This gateway's protocol: 1, objects; 2, channels too (``cdi.remote.channels``)."""

_NONCE: Final = 16
_LABEL: Final = b"cdi-gateway-1\0"


def _proof(key: str, side: bytes, *parts: bytes) -> bytes:
    return hmac.new(
        key.encode(), _LABEL + side + b"\0" + b"\0".join(parts), hashlib.sha256
    ).digest()


def _nonce(frame: dict[str, Any] | None, field: str = "nonce") -> bytes:
    value = frame.get(field) if frame is not None else None
    if not isinstance(value, bytes) or not _NONCE <= len(value) <= 64:
        raise ProtocolError(f"a gateway handshake without a valid {field}")
    return value


def version_of(frame: dict[str, Any]) -> int:
    """The protocol version a handshake frame states (1 if none)."""
    version = frame.get("version")
    return version if type(version) is int and version >= 1 else 1


def greet(sock: socket.socket, key: str, host: str, address: str) -> int:
    """The connecting side's handshake on a fresh link to the gateway at ``address``; the
    protocol version that gateway speaks. ``NotAuthenticated`` if it does not prove it holds
    ``key`` (or refuses ours), ``OSError``/``ProtocolError`` if the link fails."""
    ours = secrets.token_bytes(_NONCE)
    sock.settimeout(LINK_TIMEOUT_S)
    send_frame(sock, {"op": "hello", "from": host, "nonce": ours, "version": VERSION})
    reply = receive_header(sock)
    if reply is not None and reply.get("ok") is False:
        raise NotAuthenticated(f"the gateway at {address} refused this one: {reply.get('msg')}")
    theirs = _nonce(reply)
    proof = reply.get("proof") if reply is not None else None
    expected = _proof(key, b"server", ours, theirs)
    if not isinstance(proof, bytes) or not hmac.compare_digest(proof, expected):
        raise NotAuthenticated(
            f"the gateway at {address} did not prove that it holds this cluster's gateway key"
        )
    send_frame(sock, {"op": "proof", "proof": _proof(key, b"client", theirs, ours, host.encode())})
    sock.settimeout(None)
    assert reply is not None
    return version_of(reply)


def answer(sock: socket.socket, key: str) -> str:
    """The accepting side's handshake; the other gateway's host once it proved it holds
    ``key``. ``NotAuthenticated`` (after telling it so) if it did not, ``OSError`` or
    ``ProtocolError`` if the link fails or is not a gateway's."""
    sock.settimeout(LINK_TIMEOUT_S)
    hello = receive_header(sock)
    if hello is None:
        raise ConnectionError("the link closed before the handshake")
    theirs = _nonce(hello)
    host = hello.get("from")
    if hello.get("op") != "hello" or not isinstance(host, str) or not 0 < len(host) <= 256:
        raise ProtocolError("a gateway link must start with hello")
    ours = secrets.token_bytes(_NONCE)
    shown = _proof(key, b"server", theirs, ours)
    send_frame(sock, {"ok": True, "nonce": ours, "proof": shown, "version": VERSION})
    frame = receive_header(sock)
    proof = frame.get("proof") if frame is not None and frame.get("op") == "proof" else None
    expected = _proof(key, b"client", ours, theirs, host.encode())
    if not isinstance(proof, bytes) or not hmac.compare_digest(proof, expected):
        refusal = "this link did not prove that it holds the cluster's gateway key"
        send_frame(sock, {"ok": False, "code": NotAuthenticated.code, "msg": refusal})
        raise NotAuthenticated(f"a link claiming to be host {host!r}: {refusal}")
    sock.settimeout(None)
    return host
