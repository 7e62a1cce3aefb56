"""Where task code may come from: the packages and folders the operator deployed.

A task definition names ``package.module:function``, and loading it imports that module, which
runs its code. So only modules the operator named may be loaded: those in ``packages`` (each
with its submodules) and the top-level modules found in ``paths`` (folders of deployed task
code, which a worker puts on ``sys.path``). The API refuses to register anything else, and a
worker refuses to import it, whatever reaches it. The function found must also carry the
``@task`` marker (``workflows.api.task``): ``builtins:print``, ``os:system`` and every other
callable that merely exists are refused.

    sources = TaskSources(packages=("workflows", "acme.tasks"), paths=(Path("/opt/tasks"),))
    sources.problem("os:system")  # "task 'os:system': module 'os' is not in a package tasks ..."
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from workflows.names import MODULE_PATH_RE

__all__ = ["BUNDLED", "TaskSources"]


@dataclass(frozen=True)
class TaskSources:
    """The packages (dotted names) and folders task modules may be loaded from."""

    packages: tuple[str, ...] = ("workflows",)
    paths: tuple[Path, ...] = ()

    def path_modules(self) -> set[str]:
        """Top-level module names in ``paths`` now (``name.py`` files and package folders);
        listed at each call, so code deployed while a process runs counts."""
        found: set[str] = set()
        for folder in self.paths:
            try:
                entries = list(folder.iterdir())
            except OSError:
                continue  # a folder that is not there (yet) holds no task
            for entry in entries:
                if entry.suffix == ".py" and entry.stem.isidentifier():
                    found.add(entry.stem)
                elif entry.is_dir() and entry.name.isidentifier():
                    found.add(entry.name)
        return found

    def allows(self, module: str) -> bool:
        """Whether tasks may be loaded from ``module`` (a dotted module name)."""
        if any(module == p or module.startswith(p + ".") for p in self.packages):
            return True
        return bool(self.paths) and module.split(".", 1)[0] in self.path_modules()

    def problem(self, path: str) -> str | None:
        """Why ``package.module:function`` may not be loaded, or ``None`` if it may."""
        if MODULE_PATH_RE.fullmatch(path) is None:
            return f"{path!r} is not a task module path; expected 'package.module:function'"
        module, attr = path.split(":", 1)
        if not self.allows(module):
            return (
                f"task {path!r}: module {module!r} is not in a package tasks may come from "
                f"({self.describe()}); "
                "deploy the task code in one, or have the operator add its package to "
                "CDIFLOW_TASK_PACKAGES or its folder to CDIFLOW_TASK_PATHS"
            )
        if any(part.startswith("__") for part in attr.split(".")):
            return f"{path!r} names a special attribute; name the @task function itself"
        return None

    def describe(self) -> str:
        """The allowed sources, for messages."""
        parts = [f"packages {', '.join(self.packages)}" if self.packages else "no packages"]
        if self.paths:
            parts.append(f"folders {', '.join(str(p) for p in self.paths)}")
        return "; ".join(parts)

    def activate(self) -> None:
        """Put ``paths`` on ``sys.path`` (first, in order), so their modules import."""
        for folder in reversed(self.paths):
            text = str(folder)
            if text not in sys.path:
                sys.path.insert(0, text)


BUNDLED: Final = TaskSources()  # the bundled ``workflows`` package alone
