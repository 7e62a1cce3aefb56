"""The CDI controller's gRPC service (``cdi.v1.Controller``) over a ``ControllerState``."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import TypeVar

import grpc

from cdi.auth import Credential, Role, check_key, require, verify_token
from cdi.controller import convert
from cdi.controller.models import ContainerRecord, ObjectRecord, Restarts
from cdi.controller.state import ControllerState
from cdi.errors import (
    AccessDenied,
    ConfigError,
    InvalidArgument,
    NotAuthenticated,
    ObjectNotFound,
    UnknownContainer,
)
from cdi.proto import cdi_pb2 as pb
from cdi.proto import cdi_pb2_grpc as pb_grpc

__all__ = ["ControllerServicer", "run", "serve"]

log = logging.getLogger(__name__)

_SERVER_OPTIONS = [
    # gRPC enables SO_REUSEPORT by default, which would let a second controller bind the same
    # port silently and split the minions between two directories.
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", convert.MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", convert.MAX_MESSAGE_BYTES),
]

_T = TypeVar("_T")
_BEARER = "bearer "


def _answer(context: grpc.ServicerContext, call: Callable[[], _T]) -> _T:
    """Run ``call``, turning the state's and the credentials' errors into gRPC status codes
    with their message."""
    try:
        return call()
    except NotAuthenticated as exc:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
    except AccessDenied as exc:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
    except InvalidArgument as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except (UnknownContainer, ObjectNotFound) as exc:
        context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
    raise AssertionError("unreachable: ServicerContext.abort always raises")


class ControllerServicer(pb_grpc.ControllerServicer):
    """Translates ``cdi.v1`` requests into ``ControllerState`` calls, for callers whose token
    (``cdi.auth``) allows them: a minion speaks for its own host only and may route and
    locate; listing and looking up the directory is for readers."""

    def __init__(self, state: ControllerState, key: str) -> None:
        self._state = state
        self._key = key

    def _credential(self, context: grpc.ServicerContext) -> Credential:
        token = None
        for name, value in context.invocation_metadata() or ():
            bearer = isinstance(value, str) and value[: len(_BEARER)].lower() == _BEARER
            if name == "authorization" and bearer:
                token = str(value)[len(_BEARER) :].strip()
        return verify_token(self._key, token)

    def _allow(self, context: grpc.ServicerContext, role: Role, *, host: str | None = None) -> None:
        """Abort the call unless its token may act as ``role`` (for ``host``)."""
        _answer(context, lambda: require(self._credential(context), role, host=host))

    def RegisterMinion(
        self, request: pb.RegisterMinionRequest, context: grpc.ServicerContext
    ) -> pb.RegisterMinionResponse:
        """Replace the host's entries with the minion's snapshot."""
        self._allow(context, Role.MINION, host=request.host)
        epoch = _answer(
            context,
            lambda: self._state.register_minion(
                host=request.host,
                socket_path=request.socket_path,
                rpc_address=request.rpc_address,
                heartbeat_s=request.heartbeat_s,
                containers=[convert.from_pb(c, ContainerRecord) for c in request.containers],
                objects=[convert.from_pb(o, ObjectRecord) for o in request.objects],
                restarts=Restarts(request.keeps_objects, request.restarts, request.kept_objects),
            ),
        )
        log.info(
            "minion %s registered (%s, %d containers, %d objects)",
            request.host,
            request.socket_path,
            len(request.containers),
            len(request.objects),
        )
        return pb.RegisterMinionResponse(epoch=epoch)

    def ReportChanges(
        self, request: pb.ReportChangesRequest, context: grpc.ServicerContext
    ) -> pb.ReportChangesResponse:
        """Apply a batch, or ask the minion to re-register."""
        self._allow(context, Role.MINION, host=request.host)
        resync = _answer(
            context,
            lambda: self._state.report_changes(
                request.host, request.epoch, convert.changes_from_pb(request)
            ),
        )
        if resync:
            log.info("minion %s must resync (its epoch %r)", request.host, request.epoch)
        return pb.ReportChangesResponse(resync_required=resync, epoch=self._state.epoch)

    def LookupContainer(
        self, request: pb.LookupContainerRequest, context: grpc.ServicerContext
    ) -> pb.ContainerInfo:
        """One container by id (its pid and uid: readers only)."""
        self._allow(context, Role.READER)
        info = _answer(context, lambda: self._state.lookup_container(request.container_id))
        return convert.to_pb(info, pb.ContainerInfo)

    def RouteContainer(
        self, request: pb.LookupContainerRequest, context: grpc.ServicerContext
    ) -> pb.Route:
        """Where a transfer to a container goes (a gateway asks)."""
        self._allow(context, Role.MINION)
        route = _answer(context, lambda: self._state.route(request.container_id))
        return convert.to_pb(route, pb.Route)

    def ListContainers(
        self, request: pb.ListContainersRequest, context: grpc.ServicerContext
    ) -> pb.ListContainersResponse:
        """All containers, optionally on one host."""
        self._allow(context, Role.READER)
        found = _answer(context, lambda: self._state.list_containers(host=request.host))
        return pb.ListContainersResponse(
            containers=[convert.to_pb(c, pb.ContainerInfo) for c in found]
        )

    def LookupObject(
        self, request: pb.LookupObjectRequest, context: grpc.ServicerContext
    ) -> pb.ObjectInfo:
        """One directory entry by key (a gateway asks where an object is)."""
        self._allow(context, Role.MINION)
        info = _answer(context, lambda: self._state.lookup_object(request.key))
        return convert.to_pb(info, pb.ObjectInfo)

    def ListObjects(
        self, request: pb.ListObjectsRequest, context: grpc.ServicerContext
    ) -> pb.ListObjectsResponse:
        """Directory entries, optionally filtered by owner and/or home host."""
        self._allow(context, Role.READER)
        found = _answer(
            context, lambda: self._state.list_objects(owner=request.owner, host=request.host)
        )
        return pb.ListObjectsResponse(objects=[convert.to_pb(o, pb.ObjectInfo) for o in found])

    def ListMinions(
        self, request: pb.ListMinionsRequest, context: grpc.ServicerContext
    ) -> pb.ListMinionsResponse:
        """Every known minion with its liveness."""
        self._allow(context, Role.READER)
        minions = self._state.list_minions()
        return pb.ListMinionsResponse(
            minions=[convert.to_pb(m, pb.MinionInfo) for m in minions], epoch=self._state.epoch
        )


def serve(
    listen: str, *, key: str, state: ControllerState | None = None, max_workers: int = 16
) -> grpc.Server:
    """Start a controller on ``listen`` (``host:port``) and return the running server; it
    answers callers whose token the cluster ``key`` signed (``cdi.auth``).

    Raises ``ConfigError`` when the address cannot be bound (malformed, or already in use) or
    the key is too short.
    """
    key = check_key(key, "cluster key")
    state = state or ControllerState()
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="cdi-controller"),
        options=_SERVER_OPTIONS,
    )
    # The generated gRPC module has no type annotations (grpc_tools writes no .pyi for it).
    pb_grpc.add_ControllerServicer_to_server(  # type: ignore[no-untyped-call]
        ControllerServicer(state, key), server
    )
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:  # grpc reports bind failures this way
        server.stop(None)
        raise ConfigError(f"the CDI controller cannot listen on {listen!r}: {exc}") from exc
    if not port:  # older grpc releases return 0 instead of raising
        server.stop(None)
        raise ConfigError(f"the CDI controller cannot listen on {listen!r}")
    server.start()
    log.info("CDI controller listening on %s (port %d, epoch %s)", listen, port, state.epoch)
    return server


def run(listen: str, *, key: str, grace_s: float = 2.0) -> None:
    """Serve on ``listen`` until SIGTERM or SIGINT, then stop within ``grace_s`` seconds.

    Must be called from the main thread (it installs signal handlers, restored on return).
    """
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("CDI controller stopping on %s", signal.Signals(signum).name)
        stop.set()

    # Install before binding so a signal that arrives during start-up is not lost.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = serve(listen, key=key)
        try:
            stop.wait()
        finally:
            server.stop(grace_s).wait()
        log.info("CDI controller stopped")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
