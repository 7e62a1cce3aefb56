"""Workflow and task definitions: the JSON shapes, their validation and the bundled ones.

A workflow definition (also the REST API's request body)::

    {"name": "image_pipeline", "description": "...",
     "tasks": [{"ref": "deblur", "task": "deblur"},
               {"ref": "denoise", "task": "denoise", "depends_on": ["deblur"]},
               {"ref": "classify", "task": "classify", "depends_on": ["denoise"],
                "params": {}}]}

``ref`` names a step inside the workflow, ``task`` names a task definition, ``depends_on``
lists refs that must finish first and the optional ``params`` object reaches the task as
``ctx.params``. Steps may also fork and join, read named data (``inputs``), run once per
element of a list (``for_each``), choose a branch (``switch``) or run another definition
(``workflow``): ``workflows.steps`` says how. Two optional settings bound a run in time:
``timeout_s``, the longest a run may take from its start (it then ends TIMED_OUT, its running
task stopped; a start may set its own), and ``worker_wait_s``, the longest a step may wait for
a live worker able to run it (none alive, or none loaded its task's module; the run then fails
saying so). A task definition::

    {"name": "deblur", "module": "workflows.image_tasks:deblur",
     "timeout_s": 30, "retries": 2, "retry_backoff_s": 0.5}

Validation collects *every* problem rather than stopping at the first, so one round trip
tells a user all there is to fix. Names follow ``workflows.names.NAME_RE``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from workflows.errors import InvalidDefinition
from workflows.names import MODULE_PATH_RE, name_problem
from workflows.steps import Shape, StepKind, edges, graph_problems, step_problems, topological

__all__ = [
    "AR_VIDEO",
    "AR_VIDEO_STREAM",
    "FORK_JOIN_PIPELINE",
    "IMAGE_PIPELINE",
    "MAX_RUN_S",
    "NOOP_PIPELINE",
    "STREAM_NUMBERS",
    "TASK_DEFINITIONS",
    "Step",
    "TaskDefinition",
    "WorkflowDefinition",
    "ar_stream_definition",
    "bundled_task_definitions",
    "bundled_workflows",
    "chain_problems",
    "parse_task_definition",
    "parse_workflow",
    "task_definition_problems",
    "validate_workflow",
]

# Bounds that keep a definition from the REST API sane; generous for real work.
MAX_TIMEOUT_S: Final = 24 * 3600.0
MAX_RETRIES: Final = 10
MAX_BACKOFF_S: Final = 3600.0
MAX_RUN_S: Final = 7 * 24 * 3600.0  # a run's time limit, and a step's wait for a worker

_WORKFLOW_KEYS: Final = frozenset({"name", "description", "tasks", "timeout_s", "worker_wait_s"})
_RUN_LIMITS: Final = ("timeout_s", "worker_wait_s")
_TASK_KEYS: Final = frozenset({"name", "module", "timeout_s", "retries", "retry_backoff_s"})


@dataclass(frozen=True)
class TaskDefinition:
    name: str
    module: str  # "package.module:function"
    timeout_s: float = 30.0
    retries: int = 0
    retry_backoff_s: float = 0.5

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "module": self.module,
            "timeout_s": self.timeout_s,
            "retries": self.retries,
            "retry_backoff_s": self.retry_backoff_s,
        }


@dataclass(frozen=True)
class Step:
    """One step of a workflow definition (``workflows.steps``): a task, a switch or a
    sub-workflow. ``inputs`` None reads the single-image chain's image."""

    ref: str
    task: str | None = None
    depends_on: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, str | list[str]] | None = None
    for_each: str | None = None
    switch: str | None = None
    cases: Mapping[str, list[str]] = field(default_factory=dict)
    default: tuple[str, ...] = ()
    workflow: str | None = None
    channels: Mapping[str, list[str]] | None = None  # a streaming step's channels

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ref": self.ref}
        for kind in StepKind:
            if getattr(self, kind) is not None:
                out[kind] = getattr(self, kind)
        if self.depends_on:
            out["depends_on"] = list(self.depends_on)
        if self.params:
            out["params"] = copy.deepcopy(dict(self.params))
        if self.inputs is not None:
            out["inputs"] = copy.deepcopy(dict(self.inputs))
        if self.for_each is not None:
            out["for_each"] = self.for_each
        if self.cases:
            out["cases"] = copy.deepcopy(dict(self.cases))
        if self.default:
            out["default"] = list(self.default)
        if self.channels is not None:
            out["channels"] = copy.deepcopy(dict(self.channels))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Step:
        """A step from its (validated) JSON shape."""
        inputs = data.get("inputs")
        channels = data.get("channels")
        return cls(
            ref=data["ref"],
            task=data.get("task"),
            depends_on=tuple(data.get("depends_on", ())),
            params=copy.deepcopy(dict(data.get("params", {}))),
            inputs=None if inputs is None else copy.deepcopy(dict(inputs)),
            for_each=data.get("for_each"),
            switch=data.get("switch"),
            cases=copy.deepcopy(dict(data.get("cases", {}))),
            default=tuple(data.get("default", ())),
            workflow=data.get("workflow"),
            channels=None if channels is None else copy.deepcopy(dict(channels)),
        )


