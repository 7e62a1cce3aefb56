"""The task API: how a task function is written, registered, loaded and run.

A task is a plain function::

    from PIL import Image, ImageFilter
    from workflows.api import TaskContext, TaskResult, task

    @task(name="sharpen", timeout_s=30, retries=2)
    def sharpen(img: Image.Image, ctx: TaskContext) -> TaskResult | None:
        radius = float(ctx.params.get("radius", 2))
        ctx.logger.info("sharpening %dx%d", *img.size)
        return TaskResult(image=img.filter(ImageFilter.UnsharpMask(radius=radius)))

or, with named data of any kind::

    @task
    def spectrum(frame: np.ndarray, ctx: TaskContext) -> dict[str, Any]:
        power = np.abs(np.fft.rfft2(frame)) ** 2
        return {"power": power, "peak": float(power.max())}

The contract, identical on every data plane:

* Parameters get the step's named inputs by name (``"inputs": {"frame": "decode.frames"}``),
  ``ctx`` the context. A step that names no inputs reads the single-image chain's ``image``
  (the step before it, or the workflow's input image), which goes to the first parameter:
  the signature ``f(img, ctx)`` (``workflows.binding``).
* Inputs are read-only views of the data (images in mode ``L``, ``RGB`` or ``RGBA``; NumPy
  arrays; bytes as a ``memoryview``; JSON). Changing one in place does nothing unless it is
  returned; copy one to keep it beyond the call.
* Return ``None`` (image unchanged, no output), a new ``PIL.Image.Image``, a
  ``TaskResult(image=..., output={...}, outputs={...})`` or a dict of named outputs. Named
  outputs are images, NumPy arrays, bytes, JSON, or lists of them (a list output: a later
  step can run once per element, ``for_each``). ``output`` must be a JSON-serialisable dict
  with string keys; it is recorded as the task's result (e.g. a classification), and a later
  step reads any of its keys as ``"<ref>.<key>"``. A step that read an ``image`` and returns
  none passes its input image on as its own.
* Raise any exception to fail; the runner retries up to ``retries`` times after
  ``retry_backoff_s``, so a task must be safe to run again on the same input.
* ``ctx.params`` holds the step's parameters from the workflow definition (read-only);
  ``ctx.input`` the workflow's ``input.data`` (read-only JSON, ``{}`` when none was given).
* A task may be stopped (its run cancelled or timed out, its ``timeout_s`` passed): the worker
  sets ``ctx.cancelled`` and calls what ``ctx.on_cancel`` registered. A long task waits on
  ``ctx.cancelled`` (``ctx.cancelled.wait(5)``, not ``time.sleep(5)``) or looks at it between
  pieces of work, and returns; one still running a second later is stopped with its worker's
  process (``orchestrator.worker.stopping``).
* A workflow started without an image is *dataless*: nothing is downloaded, and a step that
  names no inputs gets ``img=None``. Only tasks registered with ``@task(needs_image=False)``
  may take that; any other fails the workflow with a reason (e.g. ``deblur`` needs pixels).

``run_task_with_inputs`` runs a task on named inputs; ``run_task_on_image`` on one image (the
compute half of ``run_task``, which runs a task on an image stored in a buffer, see
``workflows.imagebuf``, and writes the result back into the same buffer).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType, ModuleType
from typing import Any, Final, TypeAlias, TypeVar, overload

from PIL import Image

from workflows.binding import IMAGE, Produced, Signature, bind, produced_from, signature_of
from workflows.definitions import task_definition_problems
from workflows.errors import (
    DuplicateTask,
    InvalidData,
    InvalidDefinition,
    InvalidTaskResult,
    ResultTooLarge,
    TaskFailed,
    TaskLoadError,
    TaskNotAllowed,
    TaskNotFound,
    WorkflowsError,
)
from workflows.imagebuf import ImageHeader, read_image, write_image
from workflows.names import MODULE_PATH_RE
from workflows.sources import BUNDLED, TaskSources
from workflows.streaming import Channels
from workflows.tracebacks import from_callee

__all__ = [
    "Produced",
    "TaskContext",
    "TaskFunction",
    "TaskOutcome",
    "TaskResult",
    "TaskSpec",
    "load_task",
    "registered_tasks",
    "registration_problem",
    "run_task",
    "run_task_on_image",
    "run_task_with_inputs",
    "run_task_without_image",
    "task",
]

_SPEC_ATTR: Final = "__cdiflow_task__"
_BUILTIN_MODULE: Final = "workflows.image_tasks"


class _CancelCallbacks:
    """A task's ``on_cancel`` callbacks, handed over once: a callback registered at the
    moment the worker stops the task goes either to the worker or back to its registrant."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], object]] | None = []

    def add(self, callback: Callable[[], object]) -> bool:
        """Keep ``callback`` for the worker; False once the worker has taken them (the
        caller calls it)."""
        with self._lock:
            if self._callbacks is None:
                return False
            self._callbacks.append(callback)
            return True

    def take(self) -> list[Callable[[], object]]:
        with self._lock:
            taken, self._callbacks = self._callbacks or [], None
        return taken


