"""Named inputs and outputs of any kind: how a task is called and what its return yields,
and how each kind of datum is laid out in an object and stored as a file."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image

from workflows.api import TaskContext, TaskResult, run_task_on_image, run_task_with_inputs, task
from workflows.errors import InputsMismatch, InvalidData, InvalidTaskResult, NeedsImage
from workflows.kinds import (
    CODECS,
    INLINE_LIMIT,
    Kind,
    decode_file,
    encode_file,
    kind_of,
    read_value,
    size_of,
    write_value,
)

CTX = TaskContext("t", workflow_id="wf")
ROT = Image.Transpose.ROTATE_90


def image(color: tuple[int, int, int] = (10, 20, 30)) -> Image.Image:
    return Image.new("RGB", (8, 6), color)


# --- calling ------------------------------------------------------------------------------


def test_inputs_go_to_parameters_by_name_and_ctx_to_ctx() -> None:
    seen: dict[str, Any] = {}

    def join(left: Image.Image, right: Image.Image, ctx: TaskContext) -> None:
        seen.update(left=left, right=right, ctx=ctx)

    a, b = image(), image((1, 2, 3))
    run_task_with_inputs(join, {"right": b, "left": a}, CTX, chain=False)
    assert seen == {"left": a, "right": b, "ctx": CTX}


def test_the_classic_signature_gets_the_chain_image_whatever_its_names() -> None:
    img = image()
    for fn in (
        lambda img, ctx: img.transpose(ROT),
        lambda picture, context: picture.transpose(ROT),
    ):
        new, output = run_task_on_image(fn, img, CTX)
        assert new is not None and new.size == (6, 8) and output == {}


def test_an_image_input_goes_to_the_parameter_called_image_when_there_is_one() -> None:
    def f(mask: Any, image: Image.Image, ctx: TaskContext) -> dict[str, Any]:
        return {"size": list(image.size), "mask": mask}

    produced = run_task_with_inputs(f, {"image": image(), "mask": 3}, CTX, chain=False)
    assert produced.output == {"size": [8, 6], "mask": 3}


def test_a_dataless_chain_step_gets_none_only_when_the_task_allows_it() -> None:
    @task(name="needs_nothing", needs_image=False)
    def needs_nothing(img: Image.Image | None, ctx: TaskContext) -> dict[str, Any]:
        return {"got": img}

    @task(name="needs_pixels")
    def needs_pixels(img: Image.Image, ctx: TaskContext) -> None:
        return None

    spec = needs_nothing.__cdiflow_task__  # type: ignore[attr-defined]
    assert run_task_with_inputs(spec, {}, CTX).output == {"got": None}
    with pytest.raises(NeedsImage):
        run_task_with_inputs(needs_pixels.__cdiflow_task__, {}, CTX)  # type: ignore[attr-defined]


def test_inputs_that_do_not_fit_the_function_are_refused_with_both_sides() -> None:
    def f(frame: Any, ctx: TaskContext) -> None:
        return None

    with pytest.raises(InputsMismatch) as info:
        run_task_with_inputs(f, {"frames": 1}, CTX, chain=False)
    message = str(info.value)
    assert "input 'frames'" in message and "parameter 'frame'" in message
    # **kwargs takes what no parameter names.
    produced = run_task_with_inputs(lambda ctx, **rest: rest, {"a": 1, "b": [2]}, CTX)
    assert produced.output == {"a": 1, "b": [2]}


# --- returning ----------------------------------------------------------------------------


def test_a_returned_dict_makes_named_outputs_of_each_kind() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    big = list(range(INLINE_LIMIT))  # more than INLINE_LIMIT bytes of JSON

    def f(ctx: TaskContext) -> dict[str, Any]:
        return {"img": image(), "arr": arr, "raw": b"\x00\x01", "n": 3, "big": big,
                "tiles": [image(), image()], "labels": ["a", "b"]}  # fmt: skip

    produced = run_task_with_inputs(f, {}, CTX, chain=False)
    assert produced.output == {"n": 3, "labels": ["a", "b"]}  # small JSON travels inline
    assert set(produced.objects) == {"img", "arr", "raw", "big", "tiles"}
    assert produced.objects["arr"] is arr and len(produced.objects["tiles"]) == 2


def test_task_result_carries_image_output_and_outputs_together() -> None:
    produced = run_task_with_inputs(
        lambda img, ctx: TaskResult(image=img, output={"k": 1}, outputs={"m": np.zeros(2)}),
        {"image": image()},
        CTX,
    )
    assert produced.image is not None and produced.output == {"k": 1}
    assert set(produced.objects) == {"image", "m"}


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        ({"bad name": 1}, "output names are"),
        ({"x": object()}, "none of image, NumPy array, bytes or JSON"),
        ({"x": np.array([object()])}, "holds Python objects"),
        (TaskResult(image=image(), outputs={"image": image()}), "both as TaskResult.image"),
        (TaskResult(output={"x": 1}, outputs={"x": 2}), "returned output 'x' twice"),
        (42, "return None, a PIL image, a dict"),
    ],
)
def test_unusable_returns_are_refused(result: Any, fragment: str) -> None:
    with pytest.raises(InvalidTaskResult) as info:
        run_task_with_inputs(lambda ctx: result, {}, CTX, chain=False)
    assert fragment in str(info.value)


def test_the_image_only_runner_refuses_other_named_outputs() -> None:
    with pytest.raises(InvalidTaskResult, match="named outputs"):
        run_task_on_image(lambda img, ctx: {"arr": np.zeros(3)}, image(), CTX)


# --- kinds --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        np.arange(24, dtype=np.int16).reshape(2, 3, 4),
        np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        np.arange(20)[::3],  # not contiguous
        np.zeros((0, 5), dtype=np.uint8),
        np.array(["ab", "cde"]),
    ],
)
def test_an_array_is_mapped_back_read_only_and_identical(value: np.ndarray[Any, Any]) -> None:
    assert kind_of(value) is Kind.ARRAY
    buf = bytearray(size_of(value, Kind.ARRAY))
    assert write_value(memoryview(buf), value, Kind.ARRAY) == len(buf)
    back = read_value(memoryview(buf), Kind.ARRAY)
    assert back.dtype == value.dtype and np.array_equal(back, value)
    assert not back.flags.writeable
    data, _ = encode_file(value, Kind.ARRAY)
    assert data == bytes(buf) or np.array_equal(decode_file(data, Kind.ARRAY), value)


def test_every_kind_has_its_codec() -> None:
    assert set(CODECS) == set(Kind)


@pytest.mark.parametrize(
    ("value", "kind"),
    [(b"\x00raw\xff", Kind.BYTES), ({"a": [1, 2.5, None]}, Kind.JSON), (image(), Kind.IMAGE)],
)
def test_each_kind_round_trips_through_an_object_and_a_file(value: Any, kind: Kind) -> None:
    assert kind_of(value) is kind
    buf = bytearray(size_of(value, kind))
    write_value(memoryview(buf), value, kind)
    back = read_value(memoryview(buf), kind)
    data, _mime = encode_file(value, kind)
    from_file = decode_file(data, kind)
    if kind is Kind.IMAGE:
        assert back.tobytes() == value.tobytes() == from_file.tobytes()
    else:
        assert bytes(back) == value if kind is Kind.BYTES else back == value
        assert from_file == value


def test_objects_that_do_not_hold_their_kind_are_refused() -> None:
    with pytest.raises(InvalidData):
        read_value(memoryview(b"not an npy"), Kind.ARRAY)
    with pytest.raises(InvalidData):
        read_value(memoryview(b"{not json"), Kind.JSON)
    short = bytearray(size_of(np.zeros(8), Kind.ARRAY))
    write_value(memoryview(short), np.zeros(8), Kind.ARRAY)
    with pytest.raises(InvalidData, match="too short"):
        read_value(memoryview(short)[:-8], Kind.ARRAY)
