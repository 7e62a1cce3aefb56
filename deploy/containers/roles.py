"""What every container of the stack runs, as whom, with which addresses and secrets: the one
place that decides it.

* **Addresses** (``Layout.addresses``, planned by ``plan_addresses`` once the network exists):
  every container of its own and every host's pod has a fixed address on the stack's network,
  and each listener another container must reach binds that address, named explicitly (the
  controller, the API and its scrape port, the minions' gateways, the workers' scrape ports);
  everything else stays on loopback, as every role defaults to. What podman publishes on this
  machine's loopback (the API, the S3 endpoint) goes to those addresses.
* **Secrets** never travel on a command line: the services read theirs from files under
  ``/run/secrets`` (mounted read-only, owned by the service's user, mode 0400); so do the API
  its admin key (``CDIFLOW_ADMIN_KEY_FILE``) and the CDI roles their credentials
  (``cdi_secrets``: the controller the cluster key; each host's minion its own host's token and
  the gateway key; the API and the scheduler a reader's token; the workers none); the URLs that
  hold passwords (``DATABASE_URL``, ``REDIS_URL``) and the S3 keys reach the roles through an
  environment file of root's alone (``Secrets.env_file``), as a Kubernetes Secret reaches a pod
  through ``envFrom``. ``role_env``, ``secret_env`` and ``cdi_secrets`` are the functions to
  extend when a role needs another setting or secret.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cdi.auth import (
    ANY_HOST,
    CLUSTER_KEY_ENV,
    CONTROLLER_TOKEN_ENV,
    GATEWAY_KEY_ENV,
    ClusterCredentials,
    read_secret_file,
)
from deploy.containers.errors import ContainerError
from deploy.containers.images import Images
from orchestrator.apikeys import ensure_key_file
from orchestrator.contract.alive import ALIVE_FILE_ENV
from orchestrator.services.credentials import ServiceCredentials

__all__ = [
    "API_PORT",
    "CONTROLLER_PORT",
    "METRICS_PORT",
    "RPC_PORT",
    "S3_PORT",
    "UIDS",
    "CdiSecrets",
    "ContainerSpec",
    "Layout",
    "Secrets",
    "api_spec",
    "cdi_secrets",
    "controller_spec",
    "mac_for",
    "minion_spec",
    "plan_addresses",
    "role_env",
    "scheduler_spec",
    "secret_env",
    "service_specs",
    "worker_spec",
]

API_PORT: Final = 8000
METRICS_PORT: Final = 9100  # the API's; worker n serves on METRICS_PORT + n
CONTROLLER_PORT: Final = 50051
RPC_PORT: Final = 7100  # a minion's gateway: objects from other hosts
POSTGRES_PORT: Final = 5432
REDIS_PORT: Final = 6379
S3_PORT: Final = 7070
SOCKET_DIR: Final = "/run/cdi"  # a host's minion socket directory, in every container there
# The minion's state folder (docs/minion-restart.md), a folder of this machine per host: its
# objects outlive the minion's container. Their memory is in the pod's /dev/shm (the pods
# share IPC), which outlives the pod's containers, not the pod.
MINION_STATE_DIR: Final = "/var/lib/cdi-minion"
MINION_MEMORY: Final = "2GiB"
POD_SHM_SIZE: Final = "2304m"  # the minion's memory and room for the pod's other users
SECRETS_DIR: Final = "/run/secrets"
TASKS_DIR: Final = "/opt/tasks"
# The uids deploy/k8s/ runs the roles as (deploy/image/python.Containerfile makes the users);
# the minion's group owns the socket directory, which the scheduler and the workers join.
UIDS: Final = {
    "minion": 10000,
    "controller": 10001,
    "api": 10002,
    "scheduler": 10003,
    "worker": 10004,
    "postgres": 10010,
    "redis": 10011,
    "s3": 10012,
}
SOCKET_GROUP: Final = UIDS["minion"]


@dataclass(frozen=True)
class Layout:
    """The stack's shape: its name (every podman object's prefix and label), its hosts and
    where each worker runs, its data folder on this machine."""

    name: str
    data_dir: Path
    hosts: int
    workers: int
    tasks: tuple[Path, ...] = ()  # folders of task code, mounted into the API and workers
    # Each container of its own (by role: "api", "cdi-controller", ...) and each host's pod
    # (by host) -> its address on the network (``plan_addresses``, once the network exists).
    addresses: Mapping[str, str] = field(default_factory=dict)

    def host_names(self) -> list[str]:
        return [f"host{n}" for n in range(1, self.hosts + 1)]

    def worker_host(self, n: int) -> str:
        """Worker ``n`` (from 1) runs on host ((n - 1) mod hosts) + 1, as ``cdiflow up``'s."""
        return f"host{(n - 1) % self.hosts + 1}"

    def container(self, role: str) -> str:
        return f"{self.name}-{role}"

    def pod(self, host: str) -> str:
        return f"{self.name}-{host}"

    def address(self, where: str) -> str:
        """The planned address of a role's container or a host's pod."""
        try:
            return self.addresses[where]
        except KeyError:
            raise ContainerError(f"no address is planned for {where}: the network is not "
                                 "made yet") from None  # fmt: skip

    def socket_dir(self, host: str) -> Path:
        """A host's minion socket directory on this machine (a node's hostPath)."""
        return self.data_dir / "hosts" / host / "cdi"

    def minion_state_dir(self, host: str) -> Path:
        """A host's minion state folder on this machine (the journal of its objects)."""
        return self.data_dir / "hosts" / host / "minion-state"

    @property
    def network(self) -> str:
        return self.name

    @property
    def controller_url(self) -> str:
        return f"grpc://{self.container('cdi-controller')}:{CONTROLLER_PORT}"


