"""The task API: registration, loading user tasks, running on a buffer, the error tree."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from workflows import api
from workflows.api import (
    TaskContext,
    TaskResult,
    TaskSpec,
    load_task,
    registered_tasks,
    run_task,
    run_task_on_image,
    task,
)
from workflows.errors import (
    DuplicateTask,
    InvalidData,
    InvalidDefinition,
    InvalidImage,
    InvalidTaskResult,
    ResultTooLarge,
    TaskFailed,
    TaskLoadError,
    TaskNotAllowed,
    TaskNotFound,
    WorkflowsError,
    error_from_code,
)
from workflows.imagebuf import read_header, read_image, required_size, write_image
from workflows.sources import TaskSources


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tasks registered by a test vanish after it."""
    registered_tasks()  # bundled tasks in, before the snapshot
    monkeypatch.setattr(api, "_REGISTRY", dict(api._REGISTRY))
    yield


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for throw-away user task packages (removed from sys.modules)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def write_module(root: Path, dotted: str, source: str) -> None:
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        pkg = root.joinpath(*parts[:i])
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").touch()
    root.joinpath(*parts[:-1], parts[-1] + ".py").write_text(textwrap.dedent(source))


def image_buffer(img: Image.Image, extra: int = 0) -> memoryview:
    buf = memoryview(bytearray(required_size(img.width, img.height, img.mode) + extra))
    write_image(buf, img)
    return buf


def gradient(size: tuple[int, int] = (32, 24)) -> Image.Image:
    return Image.linear_gradient("L").resize(size).convert("RGB")


CTX = TaskContext(task_name="t", workflow_id="wf-1")


# --- TaskContext ----------------------------------------------------------------------------


def test_context_params_are_a_read_only_copy() -> None:
    params = {"ms": 5}
    ctx = TaskContext("sleep", "wf", params=params)
    params["ms"] = 99
    assert ctx.params["ms"] == 5
    with pytest.raises(TypeError):
        ctx.params["ms"] = 1  # type: ignore[index]


def test_context_logger_carries_run_fields(caplog: pytest.LogCaptureFixture) -> None:
    ctx = TaskContext("deblur", "wf-7", attempt=2)
    with caplog.at_level(logging.INFO, logger="workflows.task.deblur"):
        ctx.logger.info("hello")
    record = caplog.records[-1]
    assert (record.workflow_id, record.task, record.attempt) == ("wf-7", "deblur", 2)  # type: ignore[attr-defined]


# --- registration ---------------------------------------------------------------------------


def test_bundled_tasks_are_registered() -> None:
    names = set(registered_tasks())
    assert {"deblur", "denoise", "classify", "noop", "sleep"} <= names
    spec = registered_tasks()["deblur"]
    assert (spec.timeout_s, spec.retries, spec.module) == (30, 2, "workflows.image_tasks:deblur")


def test_decorator_registers_and_keeps_function_callable() -> None:
    @task(name="double-size", timeout_s=5, retries=1)
    def double(img: Image.Image, ctx: TaskContext) -> Image.Image:
        return img.resize((img.width * 2, img.height * 2))

    spec = load_task("double-size")
    assert spec.fn is double and spec.timeout_s == 5 and spec.retries == 1
    assert double(gradient((2, 2)), CTX).size == (4, 4)


def test_bare_decorator_uses_function_name() -> None:
    @task
    def shrink(img: Image.Image, ctx: TaskContext) -> None:
        return None

    assert load_task("shrink").name == "shrink"


def test_duplicate_name_from_another_function_is_refused() -> None:
    def other(img: Image.Image, ctx: TaskContext) -> None:
        return None

    with pytest.raises(DuplicateTask, match="'deblur' is already registered"):
        task(name="deblur")(other)


def test_bad_task_settings_are_refused() -> None:
    def fn(img: Image.Image, ctx: TaskContext) -> None:
        return None

    with pytest.raises(InvalidDefinition) as info:
        task(name="9lives", timeout_s=0, retries=-1)(fn)
    assert len(info.value.problems) == 3


# --- load_task ----------------------------------------------------------------------------------


def test_load_registered_name() -> None:
    assert load_task("classify").module == "workflows.image_tasks:classify"


def test_load_bundled_task_by_module_path() -> None:
    assert load_task("workflows.image_tasks:denoise") is registered_tasks()["denoise"]


def test_unknown_name_lists_registered_tasks() -> None:
    with pytest.raises(TaskNotFound, match=r"registered: .*deblur") as info:
        load_task("sharpen")
    assert isinstance(info.value, LookupError)


