"""The CDI controller, its client and the minion-side reporter, against a real controller."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import grpc
import pytest
from click.testing import CliRunner

from cdi.auth import ANY_HOST, ClusterCredentials, Role, mint_token, new_key
from cdi.controller.cli import controller_command
from cdi.controller.client import ControllerClient, parse_controller_url
from cdi.controller.models import Changes, ContainerRecord, ObjectRecord, Restarts
from cdi.controller.reporter import (
    DirectoryReporter,
    GrpcDirectoryReporter,
    NullDirectoryReporter,
)
from cdi.controller.state import ControllerState
from cdi.errors import (
    AccessDenied,
    ConfigError,
    ControllerUnavailable,
    InvalidArgument,
    NotAuthenticated,
    ObjectNotFound,
    UnknownContainer,
)
from cdi.proto import cdi_pb2 as pb
from cdi.proto import cdi_pb2_grpc as pb_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]
REPORTER_LOGGER = "cdi.controller.reporter"
# Generous: only bounds how long a poll waits before failing; never part of an assertion.
POLL_DEADLINE_S = 30.0


# -- helpers ----------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.02)


def raises(call: Callable[[], object], error: type[BaseException]) -> bool:
    """True if ``call`` raises ``error``; any other exception propagates."""
    try:
        call()
    except error:
        return True
    return False


class DirectoryClient(ControllerClient):
    """A reader that may also speak for any host (a token of each role), as these tests of
    the directory itself need; ``cdi.auth``'s rules have tests of their own below."""

    def __init__(self, url: str, credentials: ClusterCredentials, timeout: float = 5.0) -> None:
        super().__init__(url, timeout=timeout, token=credentials.reader_token())
        token = mint_token(credentials.cluster_key(), Role.MINION, ANY_HOST)
        self._minion = ControllerClient(url, timeout=timeout, token=token)

    def register_minion(self, *args: Any, **kwargs: Any) -> str:
        return self._minion.register_minion(*args, **kwargs)

    def report_changes(self, *args: Any, **kwargs: Any) -> bool:
        return self._minion.report_changes(*args, **kwargs)

    def close(self) -> None:
        self._minion.close()
        super().close()


