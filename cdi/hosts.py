"""Several hosts on one machine: network namespaces joined by a bridge, or loopback addresses.

    with HostNetwork.create(2) as net:            # as root: two namespaces on a bridge
        net.hosts[0].address                        # e.g. "10.231.7.2"
        subprocess.Popen(net.hosts[0].wrap(argv))   # argv runs inside host 0's namespace
        net.gateway                                 # the bridge's address in the root namespace

Each host is a network namespace with a veth pair whose other end sits on one bridge in the
root namespace. The bridge has an address too, so services that stay in the root namespace
(Postgres, Redis, S3, the CDI controller) are reachable from every host on it. A host's
traffic to another host crosses two veths and the bridge: real TCP through the kernel's
stack, as between machines, minus the wire.

Making namespaces needs root (``CAP_SYS_ADMIN`` and ``CAP_NET_ADMIN``) and the ``ip`` command.
Where either is missing, ``HostNetwork.create(..., fallback=True)`` gives each host a distinct
loopback address instead (127.0.<n>.<i>): processes then share the root namespace, so a
server that binds ``0.0.0.0`` is reachable at every host's address, and the "hosts" are
separate only by the address each process binds and dials. ``kind`` says which one you got.

Names carry a tag unique to the process (``cdi<pid>x<n>``), so parallel test runs never share
a namespace; ``close()`` removes everything it made (deleting a namespace removes its veth
end, which removes the pair).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from cdi.errors import ConfigError
from cdi.link_emulator import Link, LinkEmulator, rules

__all__ = ["Host", "HostNetwork", "enter_namespace", "namespaces_available"]

_CLONE_NEWNET = 0x40000000
_NETNS_DIR = "/run/netns"
_counter = itertools.count(1)
# Taken while a bridge's subnet is chosen and claimed (namespaces need root: /run is root's).
_BLOCKS_LOCK = Path("/run/cdi-hosts.lock")


def namespaces_available() -> tuple[bool, str]:
    """Whether this process can make network namespaces, and if not, why."""
    if os.geteuid() != 0:
        return False, f"network namespaces need root; running as uid {os.geteuid()}"
    if shutil.which("ip") is None:
        return False, "the `ip` command (iproute2) is not installed"
    return True, ""


def enter_namespace(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (threads it starts follow).

    For a freshly spawned process, before it opens sockets or starts threads (gRPC, for one,
    starts its own: they inherit the namespace of the thread that creates them)."""
    path = os.path.join(_NETNS_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"no network namespace {name!r} ({path}): {exc}") from exc
    try:
        _setns(fd, name)
    finally:
        os.close(fd)