@dataclass(frozen=True)
class WorkflowDefinition:
    name: str
    description: str
    tasks: tuple[Step, ...]
    timeout_s: float | None = None  # a run's time limit (None: none)
    worker_wait_s: float | None = None  # a step's wait for a worker able to run it

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "tasks": [s.to_dict() for s in self.tasks],
        }
        for limit in _RUN_LIMITS:
            if getattr(self, limit) is not None:
                out[limit] = getattr(self, limit)
        return out

    def order(self) -> list[str]:
        """Step refs in an order where every step comes after those it needs first."""
        shapes: dict[str, Shape] = {}
        for i, step in enumerate(self.tasks):
            step_problems(i, step.to_dict(), set(), set(), shapes)
        graph = edges(shapes)
        for step in self.tasks:
            if step.ref in step.depends_on:  # edges() leaves it out: it is its own problem
                graph.setdefault(step.ref, []).append(step.ref)
        try:
            return topological(graph)
        except ValueError as exc:
            raise InvalidDefinition([str(exc)], f"workflow {self.name!r}") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _unknown_keys(where: str, data: Mapping[str, Any], allowed: frozenset[str]) -> list[str]:
    return [
        f"{where}: unknown field {key!r} (allowed: {', '.join(sorted(allowed))})"
        for key in data
        if key not in allowed
    ]


def task_definition_problems(data: Any, *, check_module: bool = True) -> list[str]:
    """Every problem with a task definition dict; empty when it is valid.

    ``check_module`` checks the ``module`` syntax only (nothing is imported).
    """
    if not isinstance(data, Mapping):
        return [f"task definition must be an object, got {type(data).__name__}"]
    problems = _unknown_keys("task definition", data, _TASK_KEYS)
    if "name" not in data:
        problems.append("task definition: missing 'name'")
    elif (p := name_problem("task", data["name"])) is not None:
        problems.append(p)
    module = data.get("module")
    if module is None:
        problems.append("task definition: missing 'module' ('package.module:function')")
    elif check_module and (not isinstance(module, str) or not MODULE_PATH_RE.fullmatch(module)):
        problems.append(f"task module {module!r} is not of the form 'package.module:function'")
    timeout = data.get("timeout_s", 30.0)
    if not _is_number(timeout) or not 0 < timeout <= MAX_TIMEOUT_S:
        problems.append(f"timeout_s must be a number in (0, {MAX_TIMEOUT_S:g}], got {timeout!r}")
    retries = data.get("retries", 0)
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= MAX_RETRIES:
        problems.append(f"retries must be an integer in 0..{MAX_RETRIES}, got {retries!r}")
    backoff = data.get("retry_backoff_s", 0.5)
    if not _is_number(backoff) or not 0 <= backoff <= MAX_BACKOFF_S:
        problems.append(
            f"retry_backoff_s must be a number in [0, {MAX_BACKOFF_S:g}], got {backoff!r}"
        )
    return problems


def parse_task_definition(data: Any) -> TaskDefinition:
    """A validated ``TaskDefinition``; raises ``InvalidDefinition`` listing every problem."""
    problems = task_definition_problems(data)
    if problems:
        raise InvalidDefinition(problems, "task definition")
    return TaskDefinition(
        name=data["name"],
        module=data["module"],
        timeout_s=float(data.get("timeout_s", 30.0)),
        retries=int(data.get("retries", 0)),
        retry_backoff_s=float(data.get("retry_backoff_s", 0.5)),
    )


