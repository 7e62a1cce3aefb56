"""How a task function is called with a step's named inputs, and what its return value yields.

*Calling.* A step gives its task named inputs (``"inputs": {"frame": "decode.frames"}``); each
goes to the function's parameter of that name. A parameter named ``ctx`` (or annotated
``TaskContext``) gets the context; so does the second of a function of two parameters that has
no such one. The old signature ``f(img, ctx)`` keeps working: a step's ``image`` input, when no
parameter is called ``image``, goes to the first parameter that is neither the context nor
named by another input; in a run without an image, a step that names no inputs gives that
parameter ``None`` (``@task(needs_image=False)``) or fails with ``NeedsImage``. A
``**kwargs`` parameter takes the inputs no other parameter names. A required parameter with no
input, or an input no parameter takes, is ``InputsMismatch``: a definition the function cannot
run, which no retry fixes.

*Returning.* ``None``; an image (the new ``image``); a ``TaskResult`` (its ``image``, its
JSON ``output`` and its named ``outputs``); or a dict of named outputs. Each named output is an
image, a NumPy array, bytes or JSON (``workflows.kinds``); a list of images, arrays or bytes
(or a mix with JSON) is a list output, one datum per element, which a later step can fan out
over (``for_each``). JSON values small enough travel in the step's JSON output (which the run's
output merges, and later steps read as ``"<ref>.<key>"``); larger ones become objects.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from PIL import Image

from workflows.errors import InputsMismatch, InvalidData, InvalidTaskResult, NeedsImage
from workflows.imagebuf import normalize_mode, required_size
from workflows.kinds import INLINE_LIMIT, Kind, json_bytes, kind_of
from workflows.names import NAME_RE

__all__ = ["IMAGE", "Produced", "Signature", "bind", "produced_from", "signature_of"]

IMAGE: Final = "image"  # the input and output of the single-image chain
_CTX: Final = "ctx"


@dataclass(frozen=True)
class Signature:
    """What ``bind`` needs to know of a task function's parameters."""

    positional_only: tuple[str, ...] = ()
    named: tuple[str, ...] = ()  # positional-or-keyword and keyword-only, in order
    required: frozenset[str] = frozenset()
    context: frozenset[str] = frozenset()  # parameters that take the TaskContext
    var_keyword: bool = False
    legacy: bool = False  # not inspectable (a builtin, ``*args``): called as f(img, ctx)

    @property
    def parameters(self) -> tuple[str, ...]:
        return self.positional_only + self.named

    @property
    def first(self) -> str | None:
        """The first parameter that is not the context: the old signature's image."""
        return next((p for p in self.parameters if p not in self.context), None)


def signature_of(fn: Callable[..., Any]) -> Signature:
    """``fn``'s parameters as ``bind`` reads them."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return Signature(legacy=True)
    positional_only: list[str] = []
    named: list[str] = []
    required: set[str] = set()
    context: set[str] = set()
    var_keyword = False
    for name, param in sig.parameters.items():
        if param.kind is param.VAR_POSITIONAL:
            if not sig.parameters or all(
                p.kind is p.VAR_POSITIONAL or p.kind is p.VAR_KEYWORD
                for p in sig.parameters.values()
            ):
                return Signature(legacy=True)
            continue
        if param.kind is param.VAR_KEYWORD:
            var_keyword = True
            continue
        (positional_only if param.kind is param.POSITIONAL_ONLY else named).append(name)
        if param.default is param.empty:
            required.add(name)
        if name == _CTX or _is_context(param.annotation):
            context.add(name)
    params = positional_only + named
    if not context and len(params) == 2 and params[1] not in _keyword_only(sig):
        # The classic ``f(img, context)``, whatever its second parameter is called.
        context.add(params[1])
    return Signature(
        tuple(positional_only), tuple(named), frozenset(required), frozenset(context), var_keyword
    )


def _keyword_only(sig: inspect.Signature) -> set[str]:
    return {n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}


def _is_context(annotation: Any) -> bool:
    # ``from __future__ import annotations`` leaves the annotation a string.
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return name == "TaskContext"


def bind(
    sig: Signature,
    inputs: Mapping[str, Any],
    ctx: Any,
    *,
    task: str,
    needs_image: bool,
    chain: bool = True,
) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments that call a function of ``sig`` with ``inputs``
    and ``ctx``. ``chain``: the step reads the single-image chain's ``image`` (it names no
    inputs), which a run started without an image does not have."""
    if sig.legacy:
        return [_image_or_none(inputs, task, needs_image), ctx], {}
    values: dict[str, Any] = {}
    left = dict(inputs)
    for name in sig.parameters:
        if name in sig.context:
            values[name] = ctx
        elif name in left:
            values[name] = left.pop(name)
    first = sig.first
    if first is not None and first not in values and IMAGE not in sig.parameters:
        if IMAGE in left:
            values[first] = left.pop(IMAGE)
        elif chain:
            values[first] = _image_or_none({}, task, needs_image)
    if sig.var_keyword:
        values.update(left)
        left = {}
    problems = [
        f"the step gives input {name!r}, which {task!r} has no parameter for" for name in left
    ]
    problems += [
        f"{task!r} needs parameter {name!r}, which no input of the step names"
        for name in sig.parameters
        if name in sig.required and name not in values
    ]
    if problems:
        given = ", ".join(sorted(inputs)) or "none"
        raise InputsMismatch(
            f"{'; '.join(problems)} (the step's inputs: {given}); name the step's inputs "
            "after the function's parameters"
        )
    args = [values.pop(name) for name in sig.positional_only if name in values]
    return args, values


