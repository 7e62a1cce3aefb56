"""Loading the task code a worker is given (``--tasks``): folders, files, modules, and the
errors of modules that do not import."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from workflows.loader import (
    BUNDLED_MODULE,
    BUNDLED_MODULES,
    TaskCatalog,
    deployed_modules,
    load_deployed,
    source_modules,
    with_sources,
)
from workflows.sources import BUNDLED, TaskSources

TASK_CODE = """
from workflows.api import TaskResult, task

@task(name="{name}", timeout_s=12, retries=3, retry_backoff_s=0.25)
def invert(img, ctx):
    return TaskResult(output={{"inverted": True}})

def helper(img, ctx):
    return None
"""


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A task folder with a module of tasks, a package, a broken module and files to skip;
    the modules' names are unique, and they leave ``sys.modules`` afterwards."""
    tag = uuid.uuid4().hex[:8]
    (tmp_path / f"good_{tag}.py").write_text(TASK_CODE.format(name=f"invert_{tag}"))
    package = tmp_path / f"pkg_{tag}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (tmp_path / f"broken_{tag}.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / f"_private_{tag}.py").write_text("raise SystemExit('must not be imported')\n")
    (tmp_path / "notes.txt").write_text("not code")
    yield tmp_path, tag
    for name in [m for m in sys.modules if tag in m]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p != str(tmp_path)]


def test_a_folder_is_imported_module_by_module(folder: tuple[Path, str]) -> None:
    path, tag = folder
    names, on_path = source_modules(str(path))
    assert names == [f"broken_{tag}", f"good_{tag}", f"pkg_{tag}"] and on_path == path
    sources = with_sources(BUNDLED, [str(path)])
    assert sources.paths == (path,) and sources.packages == BUNDLED.packages
    assert deployed_modules(sources) == [*BUNDLED_MODULES, f"broken_{tag}", f"good_{tag}",
                                         f"pkg_{tag}"]  # fmt: skip
    catalog = load_deployed(sources)
    assert catalog.modules[f"good_{tag}"] == {
        "invert": {"name": f"invert_{tag}", "timeout_s": 12.0, "retries": 3,
                   "retry_backoff_s": 0.25, "needs_image": True}}  # fmt: skip
    assert catalog.modules[f"pkg_{tag}"] == {}  # loaded, no @task in it
    assert BUNDLED_MODULE in catalog.modules and "deblur" in catalog.modules[BUNDLED_MODULE]
    error = catalog.errors[f"broken_{tag}"]
    assert error.startswith("ModuleNotFoundError: No module named 'no_such_dependency_xyz'")
    assert f"broken_{tag}.py, line 1" in error
    assert catalog.task(f"good_{tag}:invert") is not None
    assert catalog.task(f"good_{tag}:helper") is None  # not a @task
    assert catalog.error_for(f"broken_{tag}:fn") == f"broken_{tag}: {error}"


def test_a_file_and_a_module_name_are_sources_too(folder: tuple[Path, str]) -> None:
    path, tag = folder
    assert source_modules(str(path / f"good_{tag}.py")) == ([f"good_{tag}"], path)
    assert source_modules("tests.orchestrator.flaky_tasks") == (
        ["tests.orchestrator.flaky_tasks"], None)  # fmt: skip
    sources = with_sources(BUNDLED, ["tests.orchestrator.flaky_tasks", ""])
    assert sources.packages == ("workflows", "tests.orchestrator.flaky_tasks")
    catalog = load_deployed(sources)
    assert "echo_input" in catalog.modules["tests.orchestrator.flaky_tasks"]
    # A file's folder joins the paths (its neighbours may hold tasks too).
    assert with_sources(TaskSources(), [str(path / f"good_{tag}.py")]).paths == (path,)
    for bad in ("no/such/folder", "not a module", "my-tasks", "3rd.party"):
        with pytest.raises(ValueError, match="neither a folder"):
            source_modules(bad)
        with pytest.raises(ValueError, match="neither a folder"):
            with_sources(BUNDLED, [bad])


def test_a_catalog_travels_as_json_and_garbage_reads_as_empty(folder: tuple[Path, str]) -> None:
    path, _tag = folder
    catalog = load_deployed(with_sources(BUNDLED, [str(path)]))
    again = TaskCatalog.from_json(catalog.to_json())
    assert again.modules == catalog.modules and again.errors == catalog.errors
    for garbage in ("", "[]", '{"modules": 3}', "{"):
        assert TaskCatalog.from_json(garbage) == TaskCatalog()
