"""The product's image holds what every role imports: each role's command starts from what
the image installs (cdiflow's wheel and the lock's packages) and nothing else (the roles run
from the image itself in test_containers and test_kube_play). And the base image is made from
the apt mirror this machine uses."""

from __future__ import annotations

import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from deploy.containers.images import build_wheel, debian_mirror
from orchestrator.apikeys import generate_key
from tests.deploy.support import require_podman_stack
from tests.test_deploy import _full_argv, containers

# Options whose value the pod gives at run time (its name, its node), left out for --help.
_RUNTIME = ("--id", "--host")

# A role's command line run with only the given folders importable (no site: the checkout's
# editable install would otherwise find every package of the tree).
_LAUNCH = """
import runpy, sys
paths, argv = sys.argv[1].split(":"), sys.argv[2:]
sys.path[:0] = paths
if argv[0] == "cdiflow":
    sys.argv = argv
    from cdiflow.cli import main
    main()
else:  # python -m module ...
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
"""


def role_commands() -> list[list[str]]:
    """Every role's command line as the manifests run it, with --help, and each exec probe
    that runs our code."""
    found = []
    for container in containers():
        argv = [a for a in _full_argv(container) if "$" not in a]
        argv = [a for i, a in enumerate(argv) if a not in _RUNTIME
                and (i == 0 or argv[i - 1] not in _RUNTIME)]  # fmt: skip
        found.append([*argv, "--help"])
        probe = container.get("livenessProbe", {}).get("exec", {}).get("command", [])
        if probe[:1] == ["python"]:
            found.append([*probe[:3], "--help"])
    return found


def test_every_role_starts_from_what_the_image_installs(tmp_path: Path) -> None:
    """cdiflow's wheel (as the image installs it) and the locked packages, and not the
    checkout: a package a role imports that the wheel lacks fails here (`apps`, once)."""
    wheel = build_wheel(tmp_path / "dist")
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    dependencies = sysconfig.get_paths()["purelib"]
    for argv in role_commands():
        done = subprocess.run(
            [sys.executable, "-S", "-c", _LAUNCH, f"{installed}:{dependencies}", *argv],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        assert "Usage" in done.stdout or "usage" in done.stdout, (argv, done.stdout)


@pytest.mark.parametrize(
    ("text", "suffix", "archive"),
    [
        ("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
         "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
         "Suites: bookworm-security\nComponents: main\n", ".sources",
         "http://mirror.example/debian"),
        ("# a comment\ndeb [arch=amd64] http://mirror.example/debian/ bookworm main\n",
         ".list", "http://mirror.example/debian"),
        ("Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\n",
         ".sources", "http://deb.debian.org/debian"),
    ],
)  # fmt: skip
def test_the_base_comes_from_the_mirror_apt_uses_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, suffix: str, archive: str
) -> None:
    monkeypatch.delenv("DEBIAN_MIRROR", raising=False)
    sources = tmp_path / f"debian{suffix}"
    sources.write_text(text)
    assert debian_mirror([sources])[0] == archive


@pytest.mark.parametrize(
    "argv",
    [
        ["cdiflow", "worker", "--id", "worker-1"],  # waiting for its Redis and minion
        ["cdiflow", "scheduler", "--id", "scheduler-1"],
        # Migrating, waiting for a Postgres that took the connection and never answers (as
        # behind a firewall that drops): a listener started beside it, then the API execs.
        [
            "sh",
            "-c",
            "python -c 'import socket, time; s = socket.socket(); "
            's.bind(("127.0.0.1", 5999)); s.listen(); time.sleep(600)\' & sleep 1; '
            "exec python -m orchestrator.controller",
        ],
    ],
    ids=["worker", "scheduler", "api"],
)
def test_a_role_that_is_a_containers_first_process_stops_when_told(argv: list[str]) -> None:
    """Run as PID 1, as Kubernetes runs it (no init): SIGTERM ends it (status 143) even
    before it has set up its own handlers, instead of being ignored until the kill."""
    require_podman_stack()
    import uuid

    from deploy.containers.images import images
    from deploy.containers.podman import podman

    name = f"cdiflow-pid1-{uuid.uuid4().hex[:6]}"
    nowhere = {"DATABASE_URL": "postgresql+psycopg://x:y@127.0.0.1:5999/x",
               "REDIS_URL": "redis://127.0.0.1:9/0", "CDI_URL": "unix:///tmp/none.sock",
               "CDIFLOW_ADMIN_KEY": generate_key()}  # fmt: skip
    env = [a for key, value in nowhere.items() for a in ("--env", f"{key}={value}")]
    podman("run", "--detach", "--name", name, "--network", "none", *env, "--entrypoint",
           argv[0], images().product, *argv[1:])  # fmt: skip
    try:
        _wait_for_a_sigterm_handler(name)  # in its start, waiting on what does not answer
        podman("stop", "--time", "30", name)
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).strip()
        assert code == "143", podman("logs", name)  # SIGTERM's, not SIGKILL's 137
    finally:
        podman("rm", "--force", name, check=False)


def _wait_for_a_sigterm_handler(name: str) -> None:
    """Until the container's PID 1 is the role (not the shell that execs it) and catches
    SIGTERM: a stop sent earlier, while the interpreter still loads (seconds on a busy
    machine), reaches a process that has had no chance to handle it."""
    from deploy.containers.podman import podman

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = podman("exec", name, "cat", "/proc/1/status", check=False)
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        caught = int(fields.get("SigCgt", "0"), 16)
        if fields.get("Name") not in (None, "sh") and caught >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name}'s first process never caught SIGTERM: {podman('logs', name)}")
