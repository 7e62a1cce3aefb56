"""The lock: ``uv.lock`` agrees with ``pyproject.toml``, ``.venv`` holds exactly what it pins,
and every tool fetched outside it is pinned by version."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from tools.lockfile import LOCK, pinned, requirement

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"


def _uv(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(UV), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "UV_PYTHON_DOWNLOADS": "never", "HOME": str(Path.home())},
    )


def test_the_lock_agrees_with_pyproject() -> None:
    checked = _uv("lock", "--check", "--offline")
    assert checked.returncode == 0, checked.stderr


def test_a_dependency_added_to_pyproject_alone_fails_the_check(tmp_path: Path) -> None:
    shutil.copy(ROOT / "uv.lock", tmp_path / "uv.lock")
    text = (ROOT / "pyproject.toml").read_text()
    added = text.replace('  "pyyaml>=6,<7",\n', '  "pyyaml>=6,<7",\n  "msgpack-numpy>=0.4",\n', 1)
    assert added != text
    (tmp_path / "pyproject.toml").write_text(added)
    checked = _uv("lock", "--check", "--offline", cwd=tmp_path)
    assert checked.returncode != 0
    assert "needs to be updated" in checked.stderr or "msgpack-numpy" in checked.stderr


def test_the_venv_holds_exactly_the_lock() -> None:
    checked = _uv("sync", "--frozen", "--extra", "dev", "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_installed_distribution_is_at_a_locked_version() -> None:
    """Read apart from uv: each distribution in this interpreter has a version the lock pins."""
    locked = pinned()
    # site-packages only: setuptools, once imported, puts its vendored copies on sys.path.
    site_packages = sysconfig.get_paths()["purelib"]
    installed = {
        re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version
        for d in metadata.distributions(path=[site_packages])
    }
    stray = {n: v for n, v in installed.items() if n not in locked and n != "pip"}
    wrong = {n: (v, sorted(locked[n])) for n, v in installed.items() if n in locked}
    wrong = {n: pair for n, pair in wrong.items() if pair[0] not in pair[1]}
    assert not stray, f"installed but not locked: {stray}"
    assert not wrong, f"installed at another version than the lock's: {wrong}"
    assert installed["redis"] in locked["redis"]


def test_the_installer_is_bootstrapped_from_the_lock_with_hashes() -> None:
    line = requirement("uv", LOCK)
    version = next(iter(pinned()["uv"]))
    assert line.startswith(f"uv=={version} --hash=sha256:")
    assert f"uv {version}" in _uv("--version").stdout


def test_every_fetched_tool_is_pinned_by_version() -> None:
    """The Go tools (the S3 endpoint, kustomize, the Temporal CLI) are built at fixed versions;
    the Makefile and the code that names the S3 endpoint's module agree."""
    from loadtest.systems.temporal_sys import CLI_VERSION
    from orchestrator.services.s3 import VERSITYGW_MODULE

    makefile = (ROOT / "Makefile").read_text()
    assert "@latest" not in makefile
    assert re.search(r"^KUSTOMIZE_VERSION \?= v\d+\.\d+\.\d+$", makefile, re.M)
    assert f"VERSITYGW_MODULE := {VERSITYGW_MODULE}\n" in makefile
    assert re.fullmatch(r".+@v\d+\.\d+\.\d+", VERSITYGW_MODULE)
    assert re.fullmatch(r"v\d+\.\d+\.\d+", CLI_VERSION)
