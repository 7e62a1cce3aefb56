"""Read ``uv.lock``: the pinned ``uv`` that installs it, and the versions it pins.

``make`` bootstraps the installer from the lock itself, so the one file says which ``uv``
installs everything (``pip install --require-hashes`` of the line this prints):

    python3 tools/lockfile.py uv-requirement

``tests/test_lock.py`` uses ``pinned()`` to compare the lock with what ``.venv`` holds.
Standard library only: it runs before ``.venv`` exists.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "uv.lock"

__all__ = ["LOCK", "pinned", "requirement"]


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
