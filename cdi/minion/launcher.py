"""Run the CDI minion (``cdi/minion-native``, Rust) with a :class:`MinionConfig`.

The minion is one binary, built with the package (``setup.py``): it serves ``cdi/PROTOCOL.md``
in a single ``epoll`` loop, without an interpreter on the hand-off path. Configuration and the
controller's directory stay in Python: this module turns a validated config into the binary's
arguments, and, when a controller is configured, reads the binary's object events from a pipe
and forwards them to the directory reporter (so the binary needs no gRPC stack).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from cdi.auth import without_secrets
from cdi.controller.models import Restarts
from cdi.errors import CDIError, ConfigError

if TYPE_CHECKING:
    from cdi.controller.reporter import DirectoryReporter
    from cdi.minion.config import MinionConfig
    from cdi.remote.native import NativeInbound

__all__ = ["BINARY_NAME", "PACKAGED", "binary_argv", "find_binary", "missing_binary", "run_binary"]

log = logging.getLogger(__name__)

BINARY_NAME = "cdi-minion"
PACKAGED = Path(__file__).resolve().parent / "bin" / BINARY_NAME
"""Where installing cdiflow puts the binary it builds (``setup.py``)."""
BINARY_ENV = "CDI_MINION_BIN"


def find_binary() -> str | None:
    """``$CDI_MINION_BIN``, else the binary installed with the package, else one on ``PATH``."""
    if explicit := os.environ.get(BINARY_ENV):
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ConfigError(f"{BINARY_ENV}={explicit!r} is not an executable file")
        return explicit
    if os.access(PACKAGED, os.X_OK):
        return str(PACKAGED)
    return shutil.which(BINARY_NAME)


def missing_binary() -> str:
    """What to do when :func:`find_binary` finds none."""
    return (
        f"the CDI minion ({BINARY_NAME}) is not installed: installing cdiflow builds it with "
        "Rust 1.85+ (https://rustup.rs); with Rust on PATH, install cdiflow again (in a "
        f"checkout: `make native`), or set {BINARY_ENV} to a built {BINARY_NAME}"
    )


def binary_argv(binary: str, config: MinionConfig) -> list[str]:
    assert config.idle_limit is not None
    argv = [
        binary,
        "--socket",
        config.socket_path,
        "--host",
        config.host,
        "--memory-limit",
        str(config.memory_limit),
        "--max-object",
        str(config.max_object),
        "--idle-limit",
        str(config.idle_limit),
        "--isolation",
        str(config.isolation),
        "--busy-poll-us",
        str(config.busy_poll_us),
        "--socket-mode",
        f"{config.socket_mode:o}",
    ]
    if config.socket_group is not None:
        argv += ["--socket-group", str(config.socket_group)]
    if config.names:
        argv += ["--names", ",".join(str(rule) for rule in config.names)]
    if config.prewarm:
        argv += ["--prewarm", ",".join(f"{size}:{n}" for size, n in config.prewarm.items())]
    if config.state_dir is not None:
        argv += ["--state-dir", config.state_dir]
    if config.term_keeps:
        argv += ["--term-keeps"]
    return argv


class Companion(Protocol):
    """Something that runs beside the binary in this process (the cross-host gateway)."""

    def start(self, timeout: float = ...) -> object: ...

    def close(self) -> None: ...

    def native_inbound(self) -> NativeInbound | None:
        """What the binary needs to receive other hosts' objects itself, if it does."""
        ...

    def arrived(self, key: str, recovery: str, generation: int) -> None:
        """The binary received ``key`` from another host (an ``arrived`` event); its generation
        here (0: unknown)."""
        ...


