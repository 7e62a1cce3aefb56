"""Read ``uv.lock``: the pinned ``uv`` that installs it, and the versions it pins.

``make`` bootstraps the installer from the lock itself, so the one file says which ``uv``
installs everything (``pip install --require-hashes`` of the line this prints):

    python3 tools/lockfile.py uv-requirement

``tests/test_lock.py`` uses ``pinned()`` to compare the lock with what ``.venv`` holds, and
``unlocked()`` to name what ``pyproject.toml`` asks for that the lock was not made from (``uv
lock --check`` says the same, but offline it needs every fork's metadata in uv's cache).
Standard library only: it runs before ``.venv`` exists.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "uv.lock"

__all__ = ["LOCK", "pinned", "requirement", "unlocked"]


def _packages(lock: Path = LOCK) -> list[dict[str, Any]]:
    with lock.open("rb") as f:
        packages: list[dict[str, Any]] = tomllib.load(f)["package"]
    return packages


def pinned(lock: Path = LOCK) -> dict[str, set[str]]:
    """Each locked package's name → the versions the lock pins for it (one, or one per fork)."""
    versions: dict[str, set[str]] = {}
    for package in _packages(lock):
        versions.setdefault(package["name"], set()).add(package["version"])
    return versions


def _name(spec: str) -> str:
    """The distribution's normalised name at the start of a PEP 508 requirement."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec.strip())
    return re.sub(r"[-_.]+", "-", name.group(0) if name else spec).lower()


def unlocked(pyproject: Path = ROOT / "pyproject.toml", lock: Path = LOCK) -> set[str]:
    """The names ``pyproject.toml`` requires (its dependencies and every extra's) that the
    lock's record of the project's requirements lacks, and those it records that
    ``pyproject.toml`` no longer requires: empty when the lock was made from this file."""
    with pyproject.open("rb") as f:
        project = tomllib.load(f)["project"]
    specs = [*project.get("dependencies", ())]
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    wanted = {_name(s) for s in specs}
    with lock.open("rb") as f:
        root = [p for p in tomllib.load(f)["package"] if p["name"] == project["name"]]
    recorded = {
        _name(r["name"]) for p in root for r in p.get("metadata", {}).get("requires-dist", ())
    }
    return wanted ^ recorded


def requirement(name: str, lock: Path = LOCK) -> str:
    """``name==version`` with every hash the lock holds for it, for ``pip --require-hashes``."""
    found = [p for p in _packages(lock) if p["name"] == name]
    if len(found) != 1:
        raise SystemExit(f"uv.lock pins {len(found)} versions of {name}; expected one")
    package = found[0]
    files = [*package.get("wheels", ()), *([package["sdist"]] if "sdist" in package else ())]
    hashes = " ".join(f"--hash={f['hash']}" for f in files)
    return f"{name}=={package['version']} {hashes}"


def main(argv: list[str]) -> int:
    if argv != ["uv-requirement"]:
        print("usage: python3 tools/lockfile.py uv-requirement", file=sys.stderr)
        return 2
    print(requirement("uv"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
