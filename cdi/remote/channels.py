"""Channels between hosts: a gateway's relay carries a topic to a ring of the same name on a
reader's host (protocol version 2, ``cdi/remote/PROTOCOL.md``).

A writer on host A grants a reader R that is on host B (``Topic.grant``; A's minion does not
know R, so the client asks its gateway, ``Bridges.open``):

1. A's gateway finds R's host in the controller's directory, opens a link to B's gateway and
   asks ``channel``: B's gateway opens a topic of that name and geometry as a container of its
   own (the *mirror*) and grants R; it answers once R is granted, or refuses
   (``unknown_container``, ``key_exists``...).
2. A's gateway registers a *relay* container, which the writer's topic grants; the relay
   subscribes to the topic as any reader does and sends every message over the link, in order;
   B's gateway publishes each into the mirror, to which R subscribes as on one host. Another
   reader of the same topic on B is granted over the same link (``G``).
3. Back-pressure: the mirror's ``publish`` waits while a reader on B is a ring behind, so B's
   gateway stops reading the link, TCP's window fills, the relay stops reading A's ring and the
   writer's ``publish`` waits or fails (``ChannelFull``) per its topic's policy, as for a slow
   reader on A. Between the two rings sit at most the sockets' buffers.
4. The relay counts as the readers the mirror has admitted (B says how many, ``S``): the
   writer's ``wait_for_readers`` returns once R has joined on B, and from then on R receives
   every message.
5. The writer closes: the relay reads the rest and says ``C``; B closes the mirror, and R reads
   what is left, then gets ``ChannelClosed``. The link breaks (a gateway gone, or nothing, not
   even a heartbeat, crossed for ``CDI_LINK_TIMEOUT_S``): B closes the mirror as broken, so R
   gets ``ChannelBroken`` once it has read what arrived, and A's relay leaves the topic, so
   the writer no longer waits for it.
6. The writer (or a new writer of that name) grants R again: a new link, and a new mirror on
   B, which opens once R (and any other reader there) has let go of the old one (``Mirrors``);
   R subscribes again once its old subscription has ended.
7. Every reader on B has let go of the mirror (each left, or is gone, and none is granted but
   not subscribed yet): nobody there can read it without a new grant, so B says ``E`` and
   closes the mirror and the link, and A's relay leaves the topic. The writer's next grant of
   a reader on B opens a new link (``Bridges.open``, also when its ``G`` crossed the ``E``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import secrets
import select
import socket
import struct
import threading
import time
from typing import Any

import cdi
from cdi import protocol
from cdi.channels import ring as r
from cdi.channels.subscription import Subscription
from cdi.channels.topic import BackPressure, Topic, open_topic
from cdi.errors import (
    AccessTimeout,
    CDIError,
    ChannelBroken,
    ChannelClosed,
    KeyExists,
    NotOwner,
    ObjectNotFound,
    ProtocolError,
    TransferFailed,
    UnknownContainer,
    error_from_code,
)
from cdi.remote.handshake import VERSION, greet
from cdi.remote.routes import RouteCache
from cdi.remote.transport import Transport
from cdi.remote.wire import LINK_TIMEOUT_S, receive_header, send_frame

__all__ = ["CHANNELS_VERSION", "Bridges", "Mirrors"]

log = logging.getLogger(__name__)

CHANNELS_VERSION = 2  # the first protocol version that carries channels
HEARTBEAT_S = max(0.05, LINK_TIMEOUT_S / 4)  # a side that sent nothing for this long says H
SUBSCRIBE_S = 30.0  # how long a relay waits for the writer to grant and admit it
BATCH_BYTES = 1 << 20  # messages already in the ring go out in one send, up to this much
OPEN_RETRY_S = 0.05  # how often a mirror waiting for the old ring of its name tries to open
_HEAD = struct.Struct("!cI")  # a channel frame: kind, then the body's length
_SEATS = struct.Struct("!I")
HELD_CHECK_S = 1.0  # how often a mirror without admitted readers asks who still holds it
MESSAGE, GRANT, CLOSE, HEARTBEAT, ANSWER, SEATS = b"M", b"G", b"C", b"H", b"A", b"S"
END = b"E"  # the receiver: every reader there has let go of the mirror


def _frame(kind: bytes, body: bytes = b"") -> bytes:
    return _HEAD.pack(kind, len(body)) + body


class _Link:
    """One channel's stream between two gateways once its ``channel`` request is answered:
    frames in either direction, read with a deadline (the socket itself stays blocking, so a
    send held back by a slow reader is never cut short)."""

    def __init__(self, sock: socket.socket, limit: int) -> None:
        self.sock = sock
        self._limit = limit
        self._buffer = bytearray()
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._send_lock = threading.Lock()
        self.last_heard = self.last_sent = time.monotonic()

    def next(self, timeout: float) -> tuple[bytes, bytes] | None:
        """The next frame, or ``None`` if it has not (wholly) come within ``timeout``;
        ``ConnectionError`` if the link closed, ``ProtocolError`` if it is not a frame."""
        deadline = time.monotonic() + timeout
        if not self._fill(_HEAD.size, deadline):
            return None
        kind, length = _HEAD.unpack_from(self._buffer)
        if length > self._limit:
            raise ProtocolError(f"a channel frame of {length} bytes (the limit is {self._limit})")
        if not self._fill(_HEAD.size + length, deadline):
            return None
        body = bytes(self._buffer[_HEAD.size : _HEAD.size + length])
        del self._buffer[: _HEAD.size + length]
        return kind, body

    def _fill(self, size: int, deadline: float) -> bool:
        while len(self._buffer) < size:
            wait = deadline - time.monotonic()
            if wait <= 0 or not self._poll.poll(wait * 1000):
                return False
            chunk = self.sock.recv(max(size - len(self._buffer), 256 << 10))
            if not chunk:
                raise ConnectionError("the other gateway closed the link")
            self._buffer += chunk
            self.last_heard = time.monotonic()
        return True

    def silent_for(self) -> float:
        return time.monotonic() - self.last_heard

    def send(self, data: bytes, *, wait: bool = True) -> bool:
        """Send ``data`` whole (``OSError`` if the link fails); with ``wait=False``, only if no
        other thread is sending now (whether it was sent)."""
        if not self._send_lock.acquire(blocking=wait):
            return False
        try:
            self.sock.sendall(data)
            self.last_sent = time.monotonic()
        finally:
            self._send_lock.release()
        return True

    def heartbeat(self) -> None:
        """Say ``H`` if this side sent nothing for a while (and is not sending now)."""
        if time.monotonic() - self.last_sent >= HEARTBEAT_S:
            self.send(_frame(HEARTBEAT), wait=False)

    def cut(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


# ---------------------------------------------------------------------- the writer's host
class Bridges:
    """The writer's host: one bridge per topic and reader host, each a relay and a link."""

    def __init__(
        self,
        transport: Transport,
        key: str,
        host: str,
        minion_socket: str,
        prefix: str,
        routes: RouteCache,
        connect_timeout: float = 3.0,
    ) -> None:
        self._transport = transport
        self._key = key
        self.host = host
        self._minion_socket = minion_socket
        self._prefix = prefix
        self._routes = routes
        self._connect_timeout = connect_timeout
        self._life = secrets.token_hex(4)
        self._ids = itertools.count(1)
        self._bridges: dict[tuple[str, str], _Bridge] = {}
        self._lock = threading.Lock()  # the table
        self._opening = threading.Lock()  # one grant at a time

    def open(self, request: dict[str, Any]) -> dict[str, Any]:
        """The local ``channel`` request: carry topic ``name`` of container ``from`` to reader
        ``to`` on its host; ``{"relay": id}``, the container the topic grants instead."""
        name = request.get("name")
        r.ring_key(name if isinstance(name, str) else "")  # InvalidArgument if no name
        assert isinstance(name, str)
        reader = protocol.check_container_id(request.get("to"))
        writer = protocol.check_container_id(request.get("from"))
        geometry = r.Geometry(
            *(_integer(request.get(f)) for f in ("slots", "slot_bytes", "max_message"))
        )
        try:
            route = self._routes.route(reader, here=True)
        except TransferFailed as exc:
            raise ChannelBroken(str(exc)) from exc
        if route.host == self.host:  # it registered here since the topic's share failed
            raise UnknownContainer(f"{reader!r} is on this host: the topic grants it here")
        with self._opening:
            with self._lock:
                bridge = self._bridges.get((name, route.host))
            if bridge is not None and bridge.alive:
                try:
                    bridge.grant(reader)
                    return {"relay": bridge.relay_id}
                except _Ended:
                    pass  # its readers there had all let go: a new link and mirror
            bridge = self._connect(name, route.host, route.rpc_address, writer, reader, geometry)
            with self._lock:
                self._bridges[(name, route.host)] = bridge
            bridge.start()
            return {"relay": bridge.relay_id}

    def _connect(
        self, name: str, host: str, address: str, writer: str, reader: str, geometry: r.Geometry
    ) -> _Bridge:
        relay_id = f"{self._prefix}{self._life}-{next(self._ids)}"
        client = cdi.connect(self._minion_socket, relay_id)
        client.forwarding = False
        sock: socket.socket | None = None
        try:
            owner = client.describe(r.ring_key(name)).get("owner")
            if owner != writer:
                raise NotOwner(f"{writer} is not the writer of topic {name!r}")
            try:
                sock = self._transport.connect(address, self._connect_timeout)
                version = greet(sock, self._key, self.host, address)
            except OSError as exc:
                why = f"cannot reach the gateway of {host} at {address}: {exc}"
                raise ChannelBroken(why) from exc
            if version < CHANNELS_VERSION:
                raise ChannelBroken(
                    f"the gateway of {host} speaks protocol {version}, which carries no "
                    f"channels (this one speaks {VERSION}): upgrade it"
                )
            request = {
                "op": "channel", "name": name, "readers": [reader], "from": self.host,
                "slots": geometry.slots, "slot_bytes": geometry.slot_bytes,
                "max_message": geometry.max_message,
            }  # fmt: skip
            try:
                sock.settimeout(LINK_TIMEOUT_S)
                send_frame(sock, request)
                reply = receive_header(sock)
                sock.settimeout(None)
            except OSError as exc:
                raise ChannelBroken(f"the link to the gateway of {host} failed: {exc}") from exc
            if reply is None:
                raise ChannelBroken(f"the gateway of {host} closed the link unanswered")
            if not reply.get("ok"):
                code, message = str(reply.get("code", CDIError.code)), str(reply.get("msg", ""))
                raise error_from_code(code, f"the gateway of {host}: {message}")
        except BaseException:
            if sock is not None:
                sock.close()
            client.close()
            raise
        return _Bridge(self, name, host, sock, client, geometry)

    def _gone(self, bridge: _Bridge) -> None:
        with self._lock:
            if self._bridges.get((bridge.name, bridge.host)) is bridge:
                del self._bridges[(bridge.name, bridge.host)]

    def close(self) -> None:
        with self._lock:
            bridges = list(self._bridges.values())
        for bridge in bridges:
            bridge.shut()