def run_binary(
    binary: str,
    config: MinionConfig,
    make_reporter: Callable[[], DirectoryReporter] | None,
    companion: Companion | None = None,
) -> int:
    """Run the binary until it exits; returns its exit code.

    Without a reporter the binary replaces this process (``exec``): its PID is the minion's, and
    nothing of Python stays resident. With one, this process stays as the binary's parent and
    relays its events to the reporter until the binary closes the pipe. The reporter is made
    after the fork, so the child is forked from a process without threads."""
    argv = binary_argv(binary, config)
    if make_reporter is None:
        assert companion is None, "a gateway needs a controller, hence a reporter"
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(binary, argv)
    native = companion.native_inbound() if companion is not None else None
    extra, inherited = native.arguments() if native is not None else ([], ())
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        child = subprocess.Popen(
            [*argv, "--events-fd", str(write_end), *extra],
            # The binary talks to no controller; the gateway key reaches it through a pipe.
            env=without_secrets(os.environ),
            pass_fds=(write_end, *inherited),
            # One prctl call (takes no locks). With a state folder, the relay's death is a
            # restart: the binary serves on until its successor takes the folder over, or a
            # few seconds, then stops keeping its objects (SIGUSR1, docs/minion-restart.md).
            preexec_fn=_die_with_parent(
                signal.SIGUSR1 if config.state_dir is not None else signal.SIGTERM
            ),
        )
    finally:
        os.close(write_end)
        if native is not None:
            native.spawned()
    try:
        reporter = make_reporter()
    except BaseException:
        child.terminate()
        child.wait()
        raise
    forward = _forwarder(child)
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if companion is not None:
            # In a thread: it waits for the binary to answer, while we relay its events.
            threading.Thread(target=companion.start, name="cdi-companion", daemon=True).start()
        arrived = companion.arrived if companion is not None else None
        with os.fdopen(read_end, "rb", buffering=0) as events:
            relay_events(events.read, reporter, arrived)
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child.poll() is None:
            child.terminate()
            child.wait()
        reporter.close()


Arrived = Callable[[str, str, int], None]


def relay_events(
    read: Callable[[int], bytes | None],
    reporter: DirectoryReporter,
    arrived: Arrived | None = None,
) -> None:
    """Feed the binary's event stream (msgpack arrays) to ``reporter`` until end of stream;
    ``arrived`` gets the objects its gateway received from other hosts."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=1 << 24)
    while chunk := read(1 << 16):
        unpacker.feed(chunk)
        for event in unpacker:
            try:
                _dispatch(event, reporter, arrived)
            except (CDIError, TypeError, ValueError) as exc:
                log.warning("ignoring a malformed minion event %r: %s", event, exc)


def _dispatch(event: Any, reporter: DirectoryReporter, arrived: Arrived | None) -> None:
    if not isinstance(event, list) or not event:
        raise ValueError("an event must be a non-empty array")
    kind, *args = event
    if kind == "registered":
        cid, pid, uid = args
        reporter.container_registered(cid, pid, uid)
    elif kind == "gone":
        (cid,) = args
        reporter.container_gone(cid)
    elif kind == "changed":
        # created_at: from a minion that reports it (a fifth item); 0 means unknown.
        key, size, owner, generation, *created = args
        if len(created) > 1:
            raise ValueError("a changed event has at most five items")
        reporter.object_changed(key, size, owner, generation, *created)
    elif kind == "removed":
        (key,) = args
        reporter.object_removed(key)
    elif kind == "arrived":
        # generation: its generation here, from a minion that reports it (a fourth item).
        key, recovery, *generation = args
        if len(generation) > 1:
            raise ValueError("an arrived event has at most four items")
        if arrived is not None:
            arrived(str(key), str(recovery), int(generation[0]) if generation else 0)
    elif kind == "store":
        store, restarts, kept = args
        reporter.store_resumed(Restarts(bool(store), restarts, kept))
    else:
        raise ValueError(f"unknown event kind {kind!r}")


def _forwarder(child: subprocess.Popen[bytes]) -> Callable[[int, object], None]:
    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    return forward


def _die_with_parent(sig: signal.Signals) -> Callable[[], None]:
    """What the child runs before exec: get ``sig`` if this relay dies, so no minion is
    orphaned. Resolved here, in the parent: the child only makes the call."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(sig))

    return preexec
