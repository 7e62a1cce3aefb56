"""Tasks only from deployed code: what an attacker who may register tasks tries, refused
before anything is imported or run."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from workflows.api import load_task
from workflows.errors import TaskNotAllowed, TaskNotFound
from workflows.sources import BUNDLED, TaskSources

ATTACKS = [
    "builtins:print",
    "builtins:exec",
    "builtins:eval",
    "os:system",
    "subprocess:run",
    "shutil:rmtree",
    "importlib:import_module",
    "antigravity:fly",  # importing it alone would run code (it opens a browser)
]


@pytest.mark.parametrize("path", ATTACKS)
def test_callables_outside_the_deployed_packages_are_refused_unimported(path: str) -> None:
    module = path.split(":", 1)[0]
    loaded_before = module in sys.modules
    assert BUNDLED.problem(path) is not None
    with pytest.raises(TaskNotAllowed, match="not in a package tasks may come from") as info:
        load_task(path)
    assert "CDIFLOW_TASK_PACKAGES" in str(info.value)
    assert (module in sys.modules) == loaded_before  # refused before any import


@pytest.mark.parametrize(
    "path",
    [
        "workflows.api:load_task",  # a function of an allowed module, without @task
        "workflows.image_tasks:Image",  # a class an allowed module imported
        "workflows.api:importlib.import_module",  # reached through an allowed module
        "workflows.api:logging.getLogger",
        "workflows.image_tasks:deblur.__call__",  # a special attribute of a real task
        "workflows.image_tasks:deblur.__globals__",
    ],
)
def test_only_task_functions_of_allowed_modules_load(path: str) -> None:
    with pytest.raises(TaskNotAllowed):
        load_task(path)


def test_the_bundled_tasks_load() -> None:
    assert load_task("workflows.image_tasks:deblur").name == "deblur"
    assert load_task("workflows.image_tasks:noop").needs_image is False


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[Path]:
    """A folder of deployed task code, as CDIFLOW_TASK_PATHS names one."""
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]
    while str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def test_a_task_folder_deploys_its_top_level_modules(deployed: Path) -> None:
    (deployed / "shop_tasks.py").write_text(
        textwrap.dedent(
            """
            import os
            from workflows.api import task

            @task(name="shop-sharpen")
            def sharpen(img, ctx):
                return img

            system = os.system
            """
        )
    )
    sources = TaskSources(paths=(deployed,))
    sources.activate()
    assert sources.allows("shop_tasks") and not sources.allows("os")
    assert load_task("shop_tasks:sharpen", sources).name == "shop-sharpen"
    with pytest.raises(TaskNotAllowed, match="without @task"):
        load_task("shop_tasks:system", sources)  # os.system under another name
    with pytest.raises(TaskNotAllowed, match="not in a package"):
        load_task("shop_tasks:sharpen")  # the default sources do not name the folder


def test_a_package_allows_its_submodules_only() -> None:
    sources = TaskSources(packages=("acme.tasks",))
    assert sources.allows("acme.tasks") and sources.allows("acme.tasks.image")
    assert not sources.allows("acme") and not sources.allows("acme.tasksevil")
    assert "acme.tasks" in (sources.problem("acme.other:fn") or "")


def test_a_malformed_path_is_still_not_found() -> None:
    with pytest.raises(TaskNotFound, match=r"package\.module:function"):
        load_task("not a path")