class ControllerProcess:
    """``python -m cdi.controller`` on a fixed port, restartable on that same port."""

    def __init__(self, port: int, log_dir: Path) -> None:
        self.port = port
        self.url = f"grpc://127.0.0.1:{port}"
        self.log_path = log_dir / f"controller-{port}.log"
        self.credentials = ClusterCredentials.ensure(log_dir / "credentials")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def client(self, timeout: float = 5.0) -> DirectoryClient:
        return DirectoryClient(self.url, self.credentials, timeout)

    def minion_token(self, host: str) -> str:
        return mint_token(self.credentials.cluster_key(), Role.MINION, host)

    def start(self) -> None:
        """Start the process and wait until it answers."""
        assert self._proc is None, "already running"
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "cdi.controller", "--listen", f"127.0.0.1:{self.port}",
             "--key-file", str(self.credentials.cluster_key_file)],
            cwd=REPO_ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        with self.client(timeout=1.0) as probe:
            wait_until(lambda: self._answers(probe), f"the controller on port {self.port} answers")

    def _answers(self, probe: ControllerClient) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            pytest.fail(f"controller exited with {self._proc.returncode}:\n{self.log()}")
        return not raises(probe.list_minions, ControllerUnavailable)

    def kill(self) -> None:
        """SIGKILL: the controller loses all its soft state."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait()
        self._reset()

    def stop(self) -> int | None:
        """SIGTERM and wait (SIGKILL if it hangs); return the exit code, None if not running."""
        if self._proc is None:
            return None
        proc = self._proc
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=POLL_DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self._reset()
        return proc.returncode

    def log(self) -> str:
        """Everything the controller wrote so far."""
        return self.log_path.read_text(errors="replace")

    def _reset(self) -> None:
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProcess]:
    process = ControllerProcess(free_port(), tmp_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def client(controller: ControllerProcess) -> Iterator[ControllerClient]:
    with controller.client() as c:
        yield c


@pytest.fixture
def reporter_factory(
    controller: ControllerProcess,
) -> Iterator[Callable[..., GrpcDirectoryReporter]]:
    made: list[GrpcDirectoryReporter] = []

    def make(url: str, host: str, heartbeat_s: float = 0.2) -> GrpcDirectoryReporter:
        reporter = GrpcDirectoryReporter(
            url, host, f"/run/cdi/{host}.sock", rpc_address=f"{host}:7000",
            heartbeat_s=heartbeat_s, token=controller.minion_token(host),
        )  # fmt: skip
        made.append(reporter)
        return reporter

    yield make
    for reporter in made:
        reporter.close()


# -- the controller process and its client ----------------------------------------------------


def test_register_lookup_and_list(client: ControllerClient) -> None:
    epoch = client.register_minion(
        "host-a",
        "/run/cdi/a.sock",
        "10.0.0.1:7000",
        containers=[
            ContainerRecord("scheduler", pid=100, uid=1000),
            ContainerRecord("w1", 101, 1001),
        ],
        objects=[
            ObjectRecord("image-1", size=4096, owner="scheduler", generation=1),
            ObjectRecord("image-2", size=10, owner="w1", generation=3),
        ],
        restarts=Restarts(keeps_objects=True, restarts=2, kept_objects=7),
    )
    client.register_minion(
        "host-b", "/run/cdi/b.sock", containers=[ContainerRecord("w2", 200, 2000)]
    )
    assert epoch

    container = client.lookup_container("w1")
    assert (container.host, container.pid, container.uid) == ("host-a", 101, 1001)
    assert container.registered_at > 0
    obj = client.lookup_object("image-1")
    assert (obj.host, obj.size, obj.owner, obj.generation) == ("host-a", 4096, "scheduler", 1)

    assert [c.container_id for c in client.list_containers()] == ["scheduler", "w1", "w2"]
    assert [c.container_id for c in client.list_containers(host="host-b")] == ["w2"]
    assert [o.key for o in client.list_objects()] == ["image-1", "image-2"]
    assert [o.key for o in client.list_objects(owner="w1")] == ["image-2"]
    assert [o.key for o in client.list_objects(host="host-b")] == []
    assert client.list_objects(owner="w1", host="host-b") == []

    minions = {m.host: m for m in client.list_minions()}
    assert set(minions) == {"host-a", "host-b"}
    a = minions["host-a"]
    assert (a.socket_path, a.rpc_address, a.containers, a.objects) == (
        "/run/cdi/a.sock",
        "10.0.0.1:7000",
        2,
        2,
    )
    # What each keeps across restarts, as it said: a state folder, or none.
    assert (a.keeps_objects, a.restarts, a.kept_objects) == (True, 2, 7)
    b = minions["host-b"]
    assert (b.keeps_objects, b.restarts, b.kept_objects) == (False, 0, 0)


def test_report_changes_applies_batches_and_asks_for_resync(client: ControllerClient) -> None:
    epoch = client.register_minion(
        "host-a", "/run/cdi/a.sock", containers=[ContainerRecord("c1", 1, 0)]
    )
    resync = client.report_changes(
        "host-a",
        epoch,
        Changes(
            upsert_containers=[ContainerRecord("c2", 2, 0)],
            removed_containers=["c1"],
            upsert_objects=[ObjectRecord("k", 8, "c2", 1)],
        ),
    )
    assert resync is False
    assert client.lookup_container("c2").host == "host-a"
    assert raises(lambda: client.lookup_container("c1"), UnknownContainer)
    assert client.lookup_object("k").owner == "c2"

    # A stale epoch or an unknown minion changes nothing and is told to re-register.
    stale = Changes(removed_objects=["k"])
    assert client.report_changes("host-a", "not-" + epoch, stale) is True
    assert client.report_changes("host-unknown", epoch, stale) is True
    assert client.lookup_object("k").owner == "c2"
    assert client.report_changes("host-a", epoch) is False  # a heartbeat


def test_registration_replaces_a_hosts_previous_snapshot(client: ControllerClient) -> None:
    client.register_minion(
        "host-a",
        "/run/cdi/a.sock",
        containers=[ContainerRecord("old", 1, 0)],
        objects=[ObjectRecord("old-key", 1, "old", 1)],
    )
    client.register_minion("host-a", "/run/cdi/a.sock", containers=[ContainerRecord("new", 2, 0)])
    assert [c.container_id for c in client.list_containers()] == ["new"]
    assert client.list_objects() == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "must not be empty"),
        ("two words", "whitespace"),
        ("tab\there", "whitespace"),
        ("nul\0byte", "NUL"),
        ("x" * 257, "257 characters"),
    ],
)
def test_invalid_names_are_rejected_by_the_controller(
    client: ControllerClient, bad: str, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message) as container_error:
        client.lookup_container(bad)
    assert "container id" in str(container_error.value)
    with pytest.raises(InvalidArgument, match=message) as key_error:
        client.lookup_object(bad)
    assert "object key" in str(key_error.value)
    if bad:  # an empty filter means "no filter"
        with pytest.raises(InvalidArgument, match=message):
            client.list_objects(owner=bad)


def test_the_longest_valid_name_is_accepted(client: ControllerClient) -> None:
    name = "k" * 256
    client.register_minion("host-a", "/s", objects=[ObjectRecord(name, 1, "", 1)])
    assert client.lookup_object(name).owner == ""


def test_invalid_snapshot_is_rejected_whole(controller: ControllerProcess) -> None:
    # Straight to the wire, past the client's own checks, to see the server's answer.
    with grpc.insecure_channel(parse_controller_url(controller.url)) as channel:
        stub = pb_grpc.ControllerStub(channel)  # type: ignore[no-untyped-call]
        request = pb.RegisterMinionRequest(
            host="host-a",
            socket_path="/s",
            containers=[pb.ContainerRecord(container_id="ok", pid=1)],
            objects=[pb.ObjectRecord(key="bad key", size=1)],
        )
        token = controller.minion_token("host-a")
        with pytest.raises(grpc.RpcError) as info:
            stub.RegisterMinion(request, timeout=5, metadata=[("authorization", f"Bearer {token}")])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "object key 'bad key'" in info.value.details()
    with controller.client() as client:
        assert client.list_minions() == []
        assert client.list_containers() == []


def test_invalid_records_are_rejected_before_sending(client: ControllerClient) -> None:
    with pytest.raises(InvalidArgument, match="pid"):
        client.register_minion("host-a", "/s", containers=[ContainerRecord("c", -1, 0)])
    with pytest.raises(InvalidArgument, match="host name"):
        client.register_minion("bad host", "/s")
    with pytest.raises(InvalidArgument, match="socket path"):
        client.register_minion("host-a", "")


def test_lookups_that_miss(client: ControllerClient) -> None:
    with pytest.raises(UnknownContainer, match="nobody"):
        client.lookup_container("nobody")
    with pytest.raises(ObjectNotFound, match="nothing"):
        client.lookup_object("nothing")


def test_minion_that_stops_heartbeating_is_not_alive_but_keeps_its_data(
    client: ControllerClient,
) -> None:
    epoch = client.register_minion(
        "host-a", "/s", heartbeat_s=0.2, objects=[ObjectRecord("k", 1, "", 1)]
    )
    wait_until(lambda: not client.list_minions()[0].alive, "the silent minion is reported dead")
    assert client.lookup_object("k").host == "host-a"

    def beat_and_check() -> bool:
        # Beat on every poll: the liveness window is short, and a slow machine may miss it once.
        return client.report_changes("host-a", epoch) is False and client.list_minions()[0].alive

    wait_until(beat_and_check, "a heartbeat brings it back")


def test_controller_stops_cleanly_on_sigterm(controller: ControllerProcess) -> None:
    assert controller.stop() == 0
    assert "CDI controller stopped" in controller.log()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:50051",
        "127.0.0.1:50051",
        "grpc://127.0.0.1",
        "grpc://:50051",
        "grpc://127.0.0.1:notaport",
        "grpc://127.0.0.1:50051/path",
        "unix:///tmp/x.sock",
    ],
)
def test_client_rejects_urls_that_are_not_grpc_host_port(url: str) -> None:
    with pytest.raises(ConfigError, match="grpc://host:port"):
        ControllerClient(url)


def test_url_parsing() -> None:
    assert parse_controller_url("grpc://ctl.example:50051") == "ctl.example:50051"
    assert parse_controller_url("grpc://[::1]:50051") == "[::1]:50051"


def test_client_of_an_absent_controller_raises_controller_unavailable() -> None:
    client = ControllerClient(f"grpc://127.0.0.1:{free_port()}")
    with client, pytest.raises(ControllerUnavailable, match="did not answer ListMinions"):
        client.list_minions()
    with pytest.raises(ControllerUnavailable, match="closed"):
        client.list_minions()


def test_cli_command_is_a_click_command() -> None:
    result = CliRunner().invoke(controller_command, ["--help"])
    assert result.exit_code == 0
    assert "--listen" in result.output


# -- who may call ---------------------------------------------------------------------------


def test_a_caller_without_this_clusters_token_is_refused(
    controller: ControllerProcess, client: ControllerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the audit did as another local user, and more: no token, a malformed one, one
    signed by another key. Nothing is answered and nothing changes."""
    monkeypatch.delenv("CDI_CONTROLLER_TOKEN", raising=False)
    monkeypatch.delenv("CDI_CONTROLLER_TOKEN_FILE", raising=False)
    client.register_minion("vm", "/run/cdi/real.sock", containers=[ContainerRecord("w1", 5, 0)])
    foreign = mint_token(new_key(), Role.READER, "cluster-tools")
    for token in (None, "Bearer nonsense", "cdi1.minion.vm.AAAA", foreign,
                  mint_token(new_key(), Role.MINION, "vm")):  # fmt: skip
        with ControllerClient(controller.url, token=token) as stranger:
            for call in (
                lambda: stranger.register_minion(
                    "vm", "/tmp/evil.sock", objects=[ObjectRecord("fake", 1, "", 1)]
                ),
                stranger.list_containers,
                stranger.list_objects,
                stranger.list_minions,
                lambda: stranger.route_container("w1"),
                lambda: stranger.lookup_object("fake"),
            ):
                with pytest.raises(NotAuthenticated) as refused:
                    call()
                assert token is None or token not in str(refused.value)
    (minion,) = client.list_minions()
    assert (minion.socket_path, minion.containers, minion.objects) == ("/run/cdi/real.sock", 1, 0)
    assert raises(lambda: client.lookup_object("fake"), ObjectNotFound)