# The containers of their own that get a fixed address (the hosts' pods follow).
_ADDRESSED: Final = ("postgres", "redis", "s3", "cdi-controller", "api")
_FIRST_ADDRESS: Final = 10  # below: the network's gateway and what podman hands out itself


def plan_addresses(layout: Layout, subnet: str) -> dict[str, str]:
    """A fixed address on the network ``subnet`` for each container of its own and each
    host's pod, from the subnet's 10th host address on (``podman run/pod create --ip``, with
    ``mac_for`` its MAC): a container restarted, made anew or joined to the network again
    keeps it, and every listener can be bound to it by name before the container starts."""
    places = [*_ADDRESSED, *layout.host_names()]
    free = itertools.islice(ipaddress.ip_network(subnet).hosts(), _FIRST_ADDRESS - 1, None)
    plan = {place: str(address) for place, address in zip(places, free, strict=False)}
    if len(plan) < len(places):
        raise ContainerError(f"the network {subnet} has too few addresses for the stack")
    return plan


def mac_for(address: str) -> str:
    """The MAC that goes with a planned IPv4 ``address`` (locally administered, unicast).
    *Why a fixed one:* podman gives a container started again a new MAC; at the same address
    the other containers' neighbour tables then point at the old one, and their connections
    to it go nowhere until those entries expire (a Postgres or S3 run again would be unreachable
    until then)."""
    packed = ipaddress.IPv4Address(address).packed
    return ":".join(f"{b:02x}" for b in (0x02, 0x00, *packed))


@dataclass(frozen=True)
class ContainerSpec:
    """One container: what ``podman run`` gets."""

    name: str
    role: str
    image: str
    args: tuple[str, ...]
    uid: int
    groups: tuple[int, ...] = ()
    entrypoint: str | None = None  # None: the image's
    env: dict[str, str] = field(default_factory=dict)
    env_file: Path | None = None  # secrets, root's alone
    mounts: tuple[tuple[Path, str, str], ...] = ()  # (on this machine, in the container, opts)
    pod: str | None = None  # a host's pod, else a container of its own on the network
    address: str | None = None  # a container of its own: its fixed address on the network
    publish: tuple[str, ...] = ()  # "127.0.0.1:<port>:<port in the container>"


