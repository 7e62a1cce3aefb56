"""The ``cdiflow`` command as a product: its benchmark and container commands are the source
checkout's (``loadtest/``, ``deploy/``), loaded only when one is called, and the installed
package does not include them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from setuptools import find_packages

from cdiflow.cli import BENCH_COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
# The benchmark harness and the deployment tools (deploy/): the checkout's, not the product's.
_HARNESS = ("loadtest", "locust", "ray", "celery", "matplotlib", "conductor", "deploy")


def test_the_command_loads_no_benchmark_code_until_one_is_called() -> None:
    probe = (
        "import sys, cdiflow.cli; "
        f"print(sorted({{m.partition('.')[0] for m in sys.modules}} & set({_HARNESS!r})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/"
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_a_benchmark_command_is_found_in_the_checkout_from_anywhere() -> None:
    """``cdiflow bench workflows`` run outside the checkout still finds the harness (an
    install does not map it)."""
    shown = subprocess.run(
        [sys.executable, "-m", "cdiflow", "bench", "workflows", "--help"],
        capture_output=True,
        text=True,
        cwd="/",
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "--quick" in shown.stdout


def test_a_benchmark_whose_code_is_missing_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BENCH_COMMANDS, "gone", "no_such_harness.cli:command")
    result = CliRunner().invoke(main, ["bench", "gone", "--fast"])
    assert result.exit_code == 1
    assert "installed cdiflow does not include" in result.output, result.output
    assert "Traceback" not in result.output


def test_a_benchmark_whose_dependency_is_missing_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "needs_more.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(BENCH_COMMANDS, "needy", "needs_more:command")
    result = CliRunner().invoke(main, ["bench", "needy"])
    assert result.exit_code == 1
    assert "'no_such_dependency'" in result.output and "cdiflow[bench]" in result.output


def test_the_wheel_holds_the_product_not_the_harness() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = set(find_packages(where=str(ROOT), include=include))
    assert {"cdiflow", "orchestrator.contract", "orchestrator.db", "cdi", "workflows"} <= packages
    assert not {p for p in packages if p.partition(".")[0] in ("loadtest", "tests", "deploy")}
