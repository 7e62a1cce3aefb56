"""The Kubernetes manifests (``deploy/k8s``) played with ``podman kube play``: what a cluster
would start, on this machine, as far as podman 4 can play it.

The manifests are rendered by kustomize through an overlay with this machine's values, as a
user's overlay gives theirs: the images ``make image`` built, the services' addresses and
secrets, a generated admin key. The rendered objects are then played as pods on one podman
network, each *node* a folder of this machine standing for a node's file system (the
hostPath of the minion's socket folder):

* a DaemonSet's pod template once per node (the minion), a Deployment's once (the CDI
  controller, the API), or once per node (the scheduler on node 1, a worker on each);
* ``spec.nodeName`` and ``status.podIP``, which podman does not fill in, are given as the
  node's name and the pod's address (assigned with ``--ip``), and ``$(VAR)`` in a value is
  expanded from the variables before it, as the kubelet does;
* each Secret becomes a podman secret that ``secretRef`` and ``secretKeyRef`` read (podman 4.3
  cannot read back the secrets it makes from a Secret object), named for this run; the CDI
  cluster's credentials are made for the run (``cdi-credentials``: the Secret's keys are the
  files of ``cdiflow cdi credentials --any-host``);
* init containers run at every start of their pod, as in Kubernetes (podman's ``always``),
  and the pod restarts its containers ``OnFailure`` rather than ``Always``: podman 4.3 applies
  the pod's policy to its init containers too, and would run them again and again (the
  product's processes exit non-zero when they fail, so they are restarted all the same);
* Services, NetworkPolicies and the Namespace have no podman counterpart and are left out:
  pods find each other by their names on the network (the overlay names the controller's
  pod), and nothing restricts traffic;
* each ``emptyDir`` becomes a folder of the pod's own, emptied when the pod is played again:
  podman 4.3 would give every pod that names a volume alike the same one (the minions of two
  nodes one state folder), and on disk even for ``medium: Memory``;
* container ports are left out too (podman 4.3 would publish each one on this machine, so a
  DaemonSet's second pod could not start), and probes name their port by number.

Liveness probes become podman health checks, which run only under systemd (not here): the
tests run each probe themselves. Postgres, Redis and S3 come from the service images
(``ContainerStack.start_services``), as managed services would.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final, Self

import yaml

import cdi
from cdi.auth import ANY_HOST
from deploy.containers import roles
from deploy.containers.errors import ContainerError
from deploy.containers.images import Images, images
from deploy.containers.podman import CHECKOUT, inspect, podman, podman_env
from deploy.containers.stack import ContainerStack
from orchestrator.apikeys import generate_key
from orchestrator.services import RunningServices
from orchestrator.stack.probes import http_ok
from orchestrator.started import StartStop

__all__ = ["K8S", "KubeStack", "PlayedPod", "kustomize_command", "render"]

K8S: Final = CHECKOUT / "deploy" / "k8s"
SOCKET_DIR: Final = "/run/cdi/cdiflow"  # the base install's node folder (deploy/k8s)
_ALWAYS_INIT: Final = {"io.podman.annotations.init.container.type": "always"}
_VAR: Final = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kustomize_command() -> list[str] | None:
    """``kustomize build`` or ``kubectl kustomize``, whichever is here (``make kustomize``
    builds kustomize with Go where neither is)."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    built = Path.home() / "go" / "bin" / "kustomize"
    return [str(built), "build"] if built.exists() else None