class Secrets:
    """The stack's secrets, generated once per data folder and kept there: the services'
    (``credentials.json``, 0600, as ``cdiflow up`` keeps them), the API's admin key
    (``api-key``, 0600) and the CDI cluster's keys and tokens (``cdi-credentials/``: a token
    for each of ``hosts``, and one for any host, as a DaemonSet's one Secret holds)."""

    def __init__(self, data_dir: Path, hosts: list[str] | tuple[str, ...] = ()) -> None:
        self.folder = data_dir / "secrets"
        self.credentials = ServiceCredentials.load_or_create(data_dir)
        self.admin_key_file, self.admin_key = ensure_key_file(data_dir)
        self.cdi = ClusterCredentials.ensure(data_dir / "cdi-credentials", [*hosts, ANY_HOST])

    def cdi_secret(self, path: Path) -> str:
        """One of the CDI credentials' files, read."""
        return read_secret_file(path, what="CDI credential")

    def file_for(self, name: str, value: str, uid: int) -> Path:
        """``value`` in a file only ``uid`` may read (0400), to mount at /run/secrets/NAME."""
        folder = self.folder / str(uid)
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o711)
        os.chmod(folder, 0o700)
        os.chown(folder, uid, uid)
        path = folder / name
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o400)
        with os.fdopen(fd, "w") as out:
            out.write(value)
        os.chown(tmp, uid, uid)
        tmp.replace(path)
        return path

    def env_file(self, role: str, values: dict[str, str]) -> Path:
        """``values`` as an environment file podman reads (root's alone, 0600)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{role}.env"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.writelines(f"{key}={value}\n" for key, value in values.items())
        return path


def secret_env(layout: Layout, secrets: Secrets) -> dict[str, str]:
    """The settings that carry a secret, for the API, the scheduler and the workers."""
    creds = secrets.credentials
    postgres = layout.container("postgres")
    redis = layout.container("redis")
    return {
        "DATABASE_URL": f"postgresql+psycopg://cdiflow:{creds.postgres_password}@{postgres}:"
        f"{POSTGRES_PORT}/cdiflow",
        "REDIS_URL": f"redis://:{creds.redis_password}@{redis}:{REDIS_PORT}/0",
        "AWS_ACCESS_KEY_ID": creds.s3_access_key_id,
        "AWS_SECRET_ACCESS_KEY": creds.s3_secret_access_key,
    }


@dataclass(frozen=True)
class CdiSecrets:
    """A role's CDI credentials: the ``_FILE`` variables, and the files mounted for them."""

    env: dict[str, str]
    mounts: tuple[tuple[Path, str, str], ...]


def cdi_secrets(secrets: Secrets, role: str, uid: int, host: str = "") -> CdiSecrets:
    """What ``role`` needs of the CDI cluster's credentials, as files its ``uid`` alone reads
    (mounted under /run/secrets) and the ``_FILE`` variables that name them: the controller
    the cluster key; ``host``'s minion its token and the gateway key; the API and the scheduler
    a reader's token (the directory: ``/api/cdi/objects``, the orphan sweep on every host);
    anything else nothing."""
    cdi = secrets.cdi
    wanted: dict[str, tuple[str, Path]] = {}  # variable -> (file name, the credential's file)
    if role == "controller":
        wanted[CLUSTER_KEY_ENV] = ("cdi-cluster.key", cdi.cluster_key_file)
    elif role == "minion":
        wanted[CONTROLLER_TOKEN_ENV] = (f"cdi-minion-{host}.token", cdi.minion_token_file(host))
        wanted[GATEWAY_KEY_ENV] = ("cdi-gateway.key", cdi.gateway_key_file)
    elif role in ("api", "scheduler"):
        wanted[CONTROLLER_TOKEN_ENV] = ("cdi-reader.token", cdi.reader_token_file)
    env, mounts = {}, []
    for variable, (name, source) in wanted.items():
        inside = f"{SECRETS_DIR}/{name}"
        mounts.append((secrets.file_for(name, secrets.cdi_secret(source), uid), inside, "ro"))
        env[f"{variable}_FILE"] = inside
    return CdiSecrets(env, tuple(mounts))


