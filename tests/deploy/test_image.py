"""The product's image holds what every role imports: each role's command starts from what
the image installs (cdiflow's wheel and the lock's packages) and nothing else, here and in
the image itself, as its own user on a read-only root. And the base image is made from the
apt mirror this machine uses."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from deploy.containers.images import build_wheel, debian_mirror, images
from deploy.containers.podman import inspect, podman_env
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


def test_every_role_answers_in_the_image_as_its_own_user() -> None:
    require_podman_stack()
    image = images().product
    assert inspect("image", image)["Config"]["User"] == "cdiflow"
    uids = {"cdi-controller": 10001, "cdi-minion": 10000, "api": 10002, "scheduler": 10003,
            "worker": 10004}  # fmt: skip
    for container in containers():
        argv = [a for a in _full_argv(container) if "$" not in a]
        argv = [a for i, a in enumerate(argv) if a not in _RUNTIME
                and (i == 0 or argv[i - 1] not in _RUNTIME)]  # fmt: skip
        uid = uids[container["name"]]
        done = subprocess.run(
            ["podman", "run", "--rm", "--read-only", "--network", "none", "--user",
             f"{uid}:{uid}", "--entrypoint", argv[0], image, *argv[1:], "--help"],
            capture_output=True, text=True, env=podman_env(), timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (container["name"], done.stderr[-2000:])


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
