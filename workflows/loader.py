"""Loading the task code a worker is given, and saying what it loaded.

The operator deploys task code where the settings say tasks may come from
(``workflows.sources.TaskSources``: the packages of ``CDIFLOW_TASK_PACKAGES`` and the folders of
``CDIFLOW_TASK_PATHS``); ``cdiflow worker --tasks SOURCE`` and ``cdiflow up --tasks SOURCE``
add to them (``with_sources``), each source one of:

* a folder: it joins the paths, and every module in it is imported (each ``*.py`` file and
  each package, a folder with ``__init__.py``; names starting with ``_`` or ``.`` are
  skipped);
* a ``.py`` file: its folder joins the paths (so its neighbours may hold tasks too), and the
  file is imported as a module;
* a module name (``mypackage.tasks``), for code installed in the worker's environment (an
  image layer): it joins the packages, and is imported.

A worker imports all of it when it starts (``load_deployed``): importing runs each ``@task``
decorator, so the tasks register themselves. The result is a ``TaskCatalog``: every module
loaded with the tasks it registered (and their settings), and every module that failed with
its error. The worker announces the catalog with its heartbeat; the API refuses to register a
task no live worker loaded (with the import error a worker met) and fills the settings a
registration leaves out from the ``@task``; the scheduler places a task only on a worker that
loaded its module. The bundled tasks (``workflows.image_tasks``, ``workflows.fanout_tasks``,
``workflows.stream_tasks``) are always in the catalog; the AR application's
(``workflows.ar.tasks``) are when the optional ``ar`` dependencies are installed (otherwise the
catalog records why that module did not import).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from workflows.api import registered_tasks
from workflows.sources import TaskSources

__all__ = [
    "BUNDLED_MODULE",
    "BUNDLED_MODULES",
    "TaskCatalog",
    "deployed_modules",
    "load_deployed",
    "source_modules",
    "with_sources",
]

BUNDLED_MODULE: Final = "workflows.image_tasks"
BUNDLED_MODULES: Final = (
    BUNDLED_MODULE,
    "workflows.fanout_tasks",
    "workflows.stream_tasks",
    "workflows.ar.tasks",
)
_BUNDLED_PACKAGE: Final = "workflows"  # its task modules are the bundled ones above


@dataclass(frozen=True)
class TaskCatalog:
    """What a worker can run: ``modules`` maps each module it imported to its tasks by
    attribute (``{"sharpen": {"name", "timeout_s", "retries", "retry_backoff_s",
    "needs_image"}}``); ``errors`` maps each module that failed to import to why."""

    modules: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"modules": self.modules, "errors": self.errors}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TaskCatalog:
        """A catalog read from a heartbeat; an unreadable one reads as empty (another
        process wrote it, and a bad one must not break the reader)."""
        try:
            raw = json.loads(text)
            modules = {str(m): dict(t) for m, t in dict(raw["modules"]).items()}
            errors = {str(m): str(e) for m, e in dict(raw.get("errors", {})).items()}
        except (ValueError, TypeError, KeyError, AttributeError):
            return cls()
        return cls(modules, errors)

    def task(self, module_path: str) -> Mapping[str, Any] | None:
        """The ``@task`` settings of ``package.module:function``, if this worker loaded it."""
        module, _, attr = module_path.partition(":")
        return self.modules.get(module, {}).get(attr)

    def error_for(self, module_path: str) -> str | None:
        """Why this worker could not load the module of ``module_path`` (or a package it is
        in), if it tried."""
        module = module_path.partition(":")[0]
        for failed, error in self.errors.items():
            if module == failed or module.startswith(failed + "."):
                return f"{failed}: {error}"
        return None


def source_modules(source: str) -> tuple[list[str], Path | None]:
    """The modules a ``--tasks`` source names, and its folder for the paths (``None`` for a
    module name); ``ValueError`` for a source that is neither a path nor a module name."""
    path = Path(source).expanduser()
    if path.is_dir():
        return _folder_modules(path), path.resolve()
    if path.is_file() and path.suffix == ".py":
        return [path.stem], path.resolve().parent
    if "/" not in source and _is_module_name(source):
        return [source], None
    raise ValueError(
        f"task source {source!r} is neither a folder, a .py file nor a module name (package.module)"
    )


def with_sources(base: TaskSources, sources: Iterable[str]) -> TaskSources:
    """``base`` and the task code ``sources`` name (see the module's docstring); ``ValueError``
    for a source that names nothing. Empty entries (an empty variable) name nothing."""
    packages, paths = list(base.packages), list(base.paths)
    for source in sources:
        if not source.strip():
            continue
        names, folder = source_modules(source)
        if folder is None:
            packages += [n for n in names if n not in packages]
        elif folder not in paths:
            paths.append(folder)
    return dataclasses.replace(base, packages=tuple(packages), paths=tuple(paths))


def deployed_modules(sources: TaskSources) -> list[str]:
    """The modules a worker imports when it starts: the bundled tasks, each package other than
    the bundled one, and every module in each folder, in that order, once each."""
    names = list(BUNDLED_MODULES)
    names += [p for p in sources.packages if p != _BUNDLED_PACKAGE]
    for folder in sources.paths:
        names += _folder_modules(folder)
    return list(dict.fromkeys(names))


def load_deployed(sources: TaskSources) -> TaskCatalog:
    """Import every module of ``sources`` (its folders put on ``sys.path`` first). A module
    that fails to import is recorded, not raised: the worker still runs what did load, and
    says what did not."""
    sources.activate()
    errors: dict[str, str] = {}
    loaded: set[str] = set()
    for name in deployed_modules(sources):
        try:
            importlib.import_module(name)
        except Exception as exc:  # the user's code: anything may come out of it
            errors[name] = _reason(exc)
        else:
            loaded.add(name)
    modules: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in loaded}
    for spec in registered_tasks().values():
        module, _, attr = spec.module.partition(":")
        if "<locals>" in attr or not sources.allows(module):
            continue
        modules.setdefault(module, {})[attr] = {
            "name": spec.name,
            "timeout_s": spec.timeout_s,
            "retries": spec.retries,
            "retry_backoff_s": spec.retry_backoff_s,
            "needs_image": spec.needs_image,
        }
    return TaskCatalog(modules, errors)


def _folder_modules(folder: Path) -> list[str]:
    try:
        children = list(folder.iterdir())
    except OSError:
        return []  # a folder that is not there (yet) holds no task
    return sorted(
        child.stem if child.is_file() else child.name
        for child in children
        if not child.name.startswith(("_", "."))
        and (
            (child.is_file() and child.suffix == ".py" and child.stem.isidentifier())
            or (child.is_dir() and (child / "__init__.py").is_file() and child.name.isidentifier())
        )
    )


def _is_module_name(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _reason(exc: BaseException) -> str:
    """The exception as Python prints its last line, and where in the user's code it rose."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "importlib" not in f.filename]
    where = f" ({Path(own[-1].filename).name}, line {own[-1].lineno})" if own else ""
    return f"{type(exc).__name__}: {exc}{where}"
