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
ANOTHER_INSTALL = K8S.parent / "overlays" / "another-install"
BASE_SOCKET_DIR = "/run/cdi/cdiflow"  # the base install's folder on each node


def kustomization(folder: Path = K8S) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((folder / "kustomization.yaml").read_text())
    return loaded


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name in kustomization()["resources"]:
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


SOCKET_PODS = ("cdi-minion", "cdiflow-scheduler", "cdiflow-worker")


def test_pods_that_use_cdi_mount_the_install_socket_directory() -> None:
    """The node's socket folder is the install's own, not a folder every install would
    share; the socket-dir component sets another install's into each pod that mounts it."""
    for d in documents():
        if d["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = d["spec"]["template"]["spec"]
        assert not spec.get("hostIPC"), "CDI needs no hostIPC: memory travels as fds"
        if d["metadata"]["name"] in SOCKET_PODS:
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["cdi-socket"]["hostPath"]["path"] == BASE_SOCKET_DIR
            for container in spec["containers"]:
                mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
                assert mounts["cdi-socket"] == "/run/cdi", (d["metadata"]["name"], mounts)
    component = kustomization(K8S / "components" / "socket-dir")
    targets = {t["select"]["name"] for r in component["replacements"] for t in r["targets"]}
    assert targets == set(SOCKET_PODS)


def test_every_container_has_a_liveness_probe_and_the_api_a_readiness_on_readyz() -> None:
    for name, spec in _pods():
        for container in spec["containers"]:
            assert "livenessProbe" in container, (name, container["name"])
    api = dict(_pods())["cdiflow-api"]["containers"][0]
    # Ready while the API itself can answer: workers scaled to zero, or no scheduler, must not
    # take every API pod out of its Service (deploy/k8s/README.md, Probes).
    assert api["readinessProbe"]["httpGet"]["path"] == "/api/readyz?scope=api"
    assert api["livenessProbe"]["httpGet"]["path"] == "/api/healthz"
    [minion] = [c for c in containers() if c["name"] == "cdi-minion"]
    probe = minion["livenessProbe"]["exec"]["command"]
    assert probe[:3] == ["python", "-m", "cdi.minion.probe"] and "/run/cdi/minion.sock" in probe


def test_every_container_asks_for_cpu_and_memory_and_is_capped() -> None:
    for name, spec in _pods():
        for container in [*spec["containers"], *spec.get("initContainers", [])]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), (name, container["name"])
            assert "memory" in resources["limits"], (name, container["name"])
    worker = dict(_pods())["cdiflow-worker"]["containers"][0]
    assert {"cpu", "memory"} <= set(worker["resources"]["limits"])


def test_the_metrics_ports_are_declared_and_let_in() -> None:
    """The API and the workers serve /metrics without a key on a port they declare, and a
    NetworkPolicy lets the monitoring namespace (and only it) reach that port."""
    ports = {}
    for name, spec in _pods():
        [container] = spec["containers"]
        declared = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        if "metrics" in declared:
            ports[name] = declared["metrics"]
    assert set(ports) == {"cdiflow-api", "cdiflow-worker"}
    api = dict(_pods())["cdiflow-api"]["containers"][0]
    argv = _full_argv(api)
    assert argv[argv.index("--metrics-port") + 1] == str(ports["cdiflow-api"])
    assert argv[argv.index("--metrics-host") + 1] == "0.0.0.0"
    worker = dict(_pods())["cdiflow-worker"]["containers"][0]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["CDIFLOW_WORKER_METRICS_PORT"] == str(ports["cdiflow-worker"])
    # A worker listens on loopback unless told: the scraper in another pod must reach it.
    assert env["CDIFLOW_WORKER_METRICS_HOST"] == "0.0.0.0"
    policies = {d["metadata"]["name"]: d["spec"] for d in documents()
                if d["kind"] == "NetworkPolicy"}  # fmt: skip
    metrics = policies["cdiflow-metrics-ingress"]
    selected = metrics["podSelector"]["matchExpressions"][0]["values"]
    assert set(selected) == set(ports)
    [rule] = metrics["ingress"]
    assert rule["ports"] == [{"port": p, "protocol": "TCP"} for p in sorted(set(ports.values()))]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]  # fmt: skip