@dataclass(frozen=True)
class TaskContext:
    """What a task knows about the run it is part of."""

    task_name: str
    workflow_id: str = ""
    attempt: int = 1  # 1 on the first try, 2 on the first retry, …
    params: Mapping[str, Any] = field(default_factory=dict)
    base_logger: logging.Logger | None = None  # default: logger "workflows.task.<task_name>"
    input: Mapping[str, Any] = field(default_factory=dict)  # the workflow's input.data
    # The worker's reader of input files (``read_file``); None outside a worker.
    files: Callable[[str], bytes] | None = field(default=None, repr=False, compare=False)
    # Set when the worker stops the task (see ``on_cancel``); wait on it instead of sleeping.
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    # A streaming step's channels (``workflows.streaming``); None for any other step.
    streams: Channels | None = field(default=None, repr=False, compare=False)
    _on_cancel: _CancelCallbacks = field(
        default_factory=lambda: _CancelCallbacks(), repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # Read-only copies: a task cannot leak changes into the next attempt.
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))
        object.__setattr__(self, "input", MappingProxyType(dict(self.input)))

    @cached_property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """Logger whose records carry ``workflow_id``, ``task`` and ``attempt`` as extras."""
        base = self.base_logger or logging.getLogger(f"workflows.task.{self.task_name}")
        extra = {"workflow_id": self.workflow_id, "task": self.task_name, "attempt": self.attempt}
        return logging.LoggerAdapter(base, extra)

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Have ``callback()`` called when the worker stops this task: its run was cancelled,
        failed elsewhere or passed its time limit, or the task its own ``timeout_s``. It runs
        on a thread of the worker's, so it runs while the task's own thread is stuck in a
        call (kill a process the task started, end a remote job, close a socket). A task
        that ends within a second of being stopped (``ctx.cancelled`` is set then) leaves
        its worker as it was; one that does not costs the worker its process, and
        whatever else ran there. Registered after the stop, it is called at once."""
        if not self._on_cancel.add(callback):
            callback()

    def take_cancel_callbacks(self) -> list[Callable[[], object]]:
        """The callbacks ``on_cancel`` registered, in order, for the worker to call once the
        task is stopped; any registered later is called by ``on_cancel`` itself. Each is
        called once, whichever side calls it."""
        return self._on_cancel.take()

    @property
    def channels(self) -> Channels:
        """The channels of a streaming step (one whose definition names ``channels``):
        ``publish(name)`` and ``subscribe(name)``, see ``workflows.streaming``."""
        if self.streams is None:
            raise InvalidData(
                f"task {self.task_name!r} has no channels: its step names no 'channels' "
                "(a streaming step does)"
            )
        return self.streams

    def read_file(self, uri: str) -> bytes:
        """The bytes of a file a run names in its ``input.data`` (e.g. a video): an ``s3://``
        URI within the locations cdiflow reads inputs from, at most ``MAX_INPUT_BYTES``. The
        worker reads it with its own S3 store and policy; task code holds no credentials."""
        if self.files is None:
            raise InvalidData(f"no worker here to read {uri}: read_file works inside a worker")
        return self.files(uri)


@dataclass(frozen=True)
class TaskResult:
    """What a task returns: a new image (or ``None`` to keep the input), a JSON output, and
    named outputs of any kind (``workflows.binding``)."""

    image: Image.Image | None = None
    output: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)


# Parameters by name (``workflows.binding``); the classic ``f(img, ctx)`` is one such function.
TaskFunction: TypeAlias = Callable[..., Any]
F = TypeVar("F", bound=TaskFunction)


@dataclass(frozen=True)
class TaskSpec:
    """A task function with its run settings, as registered by ``@task``."""

    name: str
    fn: TaskFunction
    module: str  # "package.module:function", loadable by load_task when not a local function
    timeout_s: float = 30.0
    retries: int = 0
    retry_backoff_s: float = 0.5
    needs_image: bool = True  # False: may run in a dataless workflow, with img=None
    signature: Signature | None = None  # how to call ``fn`` (None: read when it is called)

    @property
    def call_signature(self) -> Signature:
        return self.signature if self.signature is not None else signature_of(self.fn)

    def to_definition(self) -> dict[str, Any]:
        """This spec as a task definition dict (the JSON shape the REST API accepts)."""
        return {
            "name": self.name,
            "module": self.module,
            "timeout_s": self.timeout_s,
            "retries": self.retries,
            "retry_backoff_s": self.retry_backoff_s,
        }


@dataclass(frozen=True)
class TaskOutcome:
    """The result of ``run_task``: what was written back, the output and where time went."""

    output: dict[str, Any]
    image_written: bool  # False when the task returned no image: the buffer is untouched
    header: ImageHeader  # shape of the image now in the buffer
    bytes_used: int  # header + pixels now in the buffer
    read_s: float
    compute_s: float
    write_s: float


_REGISTRY: dict[str, TaskSpec] = {}


@overload
def task(fn: F, /) -> F: ...
@overload
def task(
    *,
    name: str | None = None,
    timeout_s: float = 30.0,
    retries: int = 0,
    retry_backoff_s: float = 0.5,
    needs_image: bool = True,
) -> Callable[[F], F]: ...
def task(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    timeout_s: float = 30.0,
    retries: int = 0,
    retry_backoff_s: float = 0.5,
    needs_image: bool = True,
) -> F | Callable[[F], F]:
    """Register a task function (``@task`` or ``@task(name=..., ...)``); it stays callable.

    ``needs_image=False`` marks a task that works without pixels (it is then called with
    ``img=None`` in a dataless workflow, and with the image otherwise).

    ``name`` defaults to the function name. Registering a *different* function under a taken
    name raises ``DuplicateTask``; re-registering the same ``module:qualname`` (a reload)
    replaces it. Bad settings raise ``InvalidDefinition``.
    """

    def register(func: F) -> F:
        definition = {
            "name": name or func.__name__,
            "module": f"{func.__module__}:{func.__qualname__}",
            "timeout_s": timeout_s,
            "retries": retries,
            "retry_backoff_s": retry_backoff_s,
        }
        # The module is not checked: a function defined inside another has "<locals>" in it.
        problems = task_definition_problems(definition, check_module=False)
        if problems:
            raise InvalidDefinition(problems, f"task {definition['name']!r}")
        spec = TaskSpec(
            name=str(definition["name"]),
            fn=func,
            module=str(definition["module"]),
            timeout_s=float(timeout_s),
            retries=retries,
            retry_backoff_s=float(retry_backoff_s),
            needs_image=bool(needs_image),
            signature=signature_of(func),
        )
        existing = _REGISTRY.get(spec.name)
        if existing is not None and existing.module != spec.module:
            raise DuplicateTask(
                f"task name {spec.name!r} is already registered by {existing.module}; "
                f"{spec.module} needs a different name"
            )
        _REGISTRY[spec.name] = spec
        setattr(func, _SPEC_ATTR, spec)
        return func

    return register(fn) if fn is not None else register


def registered_tasks() -> dict[str, TaskSpec]:
    """Every registered task by name, the bundled ones included (a copy)."""
    _ensure_builtins()
    return dict(_REGISTRY)


def _ensure_builtins() -> None:
    # Imported lazily: image_tasks imports this module to use @task.
    importlib.import_module(_BUILTIN_MODULE)


def load_task(path: str, sources: TaskSources = BUNDLED) -> TaskSpec:
    """Find a task by registered name (``"deblur"``) or module path (``"pkg.mod:function"``).

    Loading by module path imports that module, which runs its code: so the module must be one
    ``sources`` allows (checked before importing), and the function must carry ``@task``.
    A registered name names code this process has imported already. Raises ``TaskNotAllowed``
    (a module outside ``sources``, a function without ``@task``), ``TaskNotFound`` (no such
    name, module or attribute) or ``TaskLoadError`` (the module raised while importing).
    """
    if ":" not in path:
        _ensure_builtins()
        spec = _REGISTRY.get(path)
        if spec is None:
            known = ", ".join(sorted(_REGISTRY)) or "none"
            raise TaskNotFound(
                f"no task registered as {path!r} (registered: {known}); load a user task by "
                "module path, 'package.module:function'"
            )
        return spec
    if MODULE_PATH_RE.fullmatch(path) is None:
        raise TaskNotFound(
            f"{path!r} is not a task module path; expected 'package.module:function'"
        )
    if (problem := sources.problem(path)) is not None:
        raise TaskNotAllowed(problem)
    module_name, attr = path.split(":", 1)
    module = _import(module_name, path)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            here = sorted(
                s.name for s in _REGISTRY.values() if s.module.startswith(module_name + ":")
            )
            hint = f"; tasks registered there: {', '.join(here)}" if here else ""
            raise TaskNotFound(f"module {module_name!r} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    return _marked(obj, path, sources)


def registration_problem(path: str, sources: TaskSources) -> str | None:
    """Why a task definition naming ``path`` must be refused, or ``None``.

    ``path`` must be in ``sources``. When this process can import its module (the API has the
    same code as the workers, as in one-machine stacks), it must also name an ``@task``
    function there. A module only the workers have, or one that fails to import here, is left
    to the workers, which check everything again before they run anything.
    """
    if (problem := sources.problem(path)) is not None:
        return problem
    module = path.split(":", 1)[0]
    try:
        here = importlib.util.find_spec(module) is not None
    except Exception:  # a parent package that is missing or raises: not deployed here
        here = False
    if not here:
        return None
    try:
        load_task(path, sources)
    except (TaskNotAllowed, TaskNotFound, DuplicateTask) as exc:
        return str(exc)
    except WorkflowsError:
        return None  # it raised while importing here; the workers may have what it needs
    return None


def _marked(obj: Any, path: str, sources: TaskSources) -> TaskSpec:
    """The spec ``@task`` put on ``obj``; ``TaskNotAllowed`` for anything else. *Why so
    strict:* a callable that merely exists (``builtins:print``, ``os:system``, a helper an
    allowed module imported) must never run as a task."""
    spec = getattr(obj, _SPEC_ATTR, None)
    if not isinstance(spec, TaskSpec) or spec.fn is not obj:
        kind = "function" if callable(obj) else type(obj).__name__
        raise TaskNotAllowed(
            f"{path!r} is a {kind} without @task; only functions decorated with "
            "@task (from workflows.api import task) may run as tasks"
        )
    defined_in = spec.module.split(":", 1)[0]
    if not sources.allows(defined_in):  # reached through an allowed module's import
        raise TaskNotAllowed(
            f"{path!r} is the task {spec.module}, whose module is not in a package tasks may "
            f"come from ({sources.describe()})"
        )
    return spec


def _import(module_name: str, path: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except WorkflowsError:
        raise  # e.g. DuplicateTask from an @task in that module: already a clear message
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise TaskNotFound(
                f"no module named {missing!r} for task {path!r}; is it installed or on PYTHONPATH?"
            ) from exc
        raise TaskLoadError(
            f"importing {module_name!r} for task {path!r} failed: {exc}"
        ) from from_callee(exc)
    except Exception as exc:
        raise TaskLoadError(
            f"importing {module_name!r} for task {path!r} raised {type(exc).__name__}: {exc}"
        ) from from_callee(exc)


def run_task_with_inputs(
    fn: TaskFunction | TaskSpec,
    inputs: Mapping[str, Any],
    ctx: TaskContext,
    *,
    chain: bool = True,
) -> Produced:
    """Run a task on named ``inputs``: what it produced; writes nothing.

    ``chain``: the step names no inputs and reads the single-image chain's ``image`` (absent
    in a run started without one). Images produced are already in a storable mode, so
    ``required_size`` of one is the exact buffer size its write needs. A raising task becomes
    ``TaskFailed`` (the original is ``__cause__``); inputs the function cannot take become
    ``InputsMismatch`` and an unusable return value ``InvalidTaskResult``.
    """
    if isinstance(fn, TaskSpec):
        func, sig, needs_image = fn.fn, fn.call_signature, fn.needs_image
    else:
        func, sig, needs_image = fn, signature_of(fn), False
    args, kwargs = bind(sig, inputs, ctx, task=ctx.task_name, needs_image=needs_image, chain=chain)
    try:
        result = func(*args, **kwargs)
    except Exception as exc:
        raise TaskFailed(
            f"task {ctx.task_name!r} (workflow {ctx.workflow_id or '-'}, attempt {ctx.attempt}) "
            f"raised {type(exc).__name__}: {exc}",
            task=ctx.task_name,
            attempt=ctx.attempt,
        ) from from_callee(exc)
    return produced_from(result, ctx.task_name)


def run_task_on_image(
    fn: TaskFunction | TaskSpec, img: Image.Image, ctx: TaskContext
) -> tuple[Image.Image | None, dict[str, Any]]:
    """Run a task on an image: ``(new image or None if unchanged, output)``; writes nothing.
    Named outputs other than ``image`` are refused (``InvalidTaskResult``): use
    ``run_task_with_inputs`` for those."""
    produced = run_task_with_inputs(fn, {IMAGE: img}, ctx)
    _only_image(produced, ctx)
    return produced.image, produced.output


def run_task_without_image(spec: TaskSpec, ctx: TaskContext) -> dict[str, Any]:
    """Run a task of a dataless workflow (``img=None``): its output; the task must not need
    pixels (``NeedsImage``) nor return an image (``InvalidTaskResult``)."""
    produced = run_task_with_inputs(spec, {}, ctx)
    if produced.image is not None:
        raise InvalidTaskResult(
            f"task {spec.name!r} returned an image in a dataless workflow (started without an "
            "image): there is nowhere to keep it; return None or TaskResult(output=...)"
        )
    _only_image(produced, ctx)
    return produced.output


def _only_image(produced: Produced, ctx: TaskContext) -> None:
    others = sorted(name for name in produced.objects if name != IMAGE)
    if others:
        raise InvalidTaskResult(
            f"task {ctx.task_name!r} returned named outputs ({', '.join(others)}) where only an "
            "image and a JSON output can go"
        )


def run_task(fn: TaskFunction | TaskSpec, buf: memoryview, ctx: TaskContext) -> TaskOutcome:
    """Run a task on the image stored in ``buf`` and write its result back into ``buf``.

    If the result does not fit, ``ResultTooLarge`` is raised with ``needed`` (the buffer size
    to allocate) and the computed ``image``/``output``, and the buffer still holds the input:
    grow the buffer, then ``write_image(new_buf, exc.image)`` - no need to recompute.
    """
    t0 = time.perf_counter()
    img = read_image(buf)
    t1 = time.perf_counter()
    new_img, output = run_task_on_image(fn, img, ctx)
    t2 = time.perf_counter()
    if new_img is None:
        header = ImageHeader(img.width, img.height, img.mode)
        return TaskOutcome(output, False, header, header.total_size, t1 - t0, t2 - t1, 0.0)
    try:
        used = write_image(buf, new_img)
    except ResultTooLarge as exc:
        raise ResultTooLarge(exc.needed, exc.available, image=new_img, output=output) from None
    t3 = time.perf_counter()
    header = ImageHeader(new_img.width, new_img.height, new_img.mode)
    return TaskOutcome(output, True, header, used, t1 - t0, t2 - t1, t3 - t2)
