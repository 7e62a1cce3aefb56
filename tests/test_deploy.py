"""The Kubernetes manifests parse, hang together, and run commands our CLI accepts."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

K8S = Path(__file__).resolve().parents[1] / "deploy" / "k8s"


def documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((K8S / name).read_text()) if d)
    return docs


def containers() -> list[dict[str, Any]]:
    return [
        c
        for d in documents()
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]


def test_every_listed_manifest_exists_and_selectors_match() -> None:
    docs = documents()
    assert {d["kind"] for d in docs} >= {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Deployment",
        "DaemonSet",
        "Service",
    }
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()
    workloads = {d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")}
    assert {
        "cdi-controller",
        "cdi-minion",
        "cdiflow-api",
        "cdiflow-scheduler",
        "cdiflow-worker",
    } <= workloads


def test_pods_that_use_cdi_mount_the_minion_socket_directory() -> None:
    for d in documents():
        if d["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = d["spec"]["template"]["spec"]
        assert not spec.get("hostIPC"), "CDI needs no hostIPC: memory travels as fds"
        if d["metadata"]["name"] in ("cdi-minion", "cdiflow-scheduler", "cdiflow-worker"):
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["cdi-socket"]["hostPath"]["path"] == "/run/cdi"


def _argv(container: dict[str, Any]) -> list[str]:
    command = container.get("command", ["cdiflow"])
    args = container.get("args", [])
    if command[:2] == ["sh", "-c"]:
        script = command[2].replace('"$@"', shlex.join(args))
        return [a for a in shlex.split(script.replace("exec ", "", 1)) if "$" not in a]
    return [*command, *args]


def test_container_commands_are_accepted_by_our_cli() -> None:
    for container in containers():
        argv = _argv(container)
        if argv[0] == "cdiflow":
            argv = [sys.executable, "-m", "cdiflow", *argv[1:]]
        elif argv[0] == "python":
            argv = [sys.executable, *argv[1:]]
        # Drop options whose value comes from the pod at run time, then ask for --help.
        clean = [a for a in argv if a not in ("--id", "--host")]
        done = subprocess.run(
            [*clean, "--help"], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, f"{container['name']}: {argv}: {done.stderr}"


def _pods() -> list[tuple[str, dict[str, Any]]]:
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for d in documents()
        if d["kind"] in ("Deployment", "DaemonSet")
    ]


def test_every_pod_runs_unprivileged() -> None:
    """Non-root, no privilege escalation, no capability (the minion's init container may
    chown its socket directory and nothing else), a read-only root, no API token."""
    for name, spec in _pods():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] >= 10000, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        assert not spec.get("hostPID") and not spec.get("hostNetwork"), name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, (name, container["name"])
            assert ctx["readOnlyRootFilesystem"] is True, (name, container["name"])
            assert ctx["capabilities"] == {"drop": ["ALL"]}, (name, container["name"])
        for init in spec.get("initContainers", []):
            assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


def test_only_the_api_gets_the_admin_key_and_it_checks_hosts() -> None:
    docs = documents()
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    assert "cdiflow-api" in config["CDIFLOW_ALLOWED_HOSTS"]
    [key_secret] = [d for d in docs if d["metadata"]["name"] == "cdiflow-api-key"]
    assert "CDIFLOW_ADMIN_KEY" in key_secret["stringData"]
    for name, spec in _pods():
        refs = {r["secretRef"]["name"] for c in spec["containers"] for r in c.get("envFrom", [])
                if "secretRef" in r}  # fmt: skip
        assert ("cdiflow-api-key" in refs) == (name == "cdiflow-api"), name
    api = dict(_pods())["cdiflow-api"]["containers"][0]
    probe = api["readinessProbe"]["httpGet"]
    assert {"name": "Host", "value": "localhost"} in probe["httpHeaders"]
    assert "localhost" in config["CDIFLOW_ALLOWED_HOSTS"]


def test_network_policies_deny_by_default() -> None:
    policies = {d["metadata"]["name"]: d["spec"] for d in documents()
                if d["kind"] == "NetworkPolicy"}  # fmt: skip
    assert policies["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    controller = policies["cdi-controller-ingress"]["ingress"][0]
    allowed = controller["from"][0]["podSelector"]["matchExpressions"][0]["values"]
    assert "cdiflow-api" in allowed and controller["ports"] == [{"port": 50051, "protocol": "TCP"}]