def test_load_user_task_by_module_path(user_modules: Path) -> None:
    write_module(
        user_modules,
        "acme.tasks",
        """
        from workflows.api import task

        @task(name="acme-invert", timeout_s=7, retries=3)
        def invert(img, ctx):
            return img.point(lambda v: 255 - v)

        def plain(img, ctx):
            return None
        """,
    )
    deployed = TaskSources(paths=(user_modules,))
    spec = load_task("acme.tasks:invert", deployed)
    assert (spec.name, spec.timeout_s, spec.retries) == ("acme-invert", 7, 3)
    assert load_task("acme-invert") is spec  # importing registered it by name too
    with pytest.raises(TaskNotAllowed, match="function without @task"):
        load_task("acme.tasks:plain", deployed)  # undecorated: not a task
    with pytest.raises(TaskNotAllowed, match="not in a package tasks may come from"):
        load_task("acme.tasks:invert")  # the folder is not deployed for the default sources


def test_missing_module(user_modules: Path) -> None:
    with pytest.raises(TaskNotFound, match="no module named 'nosuchpkg'"):
        load_task("nosuchpkg.tasks:fn", TaskSources(packages=("nosuchpkg",)))


def test_missing_attribute(user_modules: Path) -> None:
    write_module(user_modules, "acme2.tasks", "def real(img, ctx):\n    return None\n")
    with pytest.raises(TaskNotFound, match="has no attribute 'fake'"):
        load_task("acme2.tasks:fake", TaskSources(paths=(user_modules,)))


def test_module_that_raises_on_import(user_modules: Path) -> None:
    write_module(user_modules, "acme3", "raise RuntimeError('boom at import')\n")
    with pytest.raises(TaskLoadError, match="RuntimeError: boom at import") as info:
        load_task("acme3:fn", TaskSources(paths=(user_modules,)))
    assert not isinstance(info.value, TaskNotFound)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_module_with_missing_dependency(user_modules: Path) -> None:
    write_module(user_modules, "acme4", "import not_installed_dep\n")
    with pytest.raises(TaskLoadError, match="not_installed_dep") as info:
        load_task("acme4:fn", TaskSources(paths=(user_modules,)))
    assert not isinstance(info.value, TaskNotFound)  # the module exists; its dependency doesn't


def test_attribute_that_is_not_callable(user_modules: Path) -> None:
    write_module(user_modules, "acme5", "SETTING = 3\n")
    with pytest.raises(TaskNotAllowed, match="is a int without @task"):
        load_task("acme5:SETTING", TaskSources(paths=(user_modules,)))


@pytest.mark.parametrize("path", ["pkg.mod:", ":fn", "pkg mod:fn", "a:b:c", "pkg..mod:fn"])
def test_malformed_module_path(path: str) -> None:
    with pytest.raises(TaskNotFound, match=r"package\.module:function"):
        load_task(path)


# --- run_task_on_image / run_task -----------------------------------------------------------


def test_run_task_writes_back_in_place() -> None:
    def invert(img: Image.Image, ctx: TaskContext) -> TaskResult:
        return TaskResult(image=img.point(lambda v: 255 - v), output={"done": True})

    img = gradient()
    buf = image_buffer(img)
    raw = buf.obj
    outcome = run_task(invert, buf, CTX)
    assert buf.obj is raw  # the same memory, not a new buffer
    assert read_image(buf).tobytes() == img.point(lambda v: 255 - v).tobytes()
    assert outcome.image_written and outcome.output == {"done": True}
    assert outcome.bytes_used == required_size(32, 24, "RGB")
    assert min(outcome.read_s, outcome.compute_s, outcome.write_s) >= 0


def test_run_task_with_no_image_leaves_the_buffer_untouched() -> None:
    buf = image_buffer(gradient(), extra=16)
    before = bytes(buf)
    outcome = run_task(lambda img, ctx: TaskResult(output={"n": 1}), buf, CTX)
    assert bytes(buf) == before and not outcome.image_written
    assert outcome.header == read_header(buf) and outcome.output == {"n": 1}


def test_smaller_result_updates_header() -> None:
    buf = image_buffer(gradient())
    outcome = run_task(lambda img, ctx: img.crop((0, 0, 10, 5)).convert("L"), buf, CTX)
    assert read_header(buf).width == 10 and read_header(buf).mode == "L"
    assert outcome.bytes_used == required_size(10, 5, "L")


def test_mutated_and_returned_input_is_written_back() -> None:
    def paint(img: Image.Image, ctx: TaskContext) -> Image.Image:
        img.putpixel((0, 0), (9, 9, 9))
        return img

    buf = image_buffer(gradient())
    run_task(paint, buf, CTX)
    assert read_image(buf).getpixel((0, 0)) == (9, 9, 9)


def test_result_too_large_keeps_result_for_a_retried_write() -> None:
    def grow(img: Image.Image, ctx: TaskContext) -> TaskResult:
        return TaskResult(image=img.resize((64, 48)), output={"k": "v"})

    buf = image_buffer(gradient())
    before = bytes(buf)
    with pytest.raises(ResultTooLarge) as info:
        run_task(grow, buf, CTX)
    err = info.value
    assert err.needed == required_size(64, 48, "RGB") and err.available == len(buf)
    assert bytes(buf) == before  # the input survives
    assert err.output == {"k": "v"} and err.image is not None
    bigger = memoryview(bytearray(err.needed))
    write_image(bigger, err.image)
    assert read_header(bigger).width == 64