def test_a_minion_speaks_for_its_own_host_only_and_lists_nothing(
    controller: ControllerProcess, client: ControllerClient
) -> None:
    client.register_minion("host-b", "/run/cdi/b.sock", containers=[ContainerRecord("w2", 7, 0)])
    with ControllerClient(controller.url, token=controller.minion_token("host-a")) as minion_a:
        epoch = minion_a.register_minion("host-a", "/run/cdi/a.sock")
        assert minion_a.report_changes("host-a", epoch) is False
        with pytest.raises(AccessDenied, match="may not speak for host 'host-b'"):
            minion_a.register_minion("host-b", "/tmp/evil.sock")
        with pytest.raises(AccessDenied, match="host-b"):
            minion_a.report_changes("host-b", epoch, Changes(removed_containers=["w2"]))
        # What its gateway needs: where a container or an object is.
        assert minion_a.route_container("w2").host == "host-b"
        assert raises(lambda: minion_a.lookup_object("nothing"), ObjectNotFound)
        # Not the directory's lists, nor a container's pid and uid.
        for listing in (minion_a.list_containers, minion_a.list_objects, minion_a.list_minions,
                        lambda: minion_a.lookup_container("w2")):  # fmt: skip
            with pytest.raises(AccessDenied, match="may not list or look up"):
                listing()
    assert client.lookup_container("w2").host == "host-b"
    b = next(m for m in client.list_minions() if m.host == "host-b")
    assert (b.socket_path, b.containers) == ("/run/cdi/b.sock", 1)


