"""Installing cdiflow builds (or ships) its CDI minion, and says what to install without Rust.

The build itself, with cargo, is what ``make`` does for every checkout (``cdi/minion/bin``,
which the CDI tests run); these build wheels of a copy of the sources without Rust on ``PATH``,
with the venv's setuptools and setuptools-rust (no download).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cdi.minion import launcher

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files git tracks, without the tests, copied: no build output of the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    copy = tmp_path_factory.mktemp("sources")
    for name in filter(None, listed):
        if name.startswith("tests/") or not (ROOT / name).is_file():
            continue
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    assert not (copy / "cdi" / "minion" / "bin").exists()
    return copy


def _wheel(sources: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``pip wheel`` of ``sources`` into ``out`` with no Rust toolchain on ``PATH``."""
    no_rust = out / "no-rust"  # an empty folder: no cargo, no rustc
    no_rust.mkdir(parents=True)
    clean = {k: v for k, v in os.environ.items() if k not in ("CARGO", launcher.BINARY_ENV)}
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "-w", str(out), "."],
        cwd=sources, env={**clean, "PATH": str(no_rust), **env},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_without_rust_the_install_says_what_to_install(sources: Path, tmp_path: Path) -> None:
    built = _wheel(sources, tmp_path)
    assert built.returncode != 0
    said = built.stdout + built.stderr
    assert "found no" in said and "Rust toolchain" in said, said
    assert "https://sh.rustup.rs" in said and "CDI_MINION_BIN=" in said, said
    assert not list(tmp_path.glob("*.whl"))


def test_a_binary_built_elsewhere_ships_inside_the_package(sources: Path, tmp_path: Path) -> None:
    """``CDI_MINION_BIN`` at install time: the wheel carries that binary where the launcher
    looks (an image whose Rust stage built it)."""
    prebuilt = tmp_path / "cdi-minion"
    prebuilt.write_text("#!/bin/sh\necho a minion built elsewhere\n")
    prebuilt.chmod(0o755)
    built = _wheel(sources, tmp_path / "dist", CDI_MINION_BIN=str(prebuilt))
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("cdiflow-*.whl")
    assert not wheel.name.endswith("-none-any.whl"), "a wheel with a binary is platform-specific"
    with zipfile.ZipFile(wheel) as archive:
        member = archive.getinfo("cdi/minion/bin/cdi-minion")
        assert archive.read(member) == prebuilt.read_bytes()
        assert (member.external_attr >> 16) & stat.S_IXUSR, "the binary is not executable"
        names = archive.namelist()
    assert not [n for n in names if "minion-native" in n], "the Rust sources went into the wheel"
    assert "cdi/minion/launcher.py" in names


def test_a_prebuilt_path_that_is_no_binary_is_refused(sources: Path, tmp_path: Path) -> None:
    built = _wheel(sources, tmp_path, CDI_MINION_BIN=str(tmp_path / "nowhere"))
    assert built.returncode != 0
    assert "is not an executable file" in built.stdout + built.stderr


def test_the_checkout_carries_the_binary_its_install_built() -> None:
    """``make`` (the editable install) built the minion where the launcher finds it first."""
    if os.environ.get(launcher.BINARY_ENV):
        pytest.skip(f"${launcher.BINARY_ENV} names the binary here")
    assert launcher.PACKAGED.is_file() and os.access(launcher.PACKAGED, os.X_OK)
    assert launcher.find_binary() == str(launcher.PACKAGED)
    version = subprocess.run(
        [str(launcher.PACKAGED), "--help"], capture_output=True, text=True, check=False
    )
    assert version.returncode == 0 and "--socket" in version.stdout