def role_env(layout: Layout) -> dict[str, str]:
    """The settings without a secret that the API, the scheduler and the workers share."""
    env = {
        "S3_ENDPOINT_URL": f"http://{layout.container('s3')}:{S3_PORT}",
        "S3_BUCKET": "cdiflow",
        "AWS_REGION": "us-east-1",
        "CDI_CONTROLLER_URL": layout.controller_url,
    }
    if layout.tasks:
        env["CDIFLOW_TASK_PATHS"] = ":".join(
            f"{TASKS_DIR}/{n}" for n in range(1, len(layout.tasks) + 1)
        )
    return env


def _task_mounts(layout: Layout) -> tuple[tuple[Path, str, str], ...]:
    return tuple((folder, f"{TASKS_DIR}/{n}", "ro") for n, folder in enumerate(layout.tasks, 1))


def _socket_mount(layout: Layout, host: str) -> tuple[Path, str, str]:
    return (layout.socket_dir(host), SOCKET_DIR, "rw")


def service_specs(layout: Layout, secrets: Secrets, images: Images) -> list[ContainerSpec]:
    """Postgres, Redis and the S3 endpoint, each with its data folder and its secrets."""
    creds = secrets.credentials
    pg, rd, s3 = UIDS["postgres"], UIDS["redis"], UIDS["s3"]
    return [
        ContainerSpec(
            layout.container("postgres"), "postgres", images.postgres, ("postgres",), pg,
            address=layout.address("postgres"),
            mounts=(
                (layout.data_dir / "postgres", "/var/lib/postgresql/data", "rw"),
                (secrets.file_for("postgres-admin-password", creds.postgres_admin_password, pg),
                 f"{SECRETS_DIR}/postgres-admin-password", "ro"),
                (secrets.file_for("postgres-password", creds.postgres_password, pg),
                 f"{SECRETS_DIR}/postgres-password", "ro"),
            ),
        ),
        ContainerSpec(
            layout.container("redis"), "redis", images.redis, ("redis",), rd,
            address=layout.address("redis"),
            mounts=((secrets.file_for("redis-password", creds.redis_password, rd),
                     f"{SECRETS_DIR}/redis-password", "ro"),),
        ),
        ContainerSpec(
            layout.container("s3"), "s3", images.s3, ("s3",), s3,
            address=layout.address("s3"),
            mounts=(
                (layout.data_dir / "s3", "/data", "rw"),
                (secrets.file_for("s3-access-key-id", creds.s3_access_key_id, s3),
                 f"{SECRETS_DIR}/s3-access-key-id", "ro"),
                (secrets.file_for("s3-secret-access-key", creds.s3_secret_access_key, s3),
                 f"{SECRETS_DIR}/s3-secret-access-key", "ro"),
            ),
        ),
    ]  # fmt: skip


def controller_spec(layout: Layout, secrets: Secrets, images: Images) -> ContainerSpec:
    """The CDI controller, on its own address; the cluster key from a file."""
    uid = UIDS["controller"]
    listen = f"{layout.address('cdi-controller')}:{CONTROLLER_PORT}"
    cdi = cdi_secrets(secrets, "controller", uid)
    return ContainerSpec(
        layout.container("cdi-controller"), "controller", images.product,
        ("cdi", "controller", "--listen", listen), uid,
        env=cdi.env, mounts=cdi.mounts, address=layout.address("cdi-controller"),
    )  # fmt: skip


