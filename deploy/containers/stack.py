"""``ContainerStack``: the whole of cdiflow as containers on this machine, with podman.

    with ContainerStack(Path(".data/containers"), hosts=2, workers=2, port=8000) as stack:
        httpx.post(f"{stack.api_url}/api/workflows", headers=stack.auth_headers, ...)

On one podman network (``<name>``): Postgres, Redis and the S3 endpoint (each its own image and
data folder), the CDI controller and the API, each a container; and ``hosts`` *hosts*, each a
pod (``<name>-host<n>``, sharing one network and IPC namespace as a Kubernetes node's pods
share the node) holding that host's minion and the scheduler and workers placed there, which
reach the minion through the host's socket directory (``<data>/hosts/host<n>/cdi``, a node's
hostPath). Objects cross between hosts through the minions' gateways, over the network.

Every container runs with a read-only root, no capability, no privilege escalation, as its
role's own user (``roles.UIDS``), restarted by podman when its process dies. Each container of
its own and each pod has a fixed address on the network, which its listeners bind by name
(``roles.plan_addresses``); the CDI control plane is authenticated as ``cdiflow up``'s is, each
role given its credentials as files (``roles.cdi_secrets``). The API is published on this
machine's loopback (``port``), the S3 endpoint too (for uploads); nothing else is published.
``start()`` returns once every piece answers, as ``cdiflow up`` does.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Final, Self

import boto3
import psycopg
import redis
from botocore.config import Config
from botocore.exceptions import ClientError

import cdi
from cdi.controller.client import ControllerClient
from deploy.containers import roles
from deploy.containers.errors import ContainerError
from deploy.containers.images import Images, images
from deploy.containers.podman import LABEL, exists, inspect, podman, podman_env, require_podman
from deploy.containers.roles import ContainerSpec, Layout, Secrets
from orchestrator.child_process import free_port
from orchestrator.contract import keys
from orchestrator.services import RunningServices
from orchestrator.stack.probes import http_ok, worker_heartbeat
from orchestrator.started import StartStop

__all__ = ["ROLE_LABEL", "ContainerStack", "container_rows"]

ROLE_LABEL: Final = "io.cdiflow.role"
_STOP_ORDER: Final = ("worker", "scheduler", "api", "minion", "controller", "s3", "redis",
                      "postgres")  # fmt: skip


def container_rows(name: str) -> list[dict[str, Any]]:
    """The containers of the stack ``name``: each one's name, role, pod, state and restarts."""
    listed = json.loads(podman("ps", "-a", "--pod", "--filter", f"label={LABEL}={name}",
                               "--format", "json") or "[]")  # fmt: skip
    rows = []
    for found in listed:
        role = (found.get("Labels") or {}).get(ROLE_LABEL)
        if not role:
            continue  # a pod's infra container
        container = inspect("container", found["Id"])
        rows.append({
            "name": container["Name"], "role": role, "pod": found.get("PodName") or None,
            "state": container["State"]["Status"], "restarts": container.get("RestartCount", 0),
        })  # fmt: skip
    order = {role: n for n, role in enumerate(reversed(_STOP_ORDER))}
    return sorted(rows, key=lambda r: (order.get(r["role"], 99), r["name"]))