def validate_workflow(
    defn: Mapping[str, Any] | WorkflowDefinition,
    known_tasks: Iterable[str],
    known_workflows: Iterable[str] | None = None,
) -> list[str]:
    """Every problem with a workflow definition; an empty list means it is valid.

    Checks: shape and field types, unknown fields, bad names, empty task list, unknown task
    (and, when ``known_workflows`` is given, unknown sub-workflow), duplicate ref, unknown
    steps named anywhere, self-dependency, dependency cycles, inputs the default cannot tell
    (``workflows.steps``).
    """
    data: Any = defn.to_dict() if isinstance(defn, WorkflowDefinition) else defn
    if not isinstance(data, Mapping):
        return [f"workflow definition must be an object, got {type(data).__name__}"]
    known = set(known_tasks)
    problems = _unknown_keys("workflow", data, _WORKFLOW_KEYS)
    name = data.get("name")
    if "name" not in data:
        problems.append("workflow: missing 'name'")
    elif (p := name_problem("workflow", name)) is not None:
        problems.append(p)
    if not isinstance(data.get("description", ""), str):
        problems.append("workflow: 'description' must be a string")
    for limit in _RUN_LIMITS:
        value = data.get(limit)
        if value is not None and (not _is_number(value) or not 0 < value <= MAX_RUN_S):
            problems.append(
                f"workflow: {limit!r} must be a number of seconds in (0, {MAX_RUN_S:g}], "
                f"got {value!r}"
            )
    steps = data.get("tasks")
    if not isinstance(steps, list):
        problems.append("workflow: 'tasks' must be a list of steps")
        return problems
    if not steps:
        problems.append("workflow: 'tasks' is empty; a workflow needs at least one step")
        return problems
    workflows = None if known_workflows is None else set(known_workflows) | {name}
    shapes: dict[str, Shape] = {}
    for i, step in enumerate(steps):
        problems += step_problems(i, step, known, workflows, shapes)
        if isinstance(step, Mapping) and step.get("workflow") == name and name is not None:
            problems.append(f"tasks[{i}]: workflow {name!r} may not run itself")
    problems += graph_problems(shapes)
    return problems


def chain_problems(steps: Iterable[Mapping[str, Any]]) -> list[str]:
    """Why steps are not one chain of task steps on one image (what the ``object-store``
    plane carries: one image from step to step); empty if they are."""
    hint = "; the object-store plane runs one chain of steps: start the run on the cdi plane"
    listed = list(steps)
    problems = [
        f"step {s['ref']!r}: {field!r} needs the cdi plane"
        for s in listed
        for field in ("inputs", "for_each", StepKind.SWITCH, StepKind.WORKFLOW)
        if s.get(field) is not None
    ]
    graph = {s["ref"]: _after(s) for s in listed}
    roots = [ref for ref, deps in graph.items() if not deps]
    problems += [
        f"step {ref!r}: depends on {len(deps)} steps ({', '.join(map(repr, deps))}){hint}"
        for ref, deps in graph.items()
        if len(deps) > 1
    ]
    if len(roots) > 1:
        problems.append(
            f"steps {', '.join(map(repr, roots))} all start the workflow (none depends on "
            f"another){hint}"
        )
    followers: dict[str, list[str]] = {}
    for ref, deps in graph.items():
        for dep in deps:
            followers.setdefault(dep, []).append(ref)
    problems += [
        f"steps {', '.join(map(repr, refs))} all depend on step {dep!r}{hint}"
        for dep, refs in followers.items()
        if len(refs) > 1
    ]
    return problems


def _after(step: Mapping[str, Any]) -> list[str]:
    """The steps ``step`` follows: its ``depends_on`` and the steps its inputs read."""
    after = list(step.get("depends_on") or [])
    given = step.get("inputs") or {}
    texts = [t for v in given.values() for t in (v if isinstance(v, list) else [v])]
    for text in texts:
        ref = str(text).split(".", 1)[0]
        if ref != "input" and ref not in after:
            after.append(ref)
    return after


