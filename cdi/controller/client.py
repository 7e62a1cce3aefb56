"""Typed client of the CDI controller: plain dataclasses in and out, ``cdi.errors`` on failure."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import grpc

from cdi.auth import CONTROLLER_TOKEN_ENV, read_secret
from cdi.controller import convert
from cdi.controller.models import (
    Changes,
    ContainerInfo,
    ContainerRecord,
    MinionInfo,
    ObjectInfo,
    ObjectRecord,
    Restarts,
    Route,
)
from cdi.controller.validation import (
    check_container_record,
    check_object_record,
    check_restarts,
)
from cdi.errors import (
    AccessDenied,
    CDIError,
    ConfigError,
    ControllerUnavailable,
    InvalidArgument,
    NotAuthenticated,
    ObjectNotFound,
    ProtocolError,
    UnknownContainer,
)
from cdi.proto import cdi_pb2 as pb
from cdi.proto import cdi_pb2_grpc as pb_grpc

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ContainerInfo",
    "ControllerClient",
    "MinionInfo",
    "ObjectInfo",
    "Restarts",
    "Route",
    "parse_controller_url",
]

DEFAULT_TIMEOUT_S = 5.0

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", convert.MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", convert.MAX_MESSAGE_BYTES),
    # gRPC's default reconnect backoff grows to 120 s; a restarted controller must be found again
    # within a couple of seconds, so cap it like the reporter's own retry backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # Despite its name, this is the shortest time one connection attempt may take.
    ("grpc.min_reconnect_backoff_ms", 1000),
]

_UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,  # the channel was closed under the call
}


def parse_controller_url(url: str) -> str:
    """Turn ``grpc://host:port`` into the gRPC target ``host:port``; raise ``ConfigError``."""
    usage = f"CDI controller URL {url!r} must look like grpc://host:port"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # e.g. a port that is not a number or out of range
        raise ConfigError(f"{usage}: {exc}") from exc
    if parts.scheme != "grpc":
        raise ConfigError(f"{usage}: scheme {parts.scheme or '(none)'!r} is not supported")
    if not parts.hostname or not port:
        raise ConfigError(f"{usage}: host and a non-zero port are required")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ConfigError(f"{usage}: no user, path, query or fragment is allowed")
    host = parts.hostname
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ControllerClient:
    """Blocking client of one CDI controller; thread-safe, usable as a context manager.

    Every call has a deadline (``timeout``, default 5 s) and carries ``token`` (``cdi.auth``;
    default ``$CDI_CONTROLLER_TOKEN``, else the file ``$CDI_CONTROLLER_TOKEN_FILE``). Errors
    come from ``cdi.errors``: ``ControllerUnavailable`` when the controller does not answer in
    time, ``NotAuthenticated``/``AccessDenied`` for a missing or foreign token or one whose
    role may not do that, ``InvalidArgument`` for malformed input,
    ``UnknownContainer``/``ObjectNotFound`` for lookups that miss.
    """

    def __init__(
        self, url: str, *, timeout: float = DEFAULT_TIMEOUT_S, token: str | None = None
    ) -> None:
        self.url = url
        self.timeout = timeout
        self._target = parse_controller_url(url)
        if token is None:
            token = read_secret(CONTROLLER_TOKEN_ENV, what="controller token")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._closed = False
        # Connecting is lazy: creating the channel never blocks or fails.
        self._channel = grpc.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
        # The generated gRPC module has no type annotations (grpc_tools writes no .pyi for it).
        self._stub = pb_grpc.ControllerStub(self._channel)  # type: ignore[no-untyped-call]

    # -- minion side ---------------------------------------------------------------------------

    def register_minion(
        self,
        host: str,
        socket_path: str,
        rpc_address: str = "",
        *,
        heartbeat_s: float = 0.0,
        containers: Iterable[ContainerRecord] = (),
        objects: Iterable[ObjectRecord] = (),
        restarts: Restarts | None = None,
        timeout: float | None = None,
    ) -> str:
        """Announce a minion with its full snapshot; return the controller's epoch."""
        kept = check_restarts(restarts or Restarts())
        # Checked here too: protobuf would raise a bare ValueError on an out-of-range number.
        request = pb.RegisterMinionRequest(
            host=host,
            socket_path=socket_path,
            rpc_address=rpc_address,
            heartbeat_s=heartbeat_s,
            containers=[
                convert.to_pb(check_container_record(c), pb.ContainerRecord) for c in containers
            ],
            objects=[convert.to_pb(check_object_record(o), pb.ObjectRecord) for o in objects],
            keeps_objects=kept.keeps_objects,
            restarts=kept.restarts,
            kept_objects=kept.kept_objects,
        )
        reply: pb.RegisterMinionResponse = self._invoke("RegisterMinion", request, timeout)
        return reply.epoch

    def report_changes(
        self,
        host: str,
        epoch: str,
        changes: Changes | None = None,
        *,
        timeout: float | None = None,
    ) -> bool:
        """Send one batch (none: a heartbeat). Return True if the minion must re-register."""
        changes = changes or Changes()
        for container in changes.upsert_containers:
            check_container_record(container)
        for obj in changes.upsert_objects:
            check_object_record(obj)
        request = convert.changes_to_pb(host, epoch, changes)
        reply: pb.ReportChangesResponse = self._invoke("ReportChanges", request, timeout)
        return reply.resync_required

    # -- queries -------------------------------------------------------------------------------

    def lookup_container(self, container_id: str, *, timeout: float | None = None) -> ContainerInfo:
        """Return the registration of ``container_id``; raise ``UnknownContainer``."""
        request = pb.LookupContainerRequest(container_id=container_id)
        reply: pb.ContainerInfo = self._invoke(
            "LookupContainer", request, timeout, not_found=UnknownContainer
        )
        return convert.from_pb(reply, ContainerInfo)

    def route_container(self, container_id: str, *, timeout: float | None = None) -> Route:
        """Where a transfer to ``container_id`` goes; raise ``UnknownContainer``."""
        request = pb.LookupContainerRequest(container_id=container_id)
        reply: pb.Route = self._invoke(
            "RouteContainer", request, timeout, not_found=UnknownContainer
        )
        return convert.from_pb(reply, Route)

    def list_containers(
        self, host: str | None = None, *, timeout: float | None = None
    ) -> list[ContainerInfo]:
        """All registered containers, or only those on ``host``; sorted by id."""
        request = pb.ListContainersRequest(host=host or "")
        reply: pb.ListContainersResponse = self._invoke("ListContainers", request, timeout)
        return [convert.from_pb(c, ContainerInfo) for c in reply.containers]

    def lookup_object(self, key: str, *, timeout: float | None = None) -> ObjectInfo:
        """Return the directory entry of ``key``; raise ``ObjectNotFound``."""
        request = pb.LookupObjectRequest(key=key)
        reply: pb.ObjectInfo = self._invoke(
            "LookupObject", request, timeout, not_found=ObjectNotFound
        )
        return convert.from_pb(reply, ObjectInfo)

    def list_objects(
        self,
        *,
        owner: str | None = None,
        host: str | None = None,
        timeout: float | None = None,
    ) -> list[ObjectInfo]:
        """Directory entries matching every given filter; sorted by key."""
        request = pb.ListObjectsRequest(owner=owner or "", host=host or "")
        reply: pb.ListObjectsResponse = self._invoke("ListObjects", request, timeout)
        return [convert.from_pb(o, ObjectInfo) for o in reply.objects]

    def list_minions(self, *, timeout: float | None = None) -> list[MinionInfo]:
        """Every minion the controller heard from since it started; sorted by host."""
        reply: pb.ListMinionsResponse = self._invoke(
            "ListMinions", pb.ListMinionsRequest(), timeout
        )
        return [convert.from_pb(m, MinionInfo) for m in reply.minions]

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the channel; calls still in flight fail with ``ControllerUnavailable``."""
        self._closed = True
        self._channel.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ControllerClient({self.url!r})"

    def _invoke(
        self,
        method: str,
        request: Any,
        timeout: float | None,
        *,
        not_found: type[CDIError] = CDIError,
    ) -> Any:
        if self._closed:
            raise ControllerUnavailable(f"the client of the CDI controller at {self.url} is closed")
        try:
            return getattr(self._stub, method)(
                request,
                timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as exc:
            raise self._translate(exc, method, not_found) from exc
        except ValueError as exc:  # grpc refuses calls on a channel closed by another thread
            if not self._closed:
                raise
            raise ControllerUnavailable(
                f"the client of the CDI controller at {self.url} is closed"
            ) from exc

    def _translate(self, exc: grpc.RpcError, method: str, not_found: type[CDIError]) -> CDIError:
        # Errors raised by a channel are also ``grpc.Call``s, which carry the status.
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
        if code in _UNAVAILABLE:
            return ControllerUnavailable(
                f"the CDI controller at {self.url} did not answer {method} ({code.name}): {details}"
            )
        if code == grpc.StatusCode.NOT_FOUND:
            return not_found(details)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return NotAuthenticated(f"the CDI controller at {self.url}: {details}")
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return AccessDenied(f"the CDI controller at {self.url}: {details}")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidArgument(details)
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return ProtocolError(f"{self.url} does not serve cdi.v1.Controller/{method}: {details}")
        return CDIError(
            f"the CDI controller at {self.url} failed {method} ({code.name}): {details}"
        )