class ContainerStack(StartStop):
    """See the module's docstring. ``stop()`` removes every container, pod and network of
    the stack (by its label), and keeps the data folder unless asked."""

    def __init__(
        self,
        data_dir: Path,
        *,
        name: str = "cdiflow",
        hosts: int = 2,
        workers: int = 2,
        port: int = roles.API_PORT,
        tasks: Iterable[Path] = (),
        images_: Images | None = None,
        ready_timeout: float = 120.0,
    ) -> None:
        if not 1 <= hosts <= 8:
            raise ContainerError(f"hosts must be between 1 and 8, not {hosts}")
        if workers < 1:
            raise ContainerError(f"workers must be 1 or more, not {workers}")
        folders = tuple(Path(t).expanduser().absolute() for t in tasks)
        if missing := [str(f) for f in folders if not f.is_dir()]:
            raise ContainerError(f"--tasks takes folders (mounted into the API and the "
                                 f"workers); not a folder: {', '.join(missing)}")  # fmt: skip
        self.layout = Layout(name, data_dir.expanduser().absolute(), hosts, workers, folders)
        self.images = images_ or images()
        self.port = port
        self.s3_port = 0  # published on start
        self.ready_timeout = ready_timeout
        self.specs: dict[str, ContainerSpec] = {}  # container name -> how it was run
        self.host_address: dict[str, str] = {}  # host -> its pod's address on the network
        self._secrets: Secrets | None = None

    # -- what a client needs --------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def data_dir(self) -> Path:
        return self.layout.data_dir

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets.admin_key}"}

    @property
    def secrets(self) -> Secrets:
        if self._secrets is None:
            self._secrets = Secrets(self.data_dir, self.layout.host_names())
        return self._secrets

    @property
    def services(self) -> RunningServices:
        """The services as this machine reaches them: Postgres and Redis at their addresses
        on the network, S3 on its published port."""
        creds = self.secrets.credentials
        return RunningServices(
            database_url=f"postgresql+psycopg://cdiflow:{creds.postgres_password}@"
            f"{self.address('postgres')}:{roles.POSTGRES_PORT}/cdiflow",
            redis_url=f"redis://:{creds.redis_password}@{self.address('redis')}:"
            f"{roles.REDIS_PORT}/0",
            s3_endpoint_url=f"http://127.0.0.1:{self.s3_port}",
            s3_bucket="cdiflow",
            aws_region="us-east-1",
            aws_access_key_id=creds.s3_access_key_id,
            aws_secret_access_key=creds.s3_secret_access_key,
            data_dir=self.data_dir,
        )

    def address(self, role: str) -> str:
        """The network address of the container ``<name>-<role>`` (e.g. ``postgres``)."""
        return _address(inspect("container", self.layout.container(role)), self.layout.network)

    def socket_path(self, host: str) -> Path:
        return self.layout.socket_dir(host) / "minion.sock"

    # -- start and stop --------------------------------------------------------------------

    def start(self) -> Self:
        """Everything, in order, each piece waited for until it answers; ``ContainerError``
        (with the failing container's last log lines) after removing what was started."""
        self._check_can_start()
        if self.port and not _port_free(self.port):
            raise ContainerError(f"port {self.port} on 127.0.0.1 is in use: choose another "
                                 "with --port")  # fmt: skip
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, *, remove_data: bool = False, timeout: int = 10) -> None:
        """Stop and remove the stack's containers (workers first, services last), pods and
        network; its data folder too when ``remove_data``. Idempotent."""
        label = f"label={LABEL}={self.name}"
        listed = podman("ps", "-a", "--filter", label, "--format",
                        f'{{{{.Names}}}} {{{{index .Labels "{ROLE_LABEL}"}}}}',
                        check=False)  # fmt: skip
        by_role: dict[str, list[str]] = {}
        for line in listed.splitlines():
            name, _, role = line.partition(" ")
            by_role.setdefault(role.strip(), []).append(name)
        for role in (*_STOP_ORDER, *sorted(set(by_role) - set(_STOP_ORDER))):
            if names := by_role.get(role):
                podman("stop", "--time", str(timeout), *names, check=False)
                podman("rm", "--force", *names, check=False)
        pods = podman("pod", "ps", "--filter", label, "--format", "{{.Name}}", check=False)
        if pod_names := pods.split():
            podman("pod", "rm", "--force", *pod_names, check=False)
        if exists("network", self.layout.network):
            podman("network", "rm", "--force", self.layout.network, check=False)
        self.specs.clear()
        if remove_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- faults and their repair -------------------------------------------------------------

    def kill(self, container: str) -> None:
        """``podman kill``: SIGKILL to the container's processes; it stays stopped (podman
        restarts only what exits by itself) until ``restart``."""
        podman("kill", container)

    def restart(self, container: str) -> None:
        """Start a stopped container again (its volumes and address kept)."""
        podman("start", container)

    def recreate(self, container: str) -> None:
        """Remove the container and run a new one from the same spec: only its volumes (the
        data folders mounted into it) carry over."""
        podman("rm", "--force", container)
        self._run(self.specs[container])

    def disconnect(self, host: str) -> None:
        """Cut ``host`` (its pod) from the network: its minion, scheduler and workers lose
        every other container."""
        podman("network", "disconnect", self.layout.network, self._infra(host))

    def connect(self, host: str) -> None:
        """Join ``host`` to the network again, at the address its minion advertises."""
        address = self.host_address[host]
        podman("network", "connect", "--ip", address, "--mac-address", roles.mac_for(address),
               self.layout.network, self._infra(host))  # fmt: skip

    def objects_held(self) -> int | None:
        """The CDI objects every minion holds now; None when one does not answer."""
        total = 0
        for host in self.layout.host_names():
            try:
                with cdi.Client(str(self.socket_path(host))) as probe:
                    total += int(probe.stat()["objects"])
            except cdi.CDIError:
                return None
        return total

    def objects_left(self) -> dict[str, list[tuple[str, str]]]:
        """Each host's objects now, as (key, owner): what a case that leaked left where."""
        found = {}
        for host in self.layout.host_names():
            try:
                with cdi.Client(str(self.socket_path(host))) as probe:
                    found[host] = [(str(o["key"]), str(o.get("owner"))) for o in
                                   probe.list_objects()]  # fmt: skip
            except cdi.CDIError as exc:
                found[host] = [("?", str(exc))]
        return found

    def logs(self, container: str, lines: int = 40) -> str:
        return podman("logs", "--tail", str(lines), container, check=False)

    def save_logs(self, folder: Path) -> None:
        """Every container's whole log (standard output and error) into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        for row in container_rows(self.name):
            done = subprocess.run(["podman", "logs", row["name"]], capture_output=True,
                                  env=podman_env(), check=False)  # fmt: skip
            (folder / f"{row['name']}.log").write_bytes(done.stdout + done.stderr)

    # -- start-up, piece by piece ------------------------------------------------------------

    def start_services(self) -> None:
        """The network and the services alone (Postgres, Redis, S3 with its bucket), each
        waited for: what ``start`` begins with, and what the manifests played with podman
        (``kube``) use."""
        self._check_can_start()
        try:
            self._start_services()
        except BaseException:
            self.stop()
            raise

    def _check_can_start(self) -> None:
        require_podman()
        for ref in self.images.all().values():
            if not exists("image", ref):
                raise ContainerError(f"image {ref} is missing: build the images with "
                                     "`make image`")  # fmt: skip
        if exists("network", self.layout.network):
            raise ContainerError(
                f"a stack named {self.name!r} runs already (its network exists): stop it with "
                f"`cdiflow containers down --name {self.name}`, or choose another --name"
            )

    def _start_services(self) -> None:
        self._folders()
        podman("network", "create", "--label", f"{LABEL}={self.name}", self.layout.network)
        subnet = str(inspect("network", self.layout.network)["subnets"][0]["subnet"])
        self.layout = replace(self.layout, addresses=roles.plan_addresses(self.layout, subnet))
        self.s3_port = free_port()
        for spec in roles.service_specs(self.layout, self.secrets, self.images):
            if spec.role == "s3":
                spec = _with_publish(spec, f"127.0.0.1:{self.s3_port}:{roles.S3_PORT}")
            self._run(spec)
        self._parallel((self._wait_postgres, self._wait_redis, self._wait_s3))

    def _start(self) -> None:
        self._start_services()
        layout, secrets, names = self.layout, self.secrets, self.images  # addresses planned
        self._run(roles.controller_spec(layout, secrets, names))
        self._wait(layout.container("cdi-controller"), self._controller_answers,
                   "the CDI controller to answer")  # fmt: skip
        for host in layout.host_names():
            podman("pod", "create", "--name", layout.pod(host), "--network", layout.network,
                   "--ip", layout.address(host), "--mac-address",
                   roles.mac_for(layout.address(host)), "--label", f"{LABEL}={self.name}",
                   "--share", "ipc,net,uts", "--shm-size", roles.POD_SHM_SIZE)  # fmt: skip
            podman("pod", "start", layout.pod(host))
            self.host_address[host] = _address(inspect("container", self._infra(host)),
                                               layout.network)  # fmt: skip
            self._run(roles.minion_spec(layout, secrets, names, host))
        for host in layout.host_names():
            self._wait(layout.container(f"{host}-minion"), partial(self._minion_ready, host),
                       f"{host}'s minion and gateway")  # fmt: skip
        self._run(roles.api_spec(layout, secrets, names, self.port))
        self._wait(layout.container("api"), lambda: http_ok(f"{self.api_url}/api/healthz"),
                   f"GET {self.api_url}/api/healthz = 200")  # fmt: skip
        self._run(roles.scheduler_spec(layout, secrets, names))
        self._wait(layout.container("scheduler-1"), self._scheduler_turns,
                   "the scheduler's loop to turn")  # fmt: skip
        launched = time.time()
        for n in range(1, layout.workers + 1):
            self._run(roles.worker_spec(layout, secrets, names, n))
        for n in range(1, layout.workers + 1):
            self._wait(layout.container(f"worker-{n}"),
                       partial(self._beats, f"worker-{n}", launched), "its heartbeat")  # fmt: skip

    def _folders(self) -> None:
        """The data folder, root's alone (the containers see only what is mounted into them):
        services' data and each host's socket directory, each owned by the user that writes
        it (a node's hostPath, as the minion's init step leaves it)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        owned = [(self.data_dir / "postgres", roles.UIDS["postgres"], 0o700),
                 (self.data_dir / "s3", roles.UIDS["s3"], 0o700)]  # fmt: skip
        for host in self.layout.host_names():
            folder = self.layout.socket_dir(host)
            # The minion's, its group (the scheduler's and workers') may enter, not write: no
            # one but the minion may put a socket there (it refuses a folder others write).
            owned.append((folder, roles.UIDS["minion"], 0o750))
            for stale in folder.glob("minion.sock*") if folder.is_dir() else ():
                stale.unlink()  # a socket left by a minion that was killed
            # The minion's state folder, begun afresh: a stack that starts has new pods, so
            # the memory a journal of before names went with the old ones.
            state = self.layout.minion_state_dir(host)
            shutil.rmtree(state, ignore_errors=True)
            owned.append((state, roles.UIDS["minion"], 0o700))
        for folder, uid, mode in owned:
            folder.mkdir(parents=True, exist_ok=True)
            shutil.chown(folder, uid, uid)
            folder.chmod(mode)
        (self.data_dir / "hosts").chmod(0o700)
        for host in self.layout.host_names():
            self.layout.socket_dir(host).parent.chmod(0o700)

    def _run(self, spec: ContainerSpec) -> None:
        argv = ["run", "--detach", "--name", spec.name, "--label", f"{LABEL}={self.name}",
                "--label", f"{ROLE_LABEL}={spec.role}", "--user", f"{spec.uid}:{spec.uid}",
                "--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges",
                "--init", "--restart", "always"]  # fmt: skip
        argv += ["--pod", spec.pod] if spec.pod else ["--network", self.layout.network]
        if spec.address is not None:
            argv += ["--ip", spec.address, "--mac-address", roles.mac_for(spec.address)]
        for group in spec.groups:
            argv += ["--group-add", str(group)]
        for key, value in spec.env.items():
            argv += ["--env", f"{key}={value}"]
        if spec.env_file is not None:
            argv += ["--env-file", str(spec.env_file)]
        for source, target, options in spec.mounts:
            argv += ["--volume", f"{source}:{target}:{options}"]
        for published in spec.publish:
            argv += ["--publish", published]
        if spec.entrypoint is not None:
            argv += ["--entrypoint", spec.entrypoint]
        podman(*argv, spec.image, *spec.args)
        self.specs[spec.name] = spec

    def _infra(self, host: str) -> str:
        pod = inspect("pod", self.layout.pod(host))
        return str(pod["InfraContainerID"])

    def _wait(self, container: str, ready: Callable[[], bool], what: str) -> None:
        """Until ``ready()``; ``ContainerError`` with the container's log if it stops
        running or the deadline passes."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            with contextlib.suppress(Exception):  # not up yet: a refused connection, ...
                if ready():
                    return
            state = inspect("container", container)["State"]
            if not state.get("Running") and not state.get("Restarting"):
                raise ContainerError(f"{container} exited (status {state.get('ExitCode')}) "
                                     f"while starting:\n{self.logs(container)}")  # fmt: skip
            if time.monotonic() > deadline:
                raise ContainerError(f"{container} was not ready within "
                                     f"{self.ready_timeout:g} s (waited for {what}):\n"
                                     f"{self.logs(container)}")  # fmt: skip
            time.sleep(0.2)

    def _parallel(self, waits: Iterable[Callable[[], None]]) -> None:
        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(w) for w in waits]:
                future.result()

    def _wait_postgres(self) -> None:
        def answers() -> bool:
            url = self.services.database_url.replace("postgresql+psycopg", "postgresql")
            with psycopg.connect(url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True

        self._wait(self.layout.container("postgres"), answers, "Postgres to take connections")

    def _wait_redis(self) -> None:
        def answers() -> bool:
            client = redis.Redis.from_url(self.services.redis_url, socket_timeout=2)
            try:
                return bool(client.ping())
            finally:
                client.close()

        self._wait(self.layout.container("redis"), answers, "Redis to answer PING")

    def _wait_s3(self) -> None:
        def bucket() -> bool:
            client = self.s3_client()
            try:
                client.create_bucket(Bucket="cdiflow")
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                return code in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}
            finally:
                client.close()
            return True

        self._wait(self.layout.container("s3"), bucket, "the S3 endpoint and its bucket")

    def s3_client(self) -> Any:
        """boto3's S3 client of the stack's endpoint, as this machine reaches it."""
        services = self.services
        return boto3.client(
            "s3", endpoint_url=services.s3_endpoint_url, region_name=services.aws_region,
            aws_access_key_id=services.aws_access_key_id,
            aws_secret_access_key=services.aws_secret_access_key,
            config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 1}),
        )  # fmt: skip

    def _controller(self) -> ControllerClient:
        """The controller as a reader (the stack's own checks: which minions it knows)."""
        address = self.address("cdi-controller")
        token = self.secrets.cdi.reader_token()
        return ControllerClient(f"grpc://{address}:{roles.CONTROLLER_PORT}", timeout=2,
                                token=token)  # fmt: skip

    def _controller_answers(self) -> bool:
        with contextlib.closing(self._controller()) as client:
            client.list_minions()
        return True

    def _minion_ready(self, host: str) -> bool:
        """Its socket answers, and the controller knows its gateway's address."""
        with cdi.Client(str(self.socket_path(host))) as probe:
            probe.stat()
        with contextlib.closing(self._controller()) as client:
            return any(m.host == host and m.rpc_address and m.alive
                       for m in client.list_minions())  # fmt: skip

    def _redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.services.redis_url, decode_responses=True,
                                    socket_timeout=2, socket_connect_timeout=2)  # fmt: skip

    def _scheduler_turns(self) -> bool:
        client = self._redis()
        try:
            return client.hget(keys.SCHEDULERS, "scheduler-1") is not None
        finally:
            client.close()

    def _beats(self, worker: str, launched: float) -> bool:
        client = self._redis()
        try:
            return worker_heartbeat(client, worker, launched)
        finally:
            client.close()


def _address(container: dict[str, Any], network: str) -> str:
    networks = container.get("NetworkSettings", {}).get("Networks") or {}
    found = networks.get(network) or {}
    address = str(found.get("IPAddress") or "")
    if not address:
        raise ContainerError(f"{container.get('Name')} has no address on network {network}")
    return address


def _with_publish(spec: ContainerSpec, published: str) -> ContainerSpec:
    return replace(spec, publish=(*spec.publish, published))


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