def test_the_image_is_named_in_one_place() -> None:
    [override] = kustomization()["images"]
    for container in containers():
        assert container["image"].partition(":")[0] == override["name"]


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
    # The pods that hold a token of the cluster, and only they, reach the controller.
    holders = {name for name, refs in _cdi_secrets().items() if name != "cdi-controller" and refs}
    assert set(allowed) == holders == {"cdi-minion", "cdiflow-api", "cdiflow-scheduler"}
    assert controller["ports"] == [{"port": 50051, "protocol": "TCP"}]
    gateway = policies["cdi-minion-gateway-ingress"]["ingress"][0]
    assert gateway["from"] == [{"podSelector": {"matchLabels": {"app": "cdi-minion"}}}]
    [minion] = [c for c in containers() if c["name"] == "cdi-minion"]
    assert gateway["ports"] == [{"port": p["containerPort"], "protocol": "TCP"}
                                for p in minion["ports"]]  # fmt: skip


def _cdi_secrets() -> dict[str, dict[str, str]]:
    """Each workload's variables taken from the cdi-credentials Secret: variable -> key."""
    found = {}
    for name, spec in _pods():
        refs = {}
        for container in spec["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None and ref["name"] == "cdi-credentials":
                    refs[env["name"]] = ref["key"]
        found[name] = refs
    return found


def test_each_pod_gets_the_cdi_credentials_it_needs_and_no_other() -> None:
    """The controller the cluster key; a minion its token and the gateway key; the API and the
    schedulers a reader's token; the workers, where task code runs, nothing. The Secret's keys
    are the files `cdiflow cdi credentials --any-host` writes, so it can be made from them."""
    from cdi.auth import ANY_HOST, ClusterCredentials

    made = ClusterCredentials(Path("cdi-credentials"))
    files = {made.cluster_key_file.name, made.gateway_key_file.name,
             made.reader_token_file.name, made.minion_token_file(ANY_HOST).name}  # fmt: skip
    [secret] = [d for d in documents() if d["metadata"]["name"] == "cdi-credentials"]
    assert set(secret["stringData"]) == files
    assert _cdi_secrets() == {
        "cdi-controller": {"CDI_CLUSTER_KEY": made.cluster_key_file.name},
        "cdi-minion": {"CDI_CONTROLLER_TOKEN": made.minion_token_file(ANY_HOST).name,
                       "CDI_GATEWAY_KEY": made.gateway_key_file.name},
        "cdiflow-api": {"CDI_CONTROLLER_TOKEN": made.reader_token_file.name},
        "cdiflow-scheduler": {"CDI_CONTROLLER_TOKEN": made.reader_token_file.name},
        "cdiflow-worker": {},
    }  # fmt: skip
    for name, spec in _pods():  # never the whole Secret into a pod
        for container in spec["containers"]:
            whole = [r["secretRef"]["name"] for r in container.get("envFrom", [])
                     if "secretRef" in r]  # fmt: skip
            assert "cdi-credentials" not in whole, name


def test_the_shipped_cdi_credentials_stop_every_process_at_its_start(tmp_path: Path) -> None:
    """A forgotten edit must not deploy: the controller refuses the Secret's cluster key as
    it would start in its pod, and the minion's, the API's and the schedulers' token and the
    gateway key are refused by the checks they run before they serve."""
    from cdi.auth import Role, check_key, check_token
    from cdi.errors import ConfigError

    [secret] = [d for d in documents() if d["metadata"]["name"] == "cdi-credentials"]
    shipped = secret["stringData"]
    env = {"PATH": os.environ["PATH"], "CDI_CLUSTER_KEY": shipped["cluster.key"]}
    done = subprocess.run([sys.executable, "-m", "cdiflow", "cdi", "controller", "--listen",
                           "127.0.0.1:0"], env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, check=False)  # fmt: skip
    assert done.returncode != 0 and "the cluster key is not a secret" in done.stderr, done.stderr
    assert shipped["cluster.key"] not in done.stderr + done.stdout
    with pytest.raises(ConfigError, match="not a secret"):
        check_key(shipped["gateway.key"], "gateway key")
    for key, role in (("minion-any-host.token", Role.MINION), ("reader.token", Role.READER)):
        with pytest.raises(ConfigError, match="not a CDI token"):
            check_token(shipped[key], role)


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
    renderer = _renderer()
    if renderer is None:
        reason = "neither kustomize nor kubectl is installed (`make kustomize` builds it with go)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    rendered = _render(renderer, K8S)
    assert {(d["kind"], d["metadata"]["name"]) for d in rendered} == {
        (d["kind"], d["metadata"]["name"]) for d in documents()
    }
    for doc in rendered:
        kubernetes_validate_strict(doc)


def kubernetes_validate_strict(doc: dict[str, Any]) -> None:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc}") from None