class _Ended(ChannelBroken):
    """The other host ended the link (``E``) before it answered a grant."""


class _Bridge:
    """A relay that reads a topic on this host and a link that carries it to one host."""

    def __init__(
        self,
        owner: Bridges,
        name: str,
        host: str,
        sock: socket.socket,
        client: cdi.Client,
        geometry: r.Geometry,
    ) -> None:
        self._owner = owner
        self.name = name
        self.host = host
        self.relay_id = str(client.container_id)
        self._client = client
        self._link = _Link(sock, limit=1 << 20)  # only answers and counts come back
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._sub: Subscription | None = None
        self._seats = 0
        self._seats_lock = threading.Lock()
        self._down = threading.Event()  # the link failed, or the gateway closes
        self._finished = threading.Event()  # the relay said C: the end is expected
        self._ended = threading.Event()  # the other host said E: its readers all let go
        self._relay = threading.Thread(target=self._carry, name=f"cdi-relay-{name}", daemon=True)
        self._listener = threading.Thread(target=self._listen, name="cdi-relay-in", daemon=True)

    @property
    def alive(self) -> bool:
        return not self._down.is_set() and not self._finished.is_set()

    def start(self) -> None:
        self._relay.start()
        self._listener.start()

    def grant(self, reader: str) -> None:
        """Grant one more reader of that host (``G``); its refusal, or ``ChannelBroken``
        (``_Ended`` if the other host ended the link first)."""
        try:
            self._link.send(_frame(GRANT, protocol.pack({"readers": [reader]})))
            answer = self._answers.get(timeout=max(LINK_TIMEOUT_S * 2, 5.0))
        except (OSError, queue.Empty) as exc:
            self.shut()
            if self._ended.is_set():
                raise _Ended(f"{self.host} ended the link carrying {self.name!r}") from exc
            raise ChannelBroken(f"the link to {self.host} carrying {self.name!r} failed") from exc
        if answer is None:
            if self._ended.is_set():
                raise _Ended(f"{self.host} ended the link carrying {self.name!r}")
            raise ChannelBroken(f"the link to {self.host} carrying {self.name!r} broke")
        if not answer.get("ok"):
            code = str(answer.get("code", CDIError.code))
            raise error_from_code(code, f"the gateway of {self.host}: {answer.get('msg', '')}")

    def shut(self) -> None:
        self._down.set()
        self._link.cut()

    # ------------------------------------------------------------------ the relay
    def _carry(self) -> None:
        clean = False
        try:
            sub = Subscription(self._client, self.name, SUBSCRIBE_S, 0, relay=True)
            with self._seats_lock:
                self._sub = sub
                sub.relay_seats(self._seats)
            try:
                clean = self._forward(sub)
            finally:
                with self._seats_lock:
                    self._sub = None
                sub.close(linger=0 if not clean else 1.0)
        except (OSError, CDIError) as exc:
            if not self._down.is_set():
                log.warning("relay of %r to %s: %s", self.name, self.host, exc)
        finally:
            if not clean:
                self.shut()
            self._client.close()
            self._owner._gone(self)

    def _forward(self, sub: Subscription) -> bool:
        """Send every message, in order, until the writer closes (then ``C``: True) or the
        link fails (False)."""
        link = self._link
        while not self._down.is_set():
            try:
                message = sub.receive(HEARTBEAT_S)
            except AccessTimeout:
                continue
            except ChannelClosed:
                self._finished.set()
                link.send(_frame(CLOSE))
                return True
            frames, size = [_HEAD.pack(MESSAGE, len(message)), message], len(message)
            while size < BATCH_BYTES and sub.available():
                try:
                    message = sub.receive(HEARTBEAT_S)
                except (AccessTimeout, ChannelClosed):
                    break  # the rest next time round
                frames += [_HEAD.pack(MESSAGE, len(message)), message]
                size += len(message)
            link.send(b"".join(frames))
        return False

    # ------------------------------------------------------------------ what comes back
    def _listen(self) -> None:
        link = self._link
        try:
            while not self._down.is_set():
                frame = link.next(HEARTBEAT_S / 2)
                if frame is None:
                    if link.silent_for() > LINK_TIMEOUT_S:
                        raise TimeoutError(f"nothing from {self.host} for {LINK_TIMEOUT_S} s")
                    link.heartbeat()
                    continue
                kind, body = frame
                if kind == ANSWER:
                    self._answers.put(protocol.unpack(body))
                elif kind == SEATS:
                    self._set_seats(_SEATS.unpack(body)[0])
                elif kind == END:
                    log.info("the readers of %r on %s all let go: its link ends", self.name,
                             self.host)  # fmt: skip
                    self._ended.set()
                    break
                elif kind != HEARTBEAT:
                    raise ProtocolError(f"a channel frame of kind {kind!r} from {self.host}")
                else:
                    link.heartbeat()
        except (OSError, CDIError) as exc:
            if not self._finished.is_set() and not self._down.is_set():
                log.warning("the link carrying %r to %s broke: %s", self.name, self.host, exc)
        finally:
            self._answers.put(None)
            if not self._finished.is_set():
                self.shut()
            else:
                self._down.set()
            self._relay.join(LINK_TIMEOUT_S)
            self._link.sock.close()

    def _set_seats(self, seats: int) -> None:
        with self._seats_lock:
            self._seats = seats
            if self._sub is not None:
                with contextlib.suppress(ValueError):  # it closed meanwhile
                    self._sub.relay_seats(seats)