def parse_workflow(
    data: Any, known_tasks: Iterable[str], known_workflows: Iterable[str] | None = None
) -> WorkflowDefinition:
    """A validated ``WorkflowDefinition``; raises ``InvalidDefinition`` listing every problem."""
    problems = validate_workflow(data, known_tasks, known_workflows)
    if problems:
        name = data.get("name") if isinstance(data, Mapping) else None
        raise InvalidDefinition(problems, f"workflow {name!r}" if name else "workflow")
    steps = tuple(Step.from_dict(s) for s in data["tasks"])
    limits = {k: float(data[k]) for k in _RUN_LIMITS if data.get(k) is not None}
    return WorkflowDefinition(data["name"], data.get("description", ""), steps, **limits)


# --- bundled definitions -------------------------------------------------------------------

TASK_DEFINITIONS: Final[list[dict[str, Any]]] = [
    {"name": "deblur", "module": "workflows.image_tasks:deblur",
     "timeout_s": 30.0, "retries": 2, "retry_backoff_s": 0.5},
    {"name": "denoise", "module": "workflows.image_tasks:denoise",
     "timeout_s": 30.0, "retries": 2, "retry_backoff_s": 0.5},
    {"name": "classify", "module": "workflows.image_tasks:classify",
     "timeout_s": 30.0, "retries": 2, "retry_backoff_s": 0.5},
    {"name": "blend", "module": "workflows.image_tasks:blend",
     "timeout_s": 30.0, "retries": 2, "retry_backoff_s": 0.5},
    {"name": "noop", "module": "workflows.image_tasks:noop",
     "timeout_s": 10.0, "retries": 0, "retry_backoff_s": 0.5},
    {"name": "sleep", "module": "workflows.image_tasks:sleep",
     "timeout_s": 60.0, "retries": 0, "retry_backoff_s": 0.5},
    {"name": "ar_decode", "module": "workflows.ar.tasks:ar_decode",
     "timeout_s": 120.0, "retries": 1, "retry_backoff_s": 0.5},
    {"name": "ar_detect", "module": "workflows.ar.tasks:ar_detect",
     "timeout_s": 60.0, "retries": 2, "retry_backoff_s": 0.5},
    {"name": "ar_combine", "module": "workflows.ar.tasks:ar_combine",
     "timeout_s": 120.0, "retries": 1, "retry_backoff_s": 0.5},
    {"name": "ar_decode_stream", "module": "workflows.ar.tasks:ar_decode_stream",
     "timeout_s": 600.0, "retries": 0, "retry_backoff_s": 0.5},
    {"name": "ar_detect_stream", "module": "workflows.ar.tasks:ar_detect_stream",
     "timeout_s": 600.0, "retries": 0, "retry_backoff_s": 0.5},
    {"name": "ar_combine_stream", "module": "workflows.ar.tasks:ar_combine_stream",
     "timeout_s": 600.0, "retries": 0, "retry_backoff_s": 0.5},
    {"name": "stream_count", "module": "workflows.stream_tasks:stream_count",
     "timeout_s": 600.0, "retries": 0, "retry_backoff_s": 0.5},
    {"name": "stream_double", "module": "workflows.stream_tasks:stream_double",
     "timeout_s": 600.0, "retries": 0, "retry_backoff_s": 0.5},
    {"name": "stream_total", "module": "workflows.stream_tasks:stream_total",
     "timeout_s": 600.0, "retries": 0, "retry_backoff_s": 0.5},
]  # fmt: skip

IMAGE_PIPELINE: Final[dict[str, Any]] = {
    "name": "image_pipeline",
    "description": "Sharpen (unsharp mask), smooth (Gaussian blur), then label the image "
    "from its colour statistics.",
    "tasks": [
        {"ref": "deblur", "task": "deblur"},
        {"ref": "denoise", "task": "denoise", "depends_on": ["deblur"]},
        {"ref": "classify", "task": "classify", "depends_on": ["denoise"]},
    ],
}

FORK_JOIN_PIPELINE: Final[dict[str, Any]] = {
    "name": "fork_join_pipeline",
    "description": "Sharpen and smooth the image side by side, blend the two, then label the "
    "blend: two branches on two workers, joined by a step that reads both.",
    "tasks": [
        {"ref": "sharpen", "task": "deblur"},
        {"ref": "smooth", "task": "denoise"},
        {"ref": "blend", "task": "blend",
         "inputs": {"sharp": "sharpen.image", "smooth": "smooth.image"}},
        {"ref": "classify", "task": "classify", "depends_on": ["blend"]},
    ],
}  # fmt: skip