def _render(renderer: list[str], folder: Path) -> list[dict[str, Any]]:
    done = subprocess.run([*renderer, str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_another_install_has_its_own_namespace_and_socket_folder() -> None:
    """deploy/overlays/another-install, as README.md there says a second install is made:
    every object in its namespace, every pod on its own socket folder."""
    renderer = _renderer()
    if renderer is None:
        pytest.skip("neither kustomize nor kubectl is installed (`make kustomize` builds it)")
    [install] = [d for d in yaml.safe_load_all((ANOTHER_INSTALL / "install.yaml").read_text())]
    socket_dir = install["data"]["socketDir"]
    assert socket_dir != BASE_SOCKET_DIR
    rendered = _render(renderer, ANOTHER_INSTALL)
    namespace = kustomization(ANOTHER_INSTALL)["namespace"]
    assert {d["metadata"]["name"] for d in rendered if d["kind"] == "Namespace"} == {namespace}
    assert {d["metadata"].get("namespace") for d in rendered if d["kind"] != "Namespace"} == {
        namespace
    }
    workloads = [d["spec"]["template"]["spec"] for d in rendered
                 if d["kind"] in ("Deployment", "DaemonSet")]  # fmt: skip
    volumes = [v for w in workloads for v in w.get("volumes", [])]
    paths = {v["hostPath"]["path"] for v in volumes if "hostPath" in v}
    assert paths == {socket_dir}
    for doc in rendered:
        kubernetes_validate_strict(doc)


def test_the_image_is_set_once_for_every_pod(tmp_path: Path) -> None:
    renderer = _renderer()
    if renderer is None:
        pytest.skip("neither kustomize nor kubectl is installed (`make kustomize` builds it)")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S, overlay)],
        "images": [{"name": "cdiflow", "newName": "registry.example/cdiflow", "newTag": "9.9"}],
    }))  # fmt: skip
    images = {c["image"] for d in _render(renderer, overlay)
              if d["kind"] in ("Deployment", "DaemonSet")
              for c in [*d["spec"]["template"]["spec"]["containers"],
                        *d["spec"]["template"]["spec"].get("initContainers", [])]}  # fmt: skip
    assert images == {"registry.example/cdiflow:9.9"}


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


def test_every_exec_probe_runs_a_command_we_have() -> None:
    """Each exec liveness probe that runs our Python names a module that answers --help."""
    probes = [c["livenessProbe"]["exec"]["command"] for c in containers()
              if "exec" in c.get("livenessProbe", {})]  # fmt: skip
    modules = [p for p in probes if p[0] == "python"]
    assert modules, "no probe runs our code"
    for command in modules:
        done = subprocess.run([sys.executable, *command[1:3], "--help"], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, (command, done.stderr)


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