# ---------------------------------------------------------------------- the reader's host
class Mirrors:
    """The readers' host: a ``channel`` request becomes a topic there that a gateway's
    container writes, fed by the link it came on.

    A topic granted again after its link broke or its writer closed (a new link, from the same
    host) finds the old mirror's ring still here while a reader holds it: a reader lets go of
    a ring only once it has read to its end (then ``ChannelBroken`` or ``ChannelClosed``) or
    closes its subscription, and the name is the ring's key. The request is accepted all the
    same: the new mirror opens once the old ring is gone and grants its readers then. No reader
    can have joined it before, so the messages that come meanwhile are owed to nobody and are
    dropped, as a topic without readers drops them; old and new streams never mix."""

    def __init__(self, minion_socket: str, prefix: str) -> None:
        self._minion_socket = minion_socket
        self._prefix = prefix
        self._life = secrets.token_hex(4)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the table, and opening a mirror's ring
        self._serving: dict[str, list[_Mirror]] = {}  # by name: its mirrors fed now, oldest first

    def serve(self, sock: socket.socket, request: dict[str, Any]) -> None:
        """Answer ``request`` and, once the mirror is accepted, feed it until the link ends."""
        client = cdi.connect(self._minion_socket, f"{self._prefix}{self._life}-{next(self._ids)}")
        client.forwarding = False  # its readers are on this host
        try:
            name, readers = request.get("name"), request.get("readers")
            if not isinstance(name, str) or not isinstance(readers, list):
                raise ProtocolError(f"a malformed channel request: {request!r}")
            r.ring_key(name)  # InvalidArgument if it names no topic
            geometry = r.Geometry(
                *(_integer(request.get(f)) for f in ("slots", "slot_bytes", "max_message"))
            )
            ids = [protocol.check_container_id(c) for c in readers]
            mirror = _Mirror(self, sock, client, name, geometry, ids, str(request.get("from")))
            self._enter(mirror)
        except CDIError as exc:
            client.close()
            send_frame(sock, {"ok": False, "code": exc.code, "msg": str(exc)})
            return
        try:
            send_frame(sock, {"ok": True})
            mirror.run()
        finally:
            self._leave(mirror)
            client.close()

    def _enter(self, mirror: _Mirror) -> None:
        """Take ``mirror`` into the table and open its ring, or leave it waiting for the old
        ring of its name; ``KeyExists`` if a container of this host writes that topic or
        another host's is carried here."""
        with self._lock:
            serving = self._serving.setdefault(mirror.name, [])
            rival = next((m for m in serving if m.peer != mirror.peer), None)
            if rival is not None:
                raise KeyExists(f"topic {mirror.name!r} is carried here from {rival.peer}")
            serving.append(mirror)
            try:
                self._open(mirror, first=True)
            except BaseException:
                self._forget(mirror)
                raise

    def retry(self, mirror: _Mirror) -> None:
        """Open a waiting mirror's ring if its name is free now (``KeyExists`` as above)."""
        with self._lock:
            self._open(mirror, first=False)

    def _open(self, mirror: _Mirror, *, first: bool) -> None:
        """(Under the lock.) Open ``mirror``'s ring unless the name's ring is still here: an
        old mirror's (it waits) or a local writer's (``KeyExists``). The newest link of a topic
        is the one that opens: an older one that still waits has lost its writer's side."""
        if self._serving[mirror.name][-1] is not mirror:
            return
        client, key = mirror.client, r.ring_key(mirror.name)
        try:
            topic = open_topic(
                client, mirror.name, readers=mirror.readers if first else (),
                policy=BackPressure.BLOCK, slots=mirror.geometry.slots,
                slot_bytes=mirror.geometry.slot_bytes, max_message=mirror.geometry.max_message,
            )  # fmt: skip
        except KeyExists:
            try:
                owner = str(client.describe(key).get("owner"))
            except ObjectNotFound:
                return  # it went meanwhile: the next try
            if not owner.startswith(self._prefix):
                raise KeyExists(f"{owner} writes topic {mirror.name!r} on this host") from None
            return
        if not first:
            for reader in mirror.readers:  # one by one: a reader gone meanwhile is skipped
                try:
                    topic.grant([reader])
                except UnknownContainer:
                    log.info("%s left before the mirror of %r opened", reader, mirror.name)
        mirror.opened(topic)

    def _leave(self, mirror: _Mirror) -> None:
        with self._lock:
            self._forget(mirror)

    def _forget(self, mirror: _Mirror) -> None:
        serving = self._serving.get(mirror.name, [])
        if mirror in serving:
            serving.remove(mirror)
        if not serving:
            self._serving.pop(mirror.name, None)