def render(overlay: dict[str, Any]) -> list[dict[str, Any]]:
    """``deploy/k8s`` rendered by kustomize through ``overlay`` (a kustomization without
    ``resources``, which this fills in); the overlay is written where only root reads it (it
    may hold secrets) and removed after."""
    command = kustomize_command()
    if command is None:
        raise ContainerError("neither kustomize nor kubectl is installed: `make kustomize` "
                             "builds kustomize with Go")  # fmt: skip
    root = CHECKOUT / "build" / "kube"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overlay-", dir=root) as folder:
        os.chmod(folder, 0o700)
        body = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [os.path.relpath(K8S, folder)], **overlay}  # fmt: skip
        (Path(folder) / "kustomization.yaml").write_text(yaml.safe_dump(body))
        done = subprocess.run([*command, folder], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ContainerError(f"kustomize failed: {done.stderr[-2000:]}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@dataclass
class PlayedPod:
    """One pod played from a workload: its name, node (None: none), address, and spec."""

    name: str
    workload: str
    node: str | None
    address: str
    doc: dict[str, Any]
    containers: list[str] = field(default_factory=list)


class KubeStack(StartStop):
    """``deploy/k8s`` played with podman on ``nodes`` nodes, with the service images for
    Postgres, Redis and S3. Reachable like any stack (``api_url``, ``auth_headers``,
    ``services``)."""

    def __init__(self, data_dir: Path, *, nodes: int = 2, images_: Images | None = None,
                 ready_timeout: float = 180.0) -> None:  # fmt: skip
        self.run = os.urandom(3).hex()
        self.images = images_ or images()
        self.data_dir = data_dir.expanduser().absolute()
        self.nodes = [f"host{n}" for n in range(1, nodes + 1)]
        self.ready_timeout = ready_timeout
        self.services_stack = ContainerStack(
            self.data_dir / "services", name=f"cdiflow-k{self.run}", images_=self.images, port=0
        )
        self.admin_key = generate_key()
        self.pods: dict[str, PlayedPod] = {}
        self.secrets: list[str] = []  # podman secrets made for this run
        self.rendered: list[dict[str, Any]] = []
        self._addresses: Iterator[str] | None = None
        self._assigned: dict[tuple[str, str | None], str] = {}  # (workload, node) -> address

    # -- a stack, as clients see it -------------------------------------------------------

    @property
    def network(self) -> str:
        return self.services_stack.layout.network

    @property
    def api_url(self) -> str:
        return f"http://{self.pod('cdiflow-api').address}:8000"

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}

    @property
    def services(self) -> RunningServices:
        return self.services_stack.services

    def pod(self, workload: str, node: str | None = None) -> PlayedPod:
        """The pod played from ``workload`` (on ``node``)."""
        for played in self.pods.values():
            if played.workload == workload and (node is None or played.node == node):
                return played
        raise KeyError(f"no pod of {workload} on {node}")

    def node_dir(self, node: str) -> Path:
        """The folder standing for ``node``'s root file system."""
        return self.data_dir / "nodes" / node

    # -- start and stop --------------------------------------------------------------------

    def start(self) -> Self:
        try:
            self.services_stack.start_services()
            self._addresses = self._free_addresses()
            self.rendered = render(self._overlay())
            self._play_all()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Every pod, secret, service container and the network, by name and label."""
        names = list(self.pods)
        if names:
            # Every pod's containers at once (podman stops the containers of one command in
            # parallel, the pods of `pod rm` one after the other).
            containers = [c for played in self.pods.values() for c in played.containers]
            podman("stop", "--time", "5", *containers, check=False)
            podman("pod", "rm", "--force", "--time", "5", *names, check=False)
        for secret in self.secrets:
            podman("secret", "rm", secret, check=False)
        self.pods.clear()
        self.secrets.clear()
        self.services_stack.stop(remove_data=True, timeout=5)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def replay(self, workload: str, node: str | None = None) -> PlayedPod:
        """Remove the pod of ``workload`` (on ``node``) and play it again, as Kubernetes
        makes a pod anew on the same node (a rollout, a reboot): its init containers run
        again on what the node keeps."""
        old = self.pod(workload, node)
        podman("pod", "rm", "--force", "--time", "5", old.name)
        del self.pods[old.name]
        played = self._play(old.workload, old.node, old.address)
        if workload == "cdi-minion" and old.node is not None:
            self._wait(played, partial(self._minion_answers, old.node), "the minion to answer")
        return played

    # -- what the overlay says -------------------------------------------------------------

    def _overlay(self) -> dict[str, Any]:
        """This machine's values over the manifests: the images, the services, the secrets,
        the controller's pod name, and the API's address among the hosts it answers to."""
        creds = self.services_stack.secrets.credentials
        layout = self.services_stack.layout
        secret_env = roles.secret_env(layout, self.services_stack.secrets)
        api_address = self._address_of("cdiflow-api", None)
        config = {
            "S3_ENDPOINT_URL": f"http://{layout.container('s3')}:{roles.S3_PORT}",
            "CDI_CONTROLLER_URL": f"grpc://{self._pod_name('cdi-controller', None)}:"
            f"{roles.CONTROLLER_PORT}",
            "CDIFLOW_ALLOWED_HOSTS": f"localhost,{api_address}",
        }
        secrets = {
            "DATABASE_URL": secret_env["DATABASE_URL"],
            "REDIS_URL": secret_env["REDIS_URL"],
            "AWS_ACCESS_KEY_ID": creds.s3_access_key_id,
            "AWS_SECRET_ACCESS_KEY": creds.s3_secret_access_key,
        }
        return {
            "images": [{"name": "cdiflow", "newName": self.images.product.rpartition(":")[0],
                        "newTag": self.images.version}],
            "patches": [
                _data_patch("ConfigMap", "cdiflow-config", "data", config),
                _data_patch("Secret", "cdiflow-secrets", "stringData", secrets),
                _data_patch("Secret", "cdiflow-api-key", "stringData",
                            {"CDIFLOW_ADMIN_KEY": self.admin_key}),
                _data_patch("Secret", "cdi-credentials", "stringData", self._cdi_credentials()),
            ],
        }  # fmt: skip

    def _cdi_credentials(self) -> dict[str, str]:
        """The CDI cluster's keys and tokens, each under the name of the file `cdiflow cdi
        credentials --any-host` writes it to (the keys of the manifests' Secret)."""
        secrets = self.services_stack.secrets
        made = secrets.cdi
        files = (made.cluster_key_file, made.gateway_key_file, made.reader_token_file,
                 made.minion_token_file(ANY_HOST))  # fmt: skip
        return {path.name: secrets.cdi_secret(path) for path in files}

    # -- playing ---------------------------------------------------------------------------

    def _play_all(self) -> None:
        for doc in self.rendered:
            if doc["kind"] == "Secret":
                self._secret(doc)
        self._play("cdi-controller", None)
        for node in self.nodes:
            self._play("cdi-minion", node)
        for node in self.nodes:
            self._wait(self.pod("cdi-minion", node), partial(self._minion_answers, node),
                       "the minion's socket to answer")  # fmt: skip
        api = self._play("cdiflow-api", None)
        self._wait(api, lambda: http_ok(f"{self.api_url}/api/healthz"), "/api/healthz")
        self._play("cdiflow-scheduler", self.nodes[0])
        for node in self.nodes:
            self._play("cdiflow-worker", node)
        self._wait(api, lambda: http_ok(f"{self.api_url}/api/readyz"), "/api/readyz = 200")

    def _play(self, workload: str, node: str | None, address: str | None = None) -> PlayedPod:
        [template] = [d for d in self.rendered if d["metadata"]["name"] == workload
                      and d["kind"] in ("Deployment", "DaemonSet")]  # fmt: skip
        name = self._pod_name(workload, node)
        address = address or self._address_of(workload, node)
        doc = _pod(template, name, node, address, self._node_path(node), self._secret_name)
        for volume in doc["spec"].get("volumes", []):
            if "emptyDir" in volume:
                volume.pop("emptyDir")
                volume["hostPath"] = {"path": str(self._empty_dir(name, volume["name"])),
                                      "type": "Directory"}  # fmt: skip
        configmaps = [d for d in self.rendered if d["kind"] == "ConfigMap"]
        folder = self.data_dir / "pods"
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all([*configmaps, _unpublished(doc)]))
        podman("kube", "play", "--network", self.network, "--ip", address, "--mac-address",
               roles.mac_for(address), str(path))  # fmt: skip
        path.unlink()
        containers = [f"{name}-{c['name']}" for c in doc["spec"]["containers"]]
        played = PlayedPod(name, workload, node, address, doc, containers)
        self.pods[name] = played
        return played

    def _empty_dir(self, pod: str, volume: str) -> Path:
        """An ``emptyDir`` of ``pod``: a folder of its own, empty at each play of the pod (a
        new pod), mode 0777 as the kubelet makes one."""
        folder = self.data_dir / "empty-dirs" / pod / volume
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        folder.chmod(0o777)
        return folder

    def _secret(self, doc: dict[str, Any]) -> None:
        """A Secret as the podman secret ``secretRef`` reads: a JSON map of base64 values."""
        values = {k: base64.b64encode(v.encode()).decode()
                  for k, v in (doc.get("stringData") or {}).items()}  # fmt: skip
        values |= doc.get("data") or {}
        name = self._secret_name(doc["metadata"]["name"])
        podman("secret", "create", name, "-", stdin=json.dumps(values))
        self.secrets.append(name)

    def _secret_name(self, name: str) -> str:
        return f"{name}-k{self.run}"

    def _pod_name(self, workload: str, node: str | None) -> str:
        # The workload's name first: the minion lets cdiflow-scheduler-* and cdiflow-worker-*
        # register as their uids (its --names), as it does pods of those Deployments.
        return f"{workload}-k{self.run}" + (f"-{node}" if node else "")

    def _node_path(self, node: str | None) -> str:
        """The minion's socket folder on ``node``."""
        if node is None:
            return SOCKET_DIR
        return str(self.node_dir(node)) + SOCKET_DIR

    def _address_of(self, workload: str, node: str | None) -> str:
        """Each pod's address, fixed before it is played (a pod's IP, as status.podIP)."""
        key = (workload, node)
        if key not in self._assigned:
            assert self._addresses is not None
            self._assigned[key] = next(self._addresses)
        return self._assigned[key]

    def _free_addresses(self) -> Iterator[str]:
        """Addresses of the network above those podman gave the services (from .100)."""
        network = json.loads(podman("network", "inspect", self.network))[0]
        subnet = ipaddress.ip_network(network["subnets"][0]["subnet"])
        hosts = list(subnet.hosts())
        return iter(str(a) for a in hosts[99:])

    def _minion_answers(self, node: str) -> bool:
        socket = self.node_dir(node) / SOCKET_DIR.lstrip("/") / "minion.sock"
        with cdi.Client(str(socket), timeout=2) as client:
            client.stat()
        return True

    def _wait(self, played: PlayedPod, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            try:
                if ready():
                    return
            except Exception:  # not up yet
                pass
            for container in played.containers:
                state = inspect("container", container)["State"]
                if state.get("Status") == "exited" and state.get("ExitCode"):
                    tail = podman("logs", "--tail", "40", container, check=False)
                    raise ContainerError(f"{container} exited ({state['ExitCode']}):\n{tail}")
            if time.monotonic() > deadline:
                logs = "\n".join(podman("logs", "--tail", "20", c, check=False)
                                 for c in played.containers)  # fmt: skip
                raise ContainerError(f"{played.name} was not ready within "
                                     f"{self.ready_timeout:g} s ({what}):\n{logs}")  # fmt: skip
            time.sleep(0.3)

    def logs(self) -> dict[str, str]:
        """Every played container's log."""
        found = {}
        for played in self.pods.values():
            for container in played.containers:
                done = subprocess.run(["podman", "logs", container], capture_output=True,
                                      text=True, env=podman_env(), check=False)  # fmt: skip
                found[container] = done.stdout + done.stderr
        return found


def _data_patch(kind: str, name: str, field: str, values: dict[str, str]) -> dict[str, Any]:
    ops = [{"op": "add", "path": f"/{field}/{key}", "value": value}
           for key, value in values.items()]  # fmt: skip
    return {"target": {"kind": kind, "name": name}, "patch": yaml.safe_dump(ops)}


def _pod(
    template: dict[str, Any],
    name: str,
    node: str | None,
    address: str,
    socket_dir: str,
    secret_name: Callable[[str], str],
) -> dict[str, Any]:
    """A Pod from a workload's template, as podman can play it (see the module's text)."""
    spec = copy.deepcopy(template["spec"]["template"]["spec"])
    spec["restartPolicy"] = "OnFailure"
    metadata = template["spec"]["template"].get("metadata", {})
    for volume in spec.get("volumes", []):
        if "hostPath" in volume and volume["hostPath"]["path"] == SOCKET_DIR:
            volume["hostPath"]["path"] = socket_dir
    for container in [*spec["containers"], *spec.get("initContainers", [])]:
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                source["secretRef"]["name"] = secret_name(source["secretRef"]["name"])
        known: dict[str, str] = {}
        for env in container.get("env", []):
            if (ref := env.get("valueFrom", {}).get("secretKeyRef")) is not None:
                ref["name"] = secret_name(ref["name"])
            field = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if field == "spec.nodeName":
                env.pop("valueFrom")
                env["value"] = node or ""
            elif field == "status.podIP":
                env.pop("valueFrom")
                env["value"] = address
            if "value" in env:
                env["value"] = _expand(str(env["value"]), known)
                known[env["name"]] = env["value"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(metadata.get("labels", {})),
                     "annotations": {**metadata.get("annotations", {}), **_ALWAYS_INIT}},
        "spec": spec,
    }  # fmt: skip


def _expand(value: str, known: dict[str, str]) -> str:
    """``$(NAME)`` replaced by the value of a variable defined before it (the kubelet's rule;
    an unknown one is left as written)."""
    return _VAR.sub(lambda m: known.get(m[1], m[0]), value)


def _unpublished(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` without container ports, its probes' named ports turned into numbers."""
    pod = copy.deepcopy(pod)
    for container in [*pod["spec"]["containers"], *pod["spec"].get("initContainers", [])]:
        ports = {p["name"]: p["containerPort"] for p in container.pop("ports", []) if "name" in p}
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            for check in ("httpGet", "tcpSocket"):
                target = container.get(kind, {}).get(check)
                if target is not None and target.get("port") in ports:
                    target["port"] = ports[target["port"]]
    return pod
