"""Running podman: one function that every podman command of ``deploy.containers`` goes
through, with the engine settings this project needs in one file.

*Why a configuration file of our own* (``CONTAINERS_CONF``): podman's default limit on open
files can be above the machine's hard limit, and runc then refuses to start any container
("error setting rlimits"); ``podman kube play`` takes no ``--ulimit``. The file sets limits
within this process's own, and the runtime (runc), for every command alike, without touching
the machine's configuration.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from deploy.containers.errors import ContainerError, PodmanMissing

__all__ = ["CHECKOUT", "LABEL", "exists", "inspect", "podman", "podman_env", "require_podman"]

CHECKOUT: Final = Path(__file__).resolve().parents[2]
LABEL: Final = "io.cdiflow.stack"  # every container, pod, network and volume of a stack
_CONF: Final = """\
# Written by deploy/containers/podman.py for the podman commands it runs (CONTAINERS_CONF).
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
{runtime}
"""
_NOFILE: Final = 16384
_NPROC: Final = 4096


def require_podman() -> None:
    """``PodmanMissing`` unless podman runs here as root."""
    if shutil.which("podman") is None:
        raise PodmanMissing(
            "podman is not installed: `make image` installs it as root (apt-get install podman "
            "runc debootstrap)"
        )
    if os.geteuid() != 0:
        raise PodmanMissing(
            "the stack as containers runs with root's podman (a host's socket directory and "
            "the images belong to root): run it as root"
        )


def podman_env() -> dict[str, str]:
    """Our environment with ``CONTAINERS_CONF`` pointing at this project's engine settings."""
    runtime = 'runtime = "runc"' if shutil.which("runc") else ""
    text = _CONF.format(
        runtime=f"[engine]\n{runtime}" if runtime else "",
        nofile=_within(resource.RLIMIT_NOFILE, _NOFILE),
        nproc=_within(resource.RLIMIT_NPROC, _NPROC),
    )
    conf = CHECKOUT / "build" / "podman" / "containers.conf"
    if not conf.is_file() or conf.read_text() != text:
        conf.parent.mkdir(parents=True, exist_ok=True)
        tmp = conf.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(conf)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _within(limit: int, wanted: int) -> int:
    """``wanted``, or this process's hard limit if that is lower: no container may have more
    than the runtime that starts it."""
    hard = resource.getrlimit(limit)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def podman(
    *args: str,
    check: bool = True,
    timeout: float = 600.0,
    stdin: str | None = None,
    quiet: bool = True,
) -> str:
    """Run ``podman ARGS``; its standard output. ``ContainerError`` with podman's message when
    it fails (and ``check``). ``quiet=False`` lets its output through (long builds)."""
    argv = ["podman", *args]
    try:
        done = subprocess.run(
            argv,
            input=stdin,
            stdout=subprocess.PIPE if quiet else None,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            env=podman_env(),
            check=False,
        )
    except FileNotFoundError:
        require_podman()
        raise
    except subprocess.TimeoutExpired as exc:
        raise ContainerError(f"`{_shown(argv)}` did not finish within {timeout:g} s") from exc
    if check and done.returncode != 0:
        detail = (done.stderr or "").strip()[-2000:]
        raise ContainerError(f"`{_shown(argv)}` failed (status {done.returncode}): {detail}")
    return done.stdout or ""


def exists(kind: str, name: str) -> bool:
    """Whether podman has the ``kind`` (image, container, pod, network, volume) ``name``."""
    command = {"network": ("network", "exists"), "volume": ("volume", "exists")}.get(
        kind, (kind, "exists")
    )
    argv = ["podman", *command, name]
    done = subprocess.run(argv, capture_output=True, env=podman_env(), check=False, timeout=60)
    return done.returncode == 0


def inspect(kind: str, name: str) -> dict[str, Any]:
    """``podman <kind> inspect NAME`` as a dict."""
    found = json.loads(podman(kind, "inspect", name))
    return dict(found[0] if isinstance(found, list) else found)


def _shown(argv: Sequence[str]) -> str:
    """The command as a person would type it, shortened (no secret ever goes on it)."""
    text = " ".join(argv)
    return text if len(text) < 300 else text[:297] + "..."
