"""The stack as containers (``cdiflow containers up``): every role in the product's image,
services in theirs, two hosts (pods) on one podman network with CDI-RPC between their minions.
It runs ``image_pipeline`` under ``transfer`` with the right pixels, and forks whose hand-offs
cross hosts, runs task code from a folder it was given, serves the dashboard, and leaves nothing
behind when it stops."""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploy.containers.images import images
from deploy.containers.podman import LABEL, inspect, podman
from deploy.containers.stack import ContainerStack, container_rows
from orchestrator.child_process import free_port
from tests.deploy.support import crossings, require_podman_stack, run_forks, run_pipelines

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerStack]:
    require_podman_stack()
    folder: Path = tmp_path_factory.mktemp("containers")
    tasks = folder / "mytasks"  # your task code, as `--tasks mytasks` mounts it
    tasks.mkdir()
    (tasks / "counting.py").write_text(
        "from workflows.api import TaskContext, task\n\n\n@task(name='add_one', "
        "needs_image=False)\ndef add_one(ctx: TaskContext) -> dict:\n"
        "    return {'n': int(ctx.input['n']) + 1}\n"
    )
    for path in (folder, tasks, tasks / "counting.py"):  # the containers' users read it
        path.chmod(0o755 if path.is_dir() else 0o644)
    running = ContainerStack(folder / "data", name=f"cdiflow-t{uuid.uuid4().hex[:6]}",
                             hosts=2, workers=2, port=free_port(), tasks=[tasks])  # fmt: skip
    try:
        yield running.start()
    finally:
        running.stop(remove_data=True, timeout=5)
    label = f"label={LABEL}={running.name}"
    assert podman("ps", "-a", "--filter", label, "--format", "{{.Names}}").split() == []
    assert podman("pod", "ps", "--filter", label, "--format", "{{.Name}}").split() == []
    assert running.name not in podman("network", "ls", "--format", "{{.Name}}").split()


def test_every_role_runs_as_its_own_user_on_its_host(stack: ContainerStack) -> None:
    assert inspect("image", images().product)["Config"]["User"] == "cdiflow"  # not root
    rows = {r["name"]: r for r in container_rows(stack.name)}
    assert {r["role"] for r in rows.values()} == {
        "postgres", "redis", "s3", "controller", "minion", "api", "scheduler", "worker"
    }  # fmt: skip
    assert all(r["state"] == "running" for r in rows.values()), rows
    pods = {r["pod"] for r in rows.values() if r["role"] in ("minion", "worker")}
    assert pods == {stack.layout.pod("host1"), stack.layout.pod("host2")}
    for name in rows:
        uid = podman("exec", name, "sh", "-c", "id -u").strip()
        assert uid != "0", f"{name} runs as root"


def test_image_pipeline_under_transfer_crosses_hosts_with_the_right_pixels(
    stack: ContainerStack,
) -> None:
    details = run_pipelines(stack.api_url, stack.auth_headers, runs=4)
    details += run_forks(stack.api_url, stack.auth_headers)
    crossed = crossings(details)
    assert crossed, "no hand-off crossed between the hosts"
    assert {h["from_host"] for h in crossed} | {h["to_host"] for h in crossed} == {
        "host1", "host2"
    }  # fmt: skip
    workers = {t["worker_id"] for d in details for t in d["task_runs"]}
    assert workers == {"worker-1", "worker-2"}, workers


def test_the_dashboard_and_what_it_reads_are_served(stack: ContainerStack) -> None:
    with httpx.Client(base_url=stack.api_url, timeout=30) as api:
        page = api.get("/")
        assert page.status_code == 200 and "<html" in page.text.lower()
        ready = api.get("/api/readyz")
        assert ready.status_code == 200, ready.text
        workers = api.get("/api/workers", headers=stack.auth_headers).json()
        hosts = {w["id"]: w["host"] for w in workers}
        assert hosts == {"worker-1": "host1", "worker-2": "host2"}, workers
        directory = api.get("/api/cdi/objects", headers=stack.auth_headers)
        assert directory.status_code == 200, directory.text
        minions = {m["host"]: m["alive"] for m in directory.json()["minions"]}
        assert minions == {"host1": True, "host2": True}


def test_task_code_from_a_folder_it_was_given_runs(stack: ContainerStack) -> None:
    name = f"count-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=stack.api_url, headers=stack.auth_headers, timeout=60) as api:
        task = api.post("/api/tasks", json={"name": "add_one", "module": "counting:add_one"})
        assert task.status_code == 201, task.text  # a live worker loaded it from the folder
        definition = {"name": name, "tasks": [{"ref": "a", "task": "add_one"}]}
        made = api.post("/api/workflow-definitions", json=definition)
        assert made.status_code == 201, made.text
        started = api.post("/api/workflows", params={"wait_s": 55},
                           json={"workflow": name, "input": {"data": {"n": 41}}})  # fmt: skip
        assert started.status_code == 201, started.text
        assert started.json()["status"] == "COMPLETED", started.json()
        assert started.json()["output"]["n"] == 42


def _listening(container: str) -> set[str]:
    """The addresses TCP listeners bind in ``container``'s network namespace."""
    table = podman("exec", container, "cat", "/proc/net/tcp", "/proc/net/tcp6")
    found = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":  # LISTEN
            raw = fields[1].split(":")[0]
            packed = bytes.fromhex(raw)
            if len(packed) == 4:
                found.add(str(ipaddress.IPv4Address(packed[::-1])))
            elif len(packed) == 16:  # four little-endian words
                words = b"".join(packed[i : i + 4][::-1] for i in range(0, 16, 4))
                six = ipaddress.IPv6Address(words)
                found.add(str(six.ipv4_mapped or six))  # gRPC binds an IPv4 address so
    return found


def test_every_listener_binds_its_containers_address_or_loopback(stack: ContainerStack) -> None:
    """What another container reaches (the controller, the API and its scrape port, each
    host's gateway and workers' scrape ports) binds the container's or pod's own address,
    named; nothing of cdiflow's binds every address."""
    layout = stack.layout
    where = {
        "cdi-controller": layout.address("cdi-controller"),
        "api": layout.address("api"),
        "host1-minion": layout.address("host1"),
        "host2-minion": layout.address("host2"),
    }
    for role, address in where.items():
        bound = _listening(layout.container(role))
        assert address in bound, (role, bound)
        assert bound <= {address, "127.0.0.1", "::1"}, (role, bound)


def test_each_role_gets_only_its_cdi_credentials_and_as_files(stack: ContainerStack) -> None:
    """The controller the cluster key, each minion its host's token and the gateway key, the
    API and the scheduler a reader's token, the workers nothing; none in an environment or on
    a command line."""
    made = stack.secrets.cdi
    secrets = {path.name: path.read_text().strip() for path in made.folder.iterdir()}
    wanted = {"cdi-controller": {"cluster.key"}, "api": {"reader.token"},
              "scheduler-1": {"reader.token"},
              "host1-minion": {"minion-host1.token", "gateway.key"},
              "host2-minion": {"minion-host2.token", "gateway.key"},
              "worker-1": set(), "worker-2": set()}  # fmt: skip
    for role, names in wanted.items():
        container = stack.layout.container(role)
        files = podman("exec", container, "sh", "-c", "cat /run/secrets/cdi-* 2>/dev/null || true")
        held = {name for name, secret in secrets.items() if secret in files}
        assert held == names, (role, held)
        seen = podman("exec", container, "sh", "-c", "cat /proc/1/environ /proc/*/cmdline")
        assert not [n for n, secret in secrets.items() if secret in seen], role