class _Mirror:
    """One link's mirror: its topic once open (``None`` while the old ring of its name is
    still held), the readers to grant when it opens, and the link that feeds it."""

    def __init__(
        self,
        owner: Mirrors,
        sock: socket.socket,
        client: cdi.Client,
        name: str,
        geometry: r.Geometry,
        readers: list[str],
        peer: str,
    ) -> None:
        self._owner = owner
        self.client = client
        self.name = name
        self.geometry = geometry
        self.readers = readers
        self.peer = peer
        self.topic: Topic | None = None
        self._opened = threading.Event()
        self._link = _Link(sock, limit=max(geometry.max_message, 1 << 20))
        self._stop = threading.Event()
        self._granting = threading.Lock()  # a grant, or the decision that no reader is left
        self._ended = False  # said E: every reader here had let go

    def opened(self, topic: Topic) -> None:
        self.topic = topic
        self._opened.set()

    def run(self) -> None:
        keeper = threading.Thread(target=self._keep, name="cdi-mirror-keep", daemon=True)
        keeper.start()
        broken = True
        try:
            broken = not self._feed()
        except (OSError, CDIError) as exc:
            log.warning("the link feeding %r from %s broke: %s", self.name, self.peer, exc)
        finally:
            self._stop.set()
            self._opened.set()
            if self.topic is not None:
                self.topic.members_changed.set()
            keeper.join()
            if self.topic is not None:
                self.topic.close(broken=broken)

    def _feed(self) -> bool:
        """Publish what comes until ``C`` (True) or the link's end (an error)."""
        link, retry_at = self._link, 0.0
        while True:
            if self.topic is None and time.monotonic() >= retry_at:
                self._owner.retry(self)
                retry_at = time.monotonic() + OPEN_RETRY_S
            try:
                frame = link.next(HEARTBEAT_S if self.topic is not None else OPEN_RETRY_S)
            except OSError:
                if self._ended:  # the other side closed the link after our E
                    return True
                raise
            if self._ended:
                return True
            if frame is None:
                if link.silent_for() > LINK_TIMEOUT_S:
                    raise TimeoutError(f"nothing from {self.peer} for {LINK_TIMEOUT_S} s")
                continue
            kind, body = frame
            if kind == MESSAGE:
                if self.topic is not None:  # else no reader has joined: owed to nobody
                    self.topic.publish(body)
            elif kind == GRANT:
                self._grant(body)
            elif kind == CLOSE:
                return True
            elif kind != HEARTBEAT:
                raise ProtocolError(f"a channel frame of kind {kind!r} from {self.peer}")

    def _grant(self, body: bytes) -> None:
        with self._granting:
            if self._ended:
                return  # unanswered: the other side grants over a new link
            self._grant_here(body)

    def _grant_here(self, body: bytes) -> None:
        try:
            readers = protocol.unpack(body).get("readers")
            if not isinstance(readers, list):
                raise ProtocolError("a grant names a list of readers")
            ids = [protocol.check_container_id(c) for c in readers]
            if self.topic is not None:
                self.topic.grant(ids)
            else:  # granted when the ring opens
                self.readers.extend(c for c in ids if c not in self.readers)
            answer: dict[str, Any] = {"ok": True}
        except CDIError as exc:
            answer = {"ok": False, "code": exc.code, "msg": str(exc)}
        self._link.send(_frame(ANSWER, protocol.pack(answer)))

    def _keep(self) -> None:
        """Tell the relay how many readers joined here (``S``, as they join or leave), and
        that we are here (``H``); say ``E`` once no reader here holds the mirror."""
        seats, check_at = 0, 0.0
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                topic = self.topic
                if topic is None:
                    self._opened.wait(HEARTBEAT_S / 2)
                else:
                    topic.members_changed.wait(min(HEARTBEAT_S / 2, HELD_CHECK_S))
                    topic.members_changed.clear()
                    now = len(topic.readers)
                    if now != seats:
                        self._link.send(_frame(SEATS, _SEATS.pack(now)))
                        seats = now
                    if now == 0 and time.monotonic() >= check_at:
                        check_at = time.monotonic() + HELD_CHECK_S
                        if self._end_if_unheld(topic):
                            return
                self._link.heartbeat()

    def _end_if_unheld(self, topic: Topic) -> bool:
        """Say ``E`` if no reader here holds the mirror (none admitted, none granted and not
        subscribed yet): nobody here can read it without a new grant. Whether it did."""
        with self._granting:
            if topic.readers:
                return False
            key = r.ring_key(self.name)
            listed = self.client.list_objects(key)
            if listed and listed[0].get("readers"):
                return False
            self._ended = True
            self._link.send(_frame(END))
        log.info("every reader of %r here let go: the link from %s ends", self.name, self.peer)
        return True


def _integer(value: object) -> int:
    if type(value) is not int:
        raise ProtocolError(f"a channel's geometry is whole numbers, not {value!r}")
    return value
