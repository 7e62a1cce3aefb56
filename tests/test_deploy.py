"""The Kubernetes manifests parse, hang together, and run commands our CLI accepts."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.contract.alive import ALIVE_FILE_ENV, STALL_AFTER_S
from orchestrator.settings import Settings

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
    gateway = policies["cdi-minion-gateway-ingress"]["ingress"][0]
    assert gateway["from"] == [{"podSelector": {"matchLabels": {"app": "cdi-minion"}}}]
    [minion] = [c for c in containers() if c["name"] == "cdi-minion"]
    assert gateway["ports"] == [{"port": p["containerPort"], "protocol": "TCP"}
                                for p in minion["ports"]]  # fmt: skip


# -- rendered and validated; every flag and variable checked against the code ------------------

KUBERNETES_VERSION = "1.30.0"  # the oldest release the manifests promise to work on
SOURCES = [Path(__file__).resolve().parents[1] / p for p in ("cdi", "orchestrator", "cdiflow")]


def _renderer() -> list[str] | None:
    """``kustomize build`` or ``kubectl kustomize``, whichever is installed."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    go_bin = Path.home() / "go" / "bin" / "kustomize"
    return [str(go_bin), "build"] if go_bin.exists() else None


def test_manifests_render_with_kustomize_and_validate_against_the_kubernetes_schemas() -> None:
    import kubernetes_validate

    renderer = _renderer()
    if renderer is None:
        reason = "neither kustomize nor kubectl is installed (`make kustomize` builds it with go)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    done = subprocess.run([*renderer, str(K8S)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert {(d["kind"], d["metadata"]["name"]) for d in rendered} == {
        (d["kind"], d["metadata"]["name"]) for d in documents()
    }
    for doc in rendered:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc}") from None


def _help(argv: list[str]) -> str:
    if argv[0] == "cdiflow":
        argv = [sys.executable, "-m", "cdiflow", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    command = []  # the program and its subcommands: everything before the first --option
    for arg in argv:
        if arg.startswith("--"):
            break
        command.append(arg)
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _full_argv(container: dict[str, Any]) -> list[str]:
    """The command line with every option, those the shell adds included (``--host``)."""
    command = container.get("command", ["cdiflow"])
    args = container.get("args", [])
    if command[:2] == ["sh", "-c"]:
        script = command[2].replace('"$@"', shlex.join(args)).replace("exec ", "", 1)
        return shlex.split(script)
    return [*command, *args]


def test_every_flag_the_manifests_pass_is_one_the_command_takes() -> None:
    for container in containers():
        argv = _full_argv(container)
        flags = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
        page = _help(argv)
        for flag in flags:
            assert re.search(rf"(^|[\s,]){re.escape(flag)}\b", page), (
                f"{container['name']}: {flag} is not an option of {argv[:3]}"
            )


def test_every_environment_variable_the_manifests_set_is_read_by_the_code() -> None:
    code = "\n".join(
        p.read_text() for root in SOURCES for p in root.rglob("*.py") if "proto" not in p.parts
    )
    settings = {field.upper() for field in Settings.model_fields}  # pydantic-settings reads them
    for container in containers():
        uses = " ".join(_full_argv(container)) + " ".join(
            str(e.get("value", "")) for e in container.get("env", [])
        )
        names = [e["name"] for e in container.get("env", [])]
        for ref in container.get("envFrom", []):
            source = ref.get("configMapRef") or ref.get("secretRef") or {}
            names += _config_keys(source.get("name", ""))
        for name in names:
            read = name in settings or re.search(rf"[\"']{name}[\"']|envvar=\"{name}\"", code)
            # Or the pod passes it on itself ($NODE_NAME in the command, $(POD_IP) in a value).
            passed_on = f"${name}" in uses or f"$({name})" in uses
            assert read or passed_on, f"{container['name']}: nothing reads {name}"


def _config_keys(name: str) -> list[str]:
    for doc in documents():
        if doc["kind"] in ("ConfigMap", "Secret") and doc["metadata"]["name"] == name:
            return list((doc.get("data") or doc.get("stringData") or {}).keys())
    return []


def test_the_minion_serves_transfers_on_its_pod_ip() -> None:
    [minion] = [c for c in containers() if c["name"] == "cdi-minion"]
    env = {e["name"]: e for e in minion["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    port = env["CDI_RPC_LISTEN"]["value"].rsplit(":", 1)[1]
    assert env["CDI_RPC_ADVERTISE"]["value"] == f"$(POD_IP):{port}"
    assert [p["containerPort"] for p in minion["ports"]] == [int(port)]


@pytest.mark.parametrize("name", ["scheduler", "worker"])
def test_a_stuck_scheduler_or_worker_fails_its_liveness_probe(name: str, tmp_path: Path) -> None:
    """The probe, run as the kubelet would in the pod's shell, against the stamp the process
    renews (``CDIFLOW_ALIVE_FILE``): a fresh one passes; one older than ``STALL_AFTER_S``, or
    none, fails."""
    [container] = [c for c in containers() if c["name"] == name]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[ALIVE_FILE_ENV] is not None and env[ALIVE_FILE_ENV].startswith("/tmp/")
    command = container["livenessProbe"]["exec"]["command"]
    stamp = tmp_path / "alive"

    def probe() -> int:
        run_env = {"PATH": os.environ["PATH"], ALIVE_FILE_ENV: str(stamp)}
        return subprocess.run(command, env=run_env, capture_output=True, check=False).returncode

    assert probe() != 0  # none yet: the initial delay covers start-up
    stamp.touch()
    assert probe() == 0
    past = time.time() - STALL_AFTER_S - 5
    os.utime(stamp, (past, past))
    assert probe() != 0
    past = time.time() - STALL_AFTER_S + 10
    os.utime(stamp, (past, past))
    assert probe() == 0