def test_run_task_on_image_separates_compute_from_write() -> None:
    new, _ = run_task_on_image(lambda img, ctx: img.convert("P"), gradient(), CTX)
    assert new is not None and new.mode == "RGB"  # already storable
    assert run_task_on_image(lambda img, ctx: None, gradient(), CTX) == (None, {})


def test_run_task_accepts_a_spec() -> None:
    buf = image_buffer(gradient())
    spec = load_task("denoise")
    assert isinstance(spec, TaskSpec)
    assert run_task(spec, buf, TaskContext("denoise")).image_written


def test_raising_task_becomes_task_failed() -> None:
    def broken(img: Image.Image, ctx: TaskContext) -> None:
        raise KeyError("missing thing")

    ctx = TaskContext("broken", "wf-9", attempt=3)
    with pytest.raises(TaskFailed, match=r"'broken' .*wf-9.*attempt 3.*KeyError") as info:
        run_task(broken, image_buffer(gradient()), ctx)
    assert info.value.attempt == 3 and info.value.task == "broken"
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ("a string", "returned str"),
        (TaskResult(output={"x": object()}), "not JSON"),
        (TaskResult(output={"x": float("nan")}), "not JSON"),
        (TaskResult(output={1: "x"}), "string keys"),  # type: ignore[dict-item]
        (TaskResult(output=["x"]), "string keys"),  # type: ignore[arg-type]
        (TaskResult(image=np.zeros((2, 2))), "expected a PIL image"),  # type: ignore[arg-type]
        (Image.new("RGB", (0, 0)), "unusable image"),
    ],
)
def test_unusable_results(result: Any, message: str) -> None:
    with pytest.raises(InvalidTaskResult, match=message):
        run_task_on_image(lambda img, ctx: result, gradient(), CTX)


def test_bad_buffer_is_invalid_image_before_the_task_runs() -> None:
    called: list[bool] = []

    def fn(img: Image.Image, ctx: TaskContext) -> None:
        called.append(True)

    with pytest.raises(InvalidImage):
        run_task(fn, memoryview(bytearray(100)), CTX)
    assert not called


# --- the error tree --------------------------------------------------------------------------


def test_every_error_is_a_workflows_error() -> None:
    for cls in (InvalidImage, ResultTooLarge, InvalidDefinition, TaskNotFound, TaskFailed):
        assert issubclass(cls, WorkflowsError)
    assert issubclass(TaskNotFound, TaskLoadError)


def test_error_from_code() -> None:
    err = error_from_code("task_not_found", "no task 'x'")
    assert type(err) is TaskNotFound and str(err) == "no task 'x'"
    assert type(error_from_code("task_failed", "m")) is TaskFailed
    assert type(error_from_code("result_too_large", "m")) is WorkflowsError
    assert type(error_from_code("???", "m")) is WorkflowsError


def test_workflows_does_not_import_orchestrator_or_cdi() -> None:
    code = (
        "import sys, workflows.api, workflows.image_tasks, workflows.definitions, "
        "workflows.samples, workflows.imagebuf\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('orchestrator', 'cdi')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_read_file_outside_a_worker_says_it_needs_one() -> None:
    ctx = TaskContext("decode", params={})
    with pytest.raises(InvalidData, match="read_file works inside a worker"):
        ctx.read_file("s3://bucket/video.mp4")
    read: list[str] = []

    def files(uri: str) -> bytes:
        read.append(uri)
        return b"bytes"

    given = TaskContext("decode", files=files)
    assert given.read_file("s3://bucket/video.mp4") == b"bytes"
    assert read == ["s3://bucket/video.mp4"]


def test_an_on_cancel_callback_is_called_once_however_the_stop_and_its_registration_meet() -> None:
    """Registered while the worker stops the task, a callback goes either to the worker's
    list or back to its registrant, never to both: over many races, each runs once."""
    for _ in range(300):
        ctx = TaskContext("t")
        calls: list[int] = []
        go = threading.Barrier(2)

        def register(
            ctx: TaskContext = ctx, calls: list[int] = calls, go: threading.Barrier = go
        ) -> None:
            go.wait()
            ctx.on_cancel(lambda: calls.append(1))

        registrant = threading.Thread(target=register)
        registrant.start()
        go.wait()
        ctx.cancelled.set()
        for callback in ctx.take_cancel_callbacks():
            callback()
        registrant.join()
        assert calls == [1]
    late = TaskContext("t")
    late.take_cancel_callbacks()
    called: list[str] = []
    late.on_cancel(lambda: called.append("now"))
    assert called == ["now"] and late.take_cancel_callbacks() == []