def test_the_controller_does_not_start_without_the_cluster_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("CDI_CLUSTER_KEY", "CDI_CLUSTER_KEY_FILE"):
        monkeypatch.delenv(variable, raising=False)
    missing = CliRunner().invoke(controller_command, ["--listen", f"127.0.0.1:{free_port()}"])
    assert missing.exit_code != 0 and "needs the cluster key" in missing.output
    readable = tmp_path / "cluster.key"
    readable.write_text(new_key())
    readable.chmod(0o644)
    shown = CliRunner().invoke(controller_command, ["--key-file", str(readable)])
    assert shown.exit_code != 0 and "chmod 600" in shown.output
    assert readable.read_text() not in shown.output


def test_the_controller_refuses_a_placeholder_cluster_key() -> None:
    """A Secret left as the manifests ship it stops the controller before it listens."""
    from cdi.controller.server import serve

    placeholder = "CHANGE-ME: the cluster.key file of cdiflow cdi credentials"
    with pytest.raises(ConfigError, match="the cluster key is not a secret") as refused:
        serve(f"127.0.0.1:{free_port()}", key=placeholder).stop(0)
    assert placeholder not in str(refused.value)


# -- the reporter -----------------------------------------------------------------------------


def test_reporter_changes_appear_in_the_controller(
    client: ControllerClient,
    controller: ControllerProcess,
    reporter_factory: Callable[..., GrpcDirectoryReporter],
) -> None:
    reporter = reporter_factory(controller.url, "host-r")
    reporter.container_registered("producer", 10, 1000)
    reporter.container_registered("consumer", 11, 1001)
    reporter.object_changed("frame-1", 1024, "producer", 1)
    wait_until(
        lambda: not raises(lambda: client.lookup_object("frame-1"), ObjectNotFound),
        "the object is in the directory",
    )
    assert client.lookup_container("consumer").pid == 11
    created = client.lookup_object("frame-1").created_at

    reporter.object_changed("frame-1", 2048, "consumer", 2)  # a resize and a transfer
    wait_until(lambda: client.lookup_object("frame-1").owner == "consumer", "the transfer shows")
    moved = client.lookup_object("frame-1")
    assert (moved.size, moved.generation, moved.created_at) == (2048, 2, created)

    reporter.object_removed("frame-1")
    reporter.container_gone("producer")
    wait_until(
        lambda: raises(lambda: client.lookup_container("producer"), UnknownContainer),
        "the container is gone",
    )
    assert raises(lambda: client.lookup_object("frame-1"), ObjectNotFound)

    wait_until(lambda: client.list_minions()[0].alive, "the reporter's heartbeats keep it alive")
    minion = client.list_minions()[0]
    assert (minion.host, minion.socket_path, minion.rpc_address) == (
        "host-r",
        "/run/cdi/host-r.sock",
        "host-r:7000",
    )
    assert minion.heartbeat_s == pytest.approx(0.2)
    assert (minion.keeps_objects, minion.restarts) == (False, 0)  # not told otherwise

    # What the minion keeps across restarts goes with a new snapshot, the rest unchanged.
    reporter.store_resumed(Restarts(keeps_objects=True, restarts=1, kept_objects=1))
    wait_until(lambda: client.list_minions()[0].keeps_objects, "the restart shows")
    minion = client.list_minions()[0]
    assert (minion.restarts, minion.kept_objects, minion.containers) == (1, 1, 1)