def minion_spec(layout: Layout, secrets: Secrets, images: Images, host: str) -> ContainerSpec:
    """``host``'s minion, in its pod: the socket in the host's socket directory, its gateway
    listening for other hosts' objects on the pod's address, which it advertises; its host's
    token and the gateway key from files; its state folder (``MINION_STATE_DIR``) from this
    machine, so that a minion whose container is killed, restarted or made anew in the pod
    finds its objects again (``--term-keeps``: the SIGTERM of ``podman stop`` or ``restart``
    too), and the containers of the pod (other pid namespaces) come back to it with their
    resume tokens."""
    uid = UIDS["minion"]
    names = f"scheduler-*={UIDS['scheduler']},worker-*={UIDS['worker']}"
    address = layout.address(host)
    cdi = cdi_secrets(secrets, "minion", uid, host)
    return ContainerSpec(
        layout.container(f"{host}-minion"), "minion", images.product,
        ("cdi", "minion", "--socket", f"{SOCKET_DIR}/minion.sock", "--host", host,
         "--memory-limit", MINION_MEMORY, "--names", names, "--state-dir", MINION_STATE_DIR,
         "--term-keeps"),
        uid,
        env={"CDI_CONTROLLER_URL": layout.controller_url,
             "CDI_RPC_LISTEN": f"{address}:{RPC_PORT}",
             "CDI_RPC_ADVERTISE": f"{address}:{RPC_PORT}", **cdi.env},
        mounts=(_socket_mount(layout, host),
                (layout.minion_state_dir(host), MINION_STATE_DIR, "rw"), *cdi.mounts),
        pod=layout.pod(host),
    )  # fmt: skip


def api_spec(layout: Layout, secrets: Secrets, images: Images, port: int) -> ContainerSpec:
    """The REST API and the dashboard, and its scrape port, on its own address; published on
    this machine's loopback at ``port``."""
    uid = UIDS["api"]
    address = layout.address("api")
    key = secrets.file_for("admin-key", secrets.admin_key, uid)
    cdi = cdi_secrets(secrets, "api", uid)
    return ContainerSpec(
        layout.container("api"), "api", images.product,
        ("-m", "orchestrator.controller", "--host", address, "--port", str(API_PORT),
         "--metrics-host", address, "--metrics-port", str(METRICS_PORT)),
        uid, entrypoint="python",
        env=role_env(layout) | {"CDIFLOW_ADMIN_KEY_FILE": f"{SECRETS_DIR}/admin-key"} | cdi.env,
        env_file=secrets.env_file("api", secret_env(layout, secrets)),
        mounts=((key, f"{SECRETS_DIR}/admin-key", "ro"), *cdi.mounts, *_task_mounts(layout)),
        address=address,
        publish=(f"127.0.0.1:{port}:{API_PORT}",),
    )  # fmt: skip


def scheduler_spec(layout: Layout, secrets: Secrets, images: Images) -> ContainerSpec:
    """The scheduler, on host 1 (the pod's minion is its own); it listens on nothing."""
    uid = UIDS["scheduler"]
    cdi = cdi_secrets(secrets, "scheduler", uid)
    return ContainerSpec(
        layout.container("scheduler-1"), "scheduler", images.product,
        ("scheduler", "--id", "scheduler-1"), uid, groups=(SOCKET_GROUP,),
        env=role_env(layout) | {"CDI_URL": f"unix://{SOCKET_DIR}/minion.sock",
                                ALIVE_FILE_ENV: "/tmp/alive"} | cdi.env,
        env_file=secrets.env_file("scheduler", secret_env(layout, secrets)),
        mounts=(_socket_mount(layout, "host1"), *cdi.mounts),
        pod=layout.pod("host1"),
    )  # fmt: skip


def worker_spec(layout: Layout, secrets: Secrets, images: Images, n: int) -> ContainerSpec:
    """Worker ``n``, on its host; its metrics on ``METRICS_PORT + n`` of the pod's address.
    No CDI credential: task code runs here."""
    host = layout.worker_host(n)
    return ContainerSpec(
        layout.container(f"worker-{n}"), "worker", images.product,
        ("worker", "--id", f"worker-{n}"), UIDS["worker"], groups=(SOCKET_GROUP,),
        env=role_env(layout) | {"CDI_URL": f"unix://{SOCKET_DIR}/minion.sock",
                                ALIVE_FILE_ENV: "/tmp/alive",
                                "CDIFLOW_WORKER_METRICS_HOST": layout.address(host),
                                "CDIFLOW_WORKER_METRICS_PORT": str(METRICS_PORT + n)},
        env_file=secrets.env_file("worker", secret_env(layout, secrets)),
        mounts=(_socket_mount(layout, host), *_task_mounts(layout)),
        pod=layout.pod(host),
    )  # fmt: skip
