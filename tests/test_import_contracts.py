"""The import contracts (``[tool.importlinter]`` in pyproject.toml) hold, and each one fails
the build when the import it forbids is written: shown on a copy of the sources with one bad
import per contract."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES: list[str] = CONFIG["root_packages"]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# One import per contract that breaks it: (the file it goes into, the line).
BAD_IMPORTS = {
    "cdi is usable alone": ("cdi/url.py", "import orchestrator.settings"),
    "the minion's launcher starts the gateway": ("cdi/remote/wire.py", "import cdi.minion.config"),
    "controller, scheduler and worker": (
        "orchestrator/worker/planes.py",
        "import orchestrator.scheduler.placement",
    ),
    "workflows (the task API)": ("workflows/api.py", "import orchestrator.contract.vocabulary"),
    "apps import cdi and workflows": ("apps/ar/cli.py", "import orchestrator.settings"),
    "a private module": ("loadtest/plan.py", "import orchestrator.services._process"),
}


def _lint(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(folder / "pyproject.toml")],
        cwd=folder, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def _verdicts(output: str) -> dict[str, str]:
    """Each contract's name (its start) -> KEPT or BROKEN, from the report."""
    flat = " ".join(output.split())  # the report wraps long names
    found = {}
    for start in BAD_IMPORTS:
        match = re.search(re.escape(start) + r".*? (KEPT|BROKEN)", flat)
        found[start] = match.group(1) if match else "missing"
    return found


def test_every_contract_is_covered_here() -> None:
    names = [contract["name"] for contract in CONFIG["contracts"]]
    assert sorted(start for start in BAD_IMPORTS for n in names if n.startswith(start)) == sorted(
        BAD_IMPORTS
    ), names


def test_the_sources_keep_every_contract() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(_verdicts(result.stdout).values()) == {"KEPT"}, result.stdout


def test_each_contract_fails_when_broken(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package,
            tmp_path / package,
            ignore=shutil.ignore_patterns("__pycache__", "bin", "target"),
        )
    for start, (name, line) in BAD_IMPORTS.items():
        path = tmp_path / name
        assert path.is_file(), f"{start}: {name} is gone; choose another file"
        path.write_text(path.read_text() + f"\n{line}  # a test breaks the contract\n")
    result = _lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert set(_verdicts(result.stdout).values()) == {"BROKEN"}, result.stdout


def _private_names_from_other_packages(root: Path, package: str) -> list[str]:
    found = []
    for path in (root / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            top = node.module.partition(".")[0]
            if top == package or top not in PACKAGES:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(root)}: {node.module}.{alias.name}")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_another_ones_private_names(package: str) -> None:
    """The private-modules contract sees modules; a ``_name`` taken from a public module of
    another package is caught here (``loadtest`` above all: it uses public names only)."""
    assert _private_names_from_other_packages(ROOT, package) == []


def test_a_private_name_from_another_package_is_found(tmp_path: Path) -> None:
    (tmp_path / "loadtest").mkdir()
    (tmp_path / "loadtest" / "peek.py").write_text(
        "from orchestrator.settings import _hidden\nfrom loadtest.plan import _own\n"
    )
    assert _private_names_from_other_packages(tmp_path, "loadtest") == [
        "loadtest/peek.py: orchestrator.settings._hidden"
    ]