def _setns(fd: int, name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise ConfigError(f"cannot enter network namespace {name!r}: {os.strerror(err)}")


@dataclass(frozen=True)
class Host:
    """One emulated host: a name, the address it binds and dials from, and its namespace."""

    name: str
    address: str
    namespace: str | None
    """``None`` on the loopback fallback: the process stays in the root namespace."""

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host (``ip netns exec``, which execs: the PID is argv's)."""
        if self.namespace is None:
            return list(argv)
        return ["ip", "netns", "exec", self.namespace, *argv]

    def enter(self) -> None:
        """Move the calling thread onto this host (see ``enter_namespace``)."""
        if self.namespace is not None:
            enter_namespace(self.namespace)

    @contextlib.contextmanager
    def visit(self) -> Iterator[None]:
        """The calling thread on this host for the block, then back where it was: sockets it
        makes meanwhile stay on this host (a publisher's connection, say)."""
        if self.namespace is None:
            yield
            return
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            enter_namespace(self.namespace)
            try:
                yield
            finally:
                _setns(own, "the thread's own")
        finally:
            os.close(own)


@dataclass
class HostNetwork:
    """``count`` hosts on one machine; remove them with ``close()`` (or ``with``)."""

    kind: Literal["netns", "loopback"]
    hosts: list[Host]
    gateway: str
    """The address of the root namespace as every host sees it (the bridge's, or 127.0.0.1)."""
    reason: str = ""
    """Why namespaces were not used (loopback fallback only)."""
    _bridge: str | None = None
    _made: list[str] = field(default_factory=list)
    _veths: list[str] = field(default_factory=list)
    _subnet: str = ""
    _emulator: LinkEmulator | None = None

    @classmethod
    def create(cls, count: int, *, fallback: bool = True, subnet: int | None = None) -> HostNetwork:
        """Make ``count`` hosts; namespaces if possible, else (``fallback``) loopback addresses.

        ``subnet`` picks 10.<subnet>.<n>.0/24 (default: 231); ``n`` differs per call."""
        if not 1 <= count <= 200:
            raise ConfigError(f"between 1 and 200 hosts, not {count}")
        able, why = namespaces_available()
        if not able:
            if not fallback:
                raise ConfigError(f"cannot make network namespaces: {why}")
            return cls._loopback(count, why)
        network = cls("netns", [], "")
        try:
            network._make_namespaces(count, 231 if subnet is None else subnet)
        except (OSError, subprocess.CalledProcessError, ConfigError) as exc:
            network.close()
            if not fallback:
                raise ConfigError(f"cannot make network namespaces: {_reason(exc)}") from exc
            return cls._loopback(count, _reason(exc))
        return network

    @classmethod
    def _loopback(cls, count: int, why: str) -> HostNetwork:
        block = (os.getpid() + next(_counter)) % 250 + 2
        hosts = [Host(f"host{i + 1}", f"127.0.{block}.{i + 1}", None) for i in range(count)]
        return cls("loopback", hosts, "127.0.0.1", reason=why)

    def _make_namespaces(self, count: int, subnet: int) -> None:
        tag = f"cdi{os.getpid()}x{next(_counter)}"
        self._bridge = f"{tag}br"[:15]
        self._ip("link", "add", self._bridge, "type", "bridge")
        # Another process (a parallel test run) may be picking a block now: choosing one no
        # address is in and taking it are one step under a lock, so two bridges never share
        # a subnet (their routes would clash).
        with _BLOCKS_LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            prefix = _free_prefix(subnet, (os.getpid() * 7 + next(_counter)) % 250)
            self._ip("addr", "add", f"{prefix}.1/24", "dev", self._bridge)
        self._ip("link", "set", self._bridge, "up")
        self.gateway = f"{prefix}.1"
        self._subnet = f"{prefix}.0/24"
        for i in range(count):
            namespace = f"{tag}h{i + 1}"
            outside, inside = f"{tag}v{i + 1}"[:15], "eth0"
            self._ip("netns", "add", namespace)
            self._made.append(namespace)
            self._ip("link", "add", outside, "type", "veth", "peer", "name", f"{tag}p{i + 1}"[:15])
            self._veths.append(outside)
            self._ip("link", "set", f"{tag}p{i + 1}"[:15], "netns", namespace, "name", inside)
            self._ip("link", "set", outside, "master", self._bridge, "up")
            address = f"{prefix}.{i + 2}"
            self._ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
            self._ip("-n", namespace, "link", "set", inside, "up")
            self._ip("-n", namespace, "link", "set", "lo", "up")
            self._ip("-n", namespace, "route", "add", "default", "via", self.gateway)
            self.hosts.append(Host(f"host{i + 1}", address, namespace))

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    def shape(self, rate_mbit: float, burst_kb: int = 256) -> None:
        """Cap every host's outgoing bandwidth (``tc tbf``); namespaces only.

        This kernel has ``tbf`` but no ``netem``, so a round-trip delay is not added here."""
        if self.kind != "netns":
            raise ConfigError(f"shaping a link needs network namespaces ({self.reason})")
        for host in self.hosts:
            assert host.namespace is not None
            subprocess.run(
                ["ip", "netns", "exec", host.namespace, "tc", "qdisc", "replace", "dev", "eth0",
                 "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", f"{burst_kb}kb",
                 "latency", "50ms"],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip

    def reachable(self, url: str) -> str:
        """``url`` of a service on the root namespace's loopback, as a host reaches it: at
        the bridge's address (through the link emulator, which opens it on loopback)."""
        if self.kind != "netns":
            return url
        parts = urlsplit(url)
        if parts.hostname not in ("127.0.0.1", "localhost"):
            return url
        netloc = parts.netloc.rsplit("@", 1)
        where = netloc[-1].replace(parts.hostname, self.gateway, 1)
        return urlunsplit(parts._replace(netloc="@".join([*netloc[:-1], where])))

    @property
    def emulator(self) -> LinkEmulator | None:
        """The process that emulates the link (``emulate_link``), if any."""
        return self._emulator

    @property
    def link(self) -> Link | None:
        """The emulated link between the hosts (``emulate_link``), if any."""
        return self._emulator.link if self._emulator is not None else None

    def emulate_link(self, link: Link, folder: str, near: str = "host1") -> None:
        """Make every host-to-host connection pay ``link``: its bandwidth by ``tbf`` on each
        host's way out, its round trip by ``cdi.link_emulator`` (see there), which also
        carries the hosts' connections to services listening on the root namespace's
        loopback. ``near`` is the host those services count as being on. Needs ``nft``."""
        if self.kind != "netns":
            raise ConfigError(f"emulating a link needs network namespaces ({self.reason})")
        if shutil.which("nft") is None:
            raise ConfigError("emulating a link needs the `nft` command (apt-get install nftables)")
        if self._emulator is not None:
            raise ConfigError("this network emulates a link already")
        if link.mbit is not None:
            self.shape(link.mbit)
        try:
            for host in self.hosts:
                assert host.namespace is not None
                subprocess.run(
                    ["ip", "netns", "exec", host.namespace, "nft", "-f", "-"],
                    input=rules(host.address, self._subnet, self.gateway, link).encode(),
                    check=True, capture_output=True, timeout=30,
                )  # fmt: skip
            self._emulator = LinkEmulator(self, link, folder, near).start()
        except BaseException:
            # Rules that turn connections to an emulator that is not there would cut the
            # hosts off: none stays.
            for host in self.hosts:
                assert host.namespace is not None
                subprocess.run(["ip", "netns", "exec", host.namespace, "nft", "delete", "table",
                                "ip", "cdilink"], capture_output=True, timeout=30)  # fmt: skip
            raise

    def close(self) -> None:
        """Remove the veth pairs, the namespaces and the bridge.

        Each veth is deleted explicitly: a deleted namespace takes its end of the pair with it,
        but later, from the kernel's cleanup work, not before ``ip netns del`` returns."""
        emulator, self._emulator = self._emulator, None
        if emulator is not None:
            emulator.stop()
        for veth in reversed(self._veths):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._ip("link", "del", veth)
        self._veths.clear()
        for namespace in reversed(self._made):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._ip("netns", "del", namespace)
        self._made.clear()
        if self._bridge is not None:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._ip("link", "del", self._bridge)
            self._bridge = None

    def __enter__(self) -> HostNetwork:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _free_prefix(subnet: int, start: int) -> str:
    """``10.<subnet>.<n>``, the first ``n`` from ``start`` (wrapping within 1..250) that no
    address on this machine's root namespace is in."""
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], check=True, capture_output=True,
                           text=True, timeout=30).stdout  # fmt: skip
    for step in range(250):
        prefix = f"10.{subnet}.{(start + step) % 250 + 1}"
        if f" {prefix}." not in shown:
            return prefix
    raise ConfigError(f"no free /24 left in 10.{subnet}.0.0/16 for a host network")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        err = exc.stderr.decode(errors="replace").strip() if exc.stderr else ""
        return f"`{' '.join(map(str, exc.cmd))}` failed: {err or exc}"
    return str(exc)