NOOP_PIPELINE: Final[dict[str, Any]] = {
    "name": "noop_pipeline",
    "description": "Three chained no-op tasks: measures orchestration and data-movement "
    "overhead with no compute.",
    "tasks": [
        {"ref": "noop1", "task": "noop"},
        {"ref": "noop2", "task": "noop", "depends_on": ["noop1"]},
        {"ref": "noop3", "task": "noop", "depends_on": ["noop2"]},
    ],
}


AR_VIDEO: Final[dict[str, Any]] = {
    "name": "ar_video",
    "description": "The AR application: decode the video at input.data.video, find and box "
    "the people in every frame (one detect step per frame, side by side), and encode the "
    "labelled frames into the output video.",
    "tasks": [
        {"ref": "decode", "task": "ar_decode", "params": {"frames_per_step": 1}},
        {"ref": "detect", "task": "ar_detect", "inputs": {"frames": "decode.frames"},
         "for_each": "frames"},
        {"ref": "combine", "task": "ar_combine", "inputs": {
            "frames": "detect.frames", "boxes": "detect.boxes", "fps": "decode.fps"}},
    ],
}  # fmt: skip


def ar_stream_definition(detectors: int = 2, name: str = "ar_video_stream") -> dict[str, Any]:
    """The streaming AR workflow with ``detectors`` detect steps: it runs on ``detectors`` + 2
    worker slots at once (``workflows.ar.tasks``, the streaming variant)."""
    frames = [f"frames{i}" for i in range(detectors)]
    labelled = [f"labelled{i}" for i in range(detectors)]
    detect = [
        {"ref": f"detect{i}", "task": "ar_detect_stream",
         "params": {"from": frames[i], "to": labelled[i]},
         "channels": {"subscribe": [frames[i]], "publish": [labelled[i]]}}
        for i in range(detectors)
    ]  # fmt: skip
    return {
        "name": name,
        "description": "The AR application as streaming steps: decode the video at "
        f"input.data.video and deal its frames to {detectors} detect steps over channels, which "
        "box the people and pass each frame on to combine, encoding the output video as the "
        "frames come; every step runs at once, one task per step, not per frame.",
        "tasks": [
            {"ref": "decode", "task": "ar_decode_stream", "params": {"to": frames},
             "channels": {"publish": [*frames, "meta"]}},
            *detect,
            {"ref": "combine", "task": "ar_combine_stream", "params": {"from": labelled},
             "channels": {"subscribe": [*labelled, "meta"]}},
        ],
    }  # fmt: skip


AR_VIDEO_STREAM: Final[dict[str, Any]] = ar_stream_definition(2)

STREAM_NUMBERS: Final[dict[str, Any]] = {
    "name": "stream_numbers",
    "description": "Streaming steps: count to input.data.count on channel 'numbers', double "
    "each number onto 'doubled', and total them; the three run at once, items flowing "
    "through shared-memory channels (docs/streaming.md).",
    "tasks": [
        {"ref": "count", "task": "stream_count", "channels": {"publish": ["numbers"]}},
        {"ref": "double", "task": "stream_double",
         "channels": {"subscribe": ["numbers"], "publish": ["doubled"]}},
        {"ref": "total", "task": "stream_total", "channels": {"subscribe": ["doubled"]}},
    ],
}  # fmt: skip


def bundled_workflows() -> dict[str, dict[str, Any]]:
    """The bundled workflow definitions by name (deep copies: safe to modify)."""
    bundled = (
        IMAGE_PIPELINE, FORK_JOIN_PIPELINE, NOOP_PIPELINE, AR_VIDEO, AR_VIDEO_STREAM,
        STREAM_NUMBERS,
    )  # fmt: skip
    return {d["name"]: copy.deepcopy(d) for d in bundled}


def bundled_task_definitions() -> list[dict[str, Any]]:
    """The bundled task definitions (deep copies: safe to modify)."""
    return copy.deepcopy(TASK_DEFINITIONS)
