"""The Kubernetes manifests, rendered by kustomize and played with ``podman kube play`` on two
nodes (``deploy.containers.kube``): the stack they start passes its probes and runs
``image_pipeline`` across the nodes with the right pixels, and the minion's pod starts again
on a node it ran on (its init step finds the socket folder it left)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.containers.images import images
from deploy.containers.kube import KubeStack, kustomize_command
from deploy.containers.podman import podman, podman_env
from tests.deploy.support import crossings, require_podman_stack, run_forks, run_pipelines

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    require_podman_stack()
    if kustomize_command() is None:
        pytest.skip("neither kustomize nor kubectl is installed (`make kustomize` builds it)")
    folder: Path = tmp_path_factory.mktemp("kube")
    played = KubeStack(folder / "data", nodes=2)
    try:
        yield played.start()
    finally:
        names, secrets = list(played.pods), list(played.secrets)
        played.stop()
        left = podman("pod", "ps", "--format", "{{.Name}}").split()
        assert not set(names) & set(left), left
        assert not set(secrets) & set(podman("secret", "ls", "--format", "{{.Name}}").split())


def test_every_probe_of_the_manifests_passes_on_the_played_pods(kube: KubeStack) -> None:
    """podman keeps liveness probes as health checks that only systemd would run: each probe
    is run here as the kubelet would, against its pod."""
    checked = 0
    for played in kube.pods.values():
        for container in played.doc["spec"]["containers"]:
            for kind in ("livenessProbe", "readinessProbe"):
                if kind in container:
                    _probe(kube, played.address, f"{played.name}-{container['name']}",
                           container, container[kind])  # fmt: skip
                    checked += 1
    assert checked >= len(kube.pods)  # every container has at least its liveness probe


def _probe(kube: KubeStack, address: str, name: str, container: dict[str, Any],
           probe: dict[str, Any]) -> None:  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    if "exec" in probe:
        done = subprocess.run(["podman", "exec", name, *probe["exec"]["command"]],
                              capture_output=True, text=True, env=podman_env(), timeout=60,
                              check=False)  # fmt: skip
        assert done.returncode == 0, (name, probe, done.stdout, done.stderr)
    elif "httpGet" in probe:
        get = probe["httpGet"]
        port = ports.get(get["port"], get["port"])
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
        reply = httpx.get(f"http://{address}:{port}{get['path']}", headers=headers, timeout=10)
        assert reply.status_code == 200, (name, get, reply.text)
    else:
        port = ports.get(probe["tcpSocket"]["port"], probe["tcpSocket"]["port"])
        with socket.create_connection((address, int(port)), timeout=5):
            pass


def test_the_played_stack_runs_image_pipeline_across_the_nodes(kube: KubeStack) -> None:
    details = run_pipelines(kube.api_url, kube.auth_headers, runs=4)
    details += run_forks(kube.api_url, kube.auth_headers)
    assert crossings(details), "no hand-off crossed between the nodes"


def test_the_minion_pod_starts_again_on_its_node(kube: KubeStack) -> None:
    """A rollout or a reboot makes the DaemonSet's pod anew on a node whose socket folder
    the last one left owned by the minion: its init step must pass again, the minion serve,
    and workflows run."""
    node = kube.nodes[0]
    again = kube.replay("cdi-minion", node)
    init = f"{again.name}-socket-dir"
    status, code = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                          init).split()  # fmt: skip
    assert status in ("exited", "stopped") and code == "0", podman("logs", init)
    folder = kube.node_dir(node) / "run" / "cdi" / "cdiflow"
    assert (folder.stat().st_uid, folder.stat().st_gid, folder.stat().st_mode & 0o777) == (
        10000, 10000, 0o750,
    )  # fmt: skip
    # The workers and the scheduler of that node reconnect to the new minion by themselves.
    run_pipelines(kube.api_url, kube.auth_headers, runs=2)


def test_the_minion_init_step_is_the_same_at_every_start(tmp_path: Path) -> None:
    """The init container's command, with its security context (root with CHOWN alone, a
    read-only root), on a fresh folder and then again on the folder it left: both pass."""
    require_podman_stack()
    import yaml

    from deploy.containers.kube import K8S

    [minion] = [d for d in yaml.safe_load_all((K8S / "cdi-minion.yaml").read_text()) if d]
    inits = minion["spec"]["template"]["spec"]["initContainers"]
    [init] = [c for c in inits if c["name"] == "socket-dir"]
    folder = tmp_path / "cdi"
    folder.mkdir()
    for _ in range(2):
        done = subprocess.run(
            ["podman", "run", "--rm", "--user", "0", "--cap-drop", "all", "--cap-add", "CHOWN",
             "--security-opt", "no-new-privileges", "--read-only", "--network", "none",
             "--volume", f"{folder}:/run/cdi", "--entrypoint", init["command"][0],
             images().product, *init["command"][1:]],
            capture_output=True, text=True, env=podman_env(), timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        info = folder.stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (10000, 10000, 0o750)