def _image_or_none(inputs: Mapping[str, Any], task: str, needs_image: bool) -> Any:
    if IMAGE in inputs:
        return inputs[IMAGE]
    if needs_image:
        raise NeedsImage(
            f"task {task!r} needs an input image, but the workflow was started without one; "
            "start it with input.image = 's3://bucket/key', or use tasks registered with "
            "@task(needs_image=False)"
        )
    return None


@dataclass
class Produced:
    """What a task's return value yields: named data (images, arrays, bytes, JSON too large
    to inline, and lists of them) and the step's JSON output."""

    objects: dict[str, Any] = field(default_factory=dict)  # name -> value, or list of values
    output: dict[str, Any] = field(default_factory=dict)

    @property
    def image(self) -> Image.Image | None:
        value = self.objects.get(IMAGE)
        return value if isinstance(value, Image.Image) else None


def produced_from(result: Any, task: str) -> Produced:
    """Read a task's return value (``TaskResult`` is duck-typed: this module sits below the
    one that defines it); ``InvalidTaskResult`` for one the runner cannot use."""
    produced = Produced()
    if result is None:
        return produced
    if isinstance(result, Image.Image):
        produced.objects[IMAGE] = _checked_image(result, task, IMAGE)
        return produced
    if isinstance(result, Mapping):
        _add_named(produced, result, task)
        return produced
    if hasattr(result, "outputs") and hasattr(result, "output") and hasattr(result, "image"):
        if result.image is not None:
            produced.objects[IMAGE] = _checked_image(result.image, task, IMAGE)
        produced.output = _checked_output(result.output, task)
        if result.outputs is not None:
            if not isinstance(result.outputs, Mapping):
                raise InvalidTaskResult(
                    f"task {task!r} returned TaskResult.outputs that is not a dict"
                )
            if IMAGE in result.outputs and result.image is not None:
                raise InvalidTaskResult(
                    f"task {task!r} returned an image both as TaskResult.image and in outputs"
                )
            _add_named(produced, result.outputs, task)
        return produced
    raise InvalidTaskResult(
        f"task {task!r} returned {type(result).__name__}; return None, a PIL image, a dict of "
        "named outputs or a TaskResult"
    )


def _add_named(produced: Produced, named: Mapping[Any, Any], task: str) -> None:
    for name, value in named.items():
        if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
            raise InvalidTaskResult(
                f"task {task!r} returned an output named {name!r}; output names are 1-64 "
                "letters, digits, '_' or '-', starting with a letter"
            )
        if name in produced.output or name in produced.objects:
            raise InvalidTaskResult(f"task {task!r} returned output {name!r} twice")
        _add_value(produced, name, value, task)


def _add_value(produced: Produced, name: str, value: Any, task: str) -> None:
    if isinstance(value, list | tuple):
        kinds = [_kind(v, task, name) for v in value]
        if any(k is not Kind.JSON for k in kinds):
            produced.objects[name] = [
                _checked_image(v, task, name) if k is Kind.IMAGE else v
                for v, k in zip(value, kinds, strict=True)
            ]
            return
        value = list(value)
    kind = _kind(value, task, name)
    if kind is Kind.IMAGE:
        produced.objects[name] = _checked_image(value, task, name)
    elif kind is not Kind.JSON or len(_json(value, task, name)) > INLINE_LIMIT:
        produced.objects[name] = value
    else:
        produced.output[name] = value


def _kind(value: Any, task: str, name: str) -> Kind:
    try:
        return kind_of(value)
    except InvalidData as exc:
        raise InvalidTaskResult(f"task {task!r} returned output {name!r}: {exc}") from exc


def _json(value: Any, task: str, name: str) -> bytes:
    try:
        return json_bytes(value)
    except InvalidData as exc:
        raise InvalidTaskResult(f"task {task!r} returned output {name!r}: {exc}") from exc


def _checked_image(img: Any, task: str, name: str) -> Image.Image:
    if not isinstance(img, Image.Image):
        raise InvalidTaskResult(
            f"task {task!r} returned {name!r} of type {type(img).__name__}; expected a PIL image"
        )
    try:
        checked = normalize_mode(img)
        required_size(checked.width, checked.height, checked.mode)
    except ValueError as exc:
        raise InvalidTaskResult(
            f"task {task!r} returned an unusable image {name!r}: {exc}"
        ) from exc
    return checked


def _checked_output(output: Any, task: str) -> dict[str, Any]:
    if not isinstance(output, dict) or not all(isinstance(k, str) for k in output):
        raise InvalidTaskResult(
            f"task {task!r} returned an output that is not a dict with string keys"
        )
    try:
        json.dumps(output, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidTaskResult(
            f"task {task!r} returned an output that is not JSON-serialisable: {exc}"
        ) from exc
    return dict(output)