def test_reporter_coalesces_a_burst(
    client: ControllerClient,
    controller: ControllerProcess,
    reporter_factory: Callable[..., GrpcDirectoryReporter],
) -> None:
    reporter = reporter_factory(controller.url, "host-r")
    for generation in range(1, 500):
        reporter.object_changed("hot", generation, "c", generation)
    reporter.object_changed("short-lived", 1, "c", 1)
    reporter.object_removed("short-lived")
    wait_until(
        lambda: [(o.key, o.generation) for o in client.list_objects()] == [("hot", 499)],
        "only the last state of the burst is in the directory",
    )


def test_reporter_reannounces_after_the_controller_restarts(
    controller: ControllerProcess,
    reporter_factory: Callable[..., GrpcDirectoryReporter],
) -> None:
    reporter = reporter_factory(controller.url, "host-r")
    reporter.container_registered("c1", 10, 1000)
    reporter.object_changed("kept", 100, "c1", 1)
    reporter.object_changed("doomed", 100, "c1", 1)
    with controller.client() as client:
        wait_until(lambda: len(client.list_objects()) == 2, "both objects are in the directory")

    controller.kill()
    # Changes made while the controller is down must not be lost.
    reporter.object_removed("doomed")
    reporter.container_registered("c2", 20, 2000)
    reporter.object_changed("kept", 100, "c2", 2)
    reporter.object_changed("new", 5, "c2", 1)
    controller.start()

    with controller.client() as client:
        wait_until(
            lambda: [o.key for o in client.list_objects()] == ["kept", "new"],
            "the reporter re-announces its objects",
        )
        assert client.lookup_object("kept").owner == "c2"
        assert [c.container_id for c in client.list_containers(host="host-r")] == ["c1", "c2"]
        assert client.list_minions()[0].host == "host-r"


def test_reporter_resyncs_when_it_next_speaks_to_a_restarted_controller(
    controller: ControllerProcess,
    reporter_factory: Callable[..., GrpcDirectoryReporter],
) -> None:
    # A long heartbeat: the reporter says nothing while the controller is down, so its next
    # call carries the old epoch to the new controller, which must ask for a resync.
    reporter = reporter_factory(controller.url, "host-r", heartbeat_s=3600)
    reporter.object_changed("before", 1, "c1", 1)
    with controller.client() as client:
        wait_until(lambda: len(client.list_objects()) == 1, "the object is in the directory")
    controller.kill()
    controller.start()
    reporter.object_changed("after", 1, "c1", 1)
    with controller.client() as client:
        wait_until(
            lambda: [o.key for o in client.list_objects()] == ["after", "before"],
            "the full snapshot is re-announced",
        )


