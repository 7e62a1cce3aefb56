"""Loading the task code a worker is given, and saying what it loaded.

A worker is started with task *sources* (``cdiflow worker --tasks SOURCE``), each one of:

* a folder: it goes on ``sys.path`` and every module in it is imported (each ``*.py`` file
  and each package, a folder with ``__init__.py``; names starting with ``_`` or ``.`` are
  skipped);
* a ``.py`` file: its folder goes on ``sys.path`` and the file is imported as a module;
* a module name (``mypackage.tasks``), for code installed in the worker's environment (an
  image layer): it is imported.

Importing runs each ``@task`` decorator, so the tasks register themselves. ``load_sources``
returns a ``TaskCatalog``: every module loaded with the tasks it registered (and their
settings), and every module that failed with its error. The worker announces the catalog with
its heartbeat; the API refuses to register a task no live worker loaded (with the import
error a worker met) and fills the settings a registration leaves out from the ``@task``; the
scheduler places a task only on a worker that loaded its module. The bundled tasks
(``workflows.image_tasks``) are always in the catalog.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from workflows.api import registered_tasks

__all__ = ["BUNDLED_MODULE", "TaskCatalog", "load_sources", "source_modules"]

BUNDLED_MODULE: Final = "workflows.image_tasks"


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
    """The modules a source names, and the folder to put on ``sys.path`` (``None`` for a
    module name); ``ValueError`` for a source that is neither a path nor a module name."""
    path = Path(source).expanduser()
    if path.is_dir():
        names = sorted(
            child.stem if child.is_file() else child.name
            for child in path.iterdir()
            if not child.name.startswith(("_", "."))
            and (
                (child.is_file() and child.suffix == ".py")
                or (child.is_dir() and (child / "__init__.py").is_file())
            )
        )
        return names, path.resolve()
    if path.is_file() and path.suffix == ".py":
        return [path.stem], path.resolve().parent
    if "/" not in source and _is_module_name(source):
        return [source], None
    raise ValueError(
        f"task source {source!r} is neither a folder, a .py file nor a module name (package.module)"
    )


def load_sources(sources: Iterable[str]) -> TaskCatalog:
    """Import the modules of every source (see the module's docstring); ``ValueError`` for a
    source that names nothing. A module that fails to import is recorded, not raised: the
    worker still runs what did load, and says what did not."""
    wanted = [BUNDLED_MODULE]
    for source in sources:
        if not source.strip():
            continue  # an empty CDIFLOW_TASKS entry names nothing (not the current folder)
        names, folder = source_modules(source)
        if folder is not None and str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
        wanted += names
    errors: dict[str, str] = {}
    loaded: set[str] = set()
    for name in dict.fromkeys(wanted):  # in order, once each
        try:
            importlib.import_module(name)
        except Exception as exc:  # the user's code: anything may come out of it
            errors[name] = _reason(exc)
        else:
            loaded.add(name)
    modules: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in loaded}
    for spec in registered_tasks().values():
        module, _, attr = spec.module.partition(":")
        if "<locals>" in attr or module not in sys.modules:
            continue
        modules.setdefault(module, {})[attr] = {
            "name": spec.name,
            "timeout_s": spec.timeout_s,
            "retries": spec.retries,
            "retry_backoff_s": spec.retry_backoff_s,
            "needs_image": spec.needs_image,
        }
    return TaskCatalog(modules, errors)


def _is_module_name(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _reason(exc: BaseException) -> str:
    """The exception as Python prints its last line, and where in the user's code it rose."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "importlib" not in f.filename]
    where = f" ({Path(own[-1].filename).name}, line {own[-1].lineno})" if own else ""
    return f"{type(exc).__name__}: {exc}{where}"