def test_reporter_without_a_controller_keeps_quiet_and_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=REPORTER_LOGGER)
    reporter = GrpcDirectoryReporter(
        f"grpc://127.0.0.1:{free_port()}", "lonely", "/run/cdi/lonely.sock", heartbeat_s=0.1
    )
    try:
        reporter.container_registered("c1", 1, 0)
        reporter.object_changed("k", 1, "c1", 1)
        reporter.object_removed("k")
        reporter.container_gone("c1")

        def failures() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == REPORTER_LOGGER and "fail" in r.message]

        wait_until(lambda: len(failures()) >= 3, "the reporter has retried a few times")
        warnings = [
            r for r in caplog.records if r.name == REPORTER_LOGGER and r.levelno >= logging.WARNING
        ]
        assert len(warnings) == 1, "one warning per outage"
        assert "unavailable" in warnings[0].message
    finally:
        reporter.close()
    assert not reporter.running
    reporter.object_changed("late", 1, "c1", 1)  # after close: ignored, never raises
    reporter.close()  # idempotent


def test_reporter_validates_events_locally(
    reporter_factory: Callable[..., GrpcDirectoryReporter],
) -> None:
    reporter = reporter_factory(f"grpc://127.0.0.1:{free_port()}", "host-r")
    with pytest.raises(InvalidArgument, match="container id"):
        reporter.container_registered("bad id", 1, 0)
    with pytest.raises(InvalidArgument, match="size"):
        reporter.object_changed("k", -1, "c", 1)
    with pytest.raises(InvalidArgument, match="object key"):
        reporter.object_removed("")
    with pytest.raises(ConfigError):
        GrpcDirectoryReporter("http://127.0.0.1:1", "h", "/s")


def test_null_reporter_does_nothing() -> None:
    reporter: DirectoryReporter = NullDirectoryReporter()  # mypy checks both fit the protocol
    grpc_reporter: type[DirectoryReporter] = GrpcDirectoryReporter
    assert grpc_reporter is GrpcDirectoryReporter
    reporter.container_registered("c", 1, 0)
    reporter.object_changed("k", 1, "c", 1)
    reporter.object_removed("k")
    reporter.container_gone("c")
    reporter.close()


# -- ControllerState, in-process --------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_state_liveness_is_three_missed_heartbeats() -> None:
    clock = FakeClock()
    state = ControllerState(clock=clock, monotonic=clock)
    epoch = state.register_minion("h", "/s", heartbeat_s=2.0)
    clock.now += 6.0
    assert state.list_minions()[0].alive
    clock.now += 0.001
    assert not state.list_minions()[0].alive
    assert state.report_changes("h", epoch, Changes()) is False
    assert state.list_minions()[0].alive


def test_state_ignores_removals_from_a_former_home() -> None:
    state = ControllerState()
    epoch_a = state.register_minion("a", "/a", objects=[ObjectRecord("k", 1, "c", 1)])
    state.register_minion("b", "/b", objects=[ObjectRecord("k", 1, "c", 2)])  # moved to b
    assert state.lookup_object("k").host == "b"
    state.report_changes("a", epoch_a, Changes(removed_objects=["k"]))  # a's late goodbye
    assert state.lookup_object("k").host == "b"
    assert state.list_objects(host="a") == []
    assert [m.objects for m in state.list_minions()] == [0, 1]


def test_state_applies_nothing_from_an_invalid_batch() -> None:
    state = ControllerState()
    epoch = state.register_minion("a", "/a")
    batch = Changes(
        upsert_containers=[ContainerRecord("fine", 1, 0)],
        upsert_objects=[ObjectRecord("bad key", 1, "", 1)],
    )
    with pytest.raises(InvalidArgument, match="bad key"):
        state.report_changes("a", epoch, batch)
    assert state.list_containers() == []


def test_state_rejects_a_bad_heartbeat() -> None:
    with pytest.raises(InvalidArgument, match="heartbeat"):
        ControllerState().register_minion("a", "/a", heartbeat_s=-1.0)
