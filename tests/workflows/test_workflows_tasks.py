"""The bundled tasks against the Pillow operations they wrap, and the classify rule."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PIL import Image, ImageFilter

from workflows.api import TaskContext, load_task, registered_tasks, run_task
from workflows.definitions import bundled_task_definitions
from workflows.errors import TaskFailed
from workflows.image_tasks import classify, classify_stats, reference_pipeline
from workflows.imagebuf import decode_bytes, read_image, required_size, write_image
from workflows.samples import BUNDLED_LABELS, bundled_samples


def photo(mode: str = "RGB", size: tuple[int, int] = (48, 32)) -> Image.Image:
    """Structured random content, so sharpening and blurring both change pixels."""
    rng = np.random.default_rng(3)
    channels = len(mode)
    base = rng.integers(0, 256, (size[1] // 4, size[0] // 4, channels), dtype=np.uint8)
    img = Image.fromarray(base.squeeze(-1) if channels == 1 else base, mode)
    return img.resize(size, Image.Resampling.BILINEAR)


def in_buffer(img: Image.Image) -> memoryview:
    buf = memoryview(bytearray(required_size(img.width, img.height, img.mode)))
    write_image(buf, img)
    return buf


def ctx(name: str, **params: object) -> TaskContext:
    return TaskContext(task_name=name, workflow_id="test", params=params)


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA"])
@pytest.mark.parametrize(
    ("name", "pillow_filter"),
    [
        ("deblur", ImageFilter.UnsharpMask(radius=2, percent=150, threshold=3)),
        ("denoise", ImageFilter.GaussianBlur(radius=1)),
    ],
)
def test_filter_task_equals_pillow(name: str, pillow_filter: ImageFilter.Filter, mode: str) -> None:
    img = photo(mode)
    buf = in_buffer(img)
    outcome = run_task(registered_tasks()[name], buf, ctx(name))
    expected = np.asarray(img.filter(pillow_filter))
    got = np.asarray(read_image(buf))
    assert outcome.image_written
    assert np.array_equal(got, expected)
    assert not np.array_equal(got, np.asarray(img))  # the filter did something


def test_classify_leaves_image_and_reports_stats() -> None:
    img = Image.new("RGB", (10, 10), (30, 90, 200))
    buf = in_buffer(img)
    before = bytes(buf)
    outcome = run_task(classify, buf, ctx("classify"))
    assert bytes(buf) == before and not outcome.image_written
    assert outcome.output == {
        "label": "blue",
        "brightness": round(0.299 * 30 + 0.587 * 90 + 0.114 * 200, 2),
        "mean_rgb": [30.0, 90.0, 200.0],
    }


@pytest.mark.parametrize(
    ("rgb", "label"),
    [
        ((50, 50, 50), "dark"),  # brightness 50 < 60
        ((60, 60, 60), "grey"),  # exactly 60 is not dark
        ((230, 230, 230), "bright"),
        ((200, 200, 200), "grey"),  # exactly 200 is not bright
        ((120, 125, 131), "grey"),  # spread 11 < 12
        ((100, 120, 132), "blue"),  # spread 32; B - max(R, G) = 12
        ((100, 120, 131), "mixed"),  # B - max(R, G) = 11: not blue; G - B < 8; R not largest
        ((80, 140, 90), "green"),  # G - max(R, B) = 50
        ((100, 108, 90), "green"),  # G - max(R, B) = 8 exactly
        ((180, 120, 80), "warm"),  # R largest, R - B = 100
        ((150, 140, 131), "mixed"),  # R largest but R - B = 19 < 20
        ((150, 90, 150), "mixed"),  # magenta: no rule
    ],
)
def test_classify_rule_each_branch(rgb: tuple[int, int, int], label: str) -> None:
    out = classify(Image.new("RGB", (4, 4), rgb), ctx("classify")).output
    assert out["label"] == label
    assert classify_stats((float(rgb[0]), float(rgb[1]), float(rgb[2])))[0] == label


def test_classify_greyscale_and_rgba() -> None:
    assert classify(Image.new("L", (4, 4), 30), ctx("c")).output["label"] == "dark"
    rgba = Image.new("RGBA", (4, 4), (80, 140, 90, 0))  # alpha is ignored
    assert classify(rgba, ctx("c")).output["mean_rgb"] == [80.0, 140.0, 90.0]


def docstring_rule(mean: np.typing.NDArray[np.float64]) -> str:
    """The rule exactly as classify's docstring states it, written independently."""
    r, g, b = (float(v) for v in mean)
    brightness = 0.299 * r + 0.587 * g + 0.114 * b
    if brightness < 60:
        return "dark"
    if brightness > 200:
        return "bright"
    if max(r, g, b) - min(r, g, b) < 12:
        return "grey"
    if b - max(r, g) >= 12:
        return "blue"
    if g - max(r, b) >= 8:
        return "green"
    if r == max(r, g, b) and r - b >= 20:
        return "warm"
    return "mixed"


@pytest.mark.parametrize("filename", sorted(BUNDLED_LABELS))
def test_bundled_samples_get_the_documented_labels(filename: str) -> None:
    img = decode_bytes(bundled_samples()[filename].read_bytes())
    mean = np.asarray(img, dtype=np.float64).reshape(-1, 3).mean(axis=0)
    label = classify(img, ctx("classify")).output["label"]
    assert label == docstring_rule(mean) == BUNDLED_LABELS[filename]
    assert reference_pipeline(img)[1] == label  # sharpen + blur keep the means


def test_noop_touches_nothing() -> None:
    buf = in_buffer(photo())
    before = bytes(buf)
    outcome = run_task(registered_tasks()["noop"], buf, ctx("noop"))
    assert bytes(buf) == before and not outcome.image_written and outcome.output == {}


def test_sleep_sleeps_for_ms() -> None:
    buf = in_buffer(photo())
    start = time.perf_counter()
    outcome = run_task(registered_tasks()["sleep"], buf, ctx("sleep", ms=30))
    assert time.perf_counter() - start >= 0.03 and not outcome.image_written


@pytest.mark.parametrize("ms", [-1, "10", float("nan"), True])
def test_sleep_rejects_bad_ms(ms: object) -> None:
    with pytest.raises(TaskFailed, match="param 'ms'"):
        run_task(registered_tasks()["sleep"], in_buffer(photo()), ctx("sleep", ms=ms))


def test_reference_pipeline_matches_manual_chain() -> None:
    img = photo()
    expected = img.filter(ImageFilter.UnsharpMask(radius=2, percent=150, threshold=3))
    expected = expected.filter(ImageFilter.GaussianBlur(radius=1))
    out, label = reference_pipeline(img)
    assert out.tobytes() == expected.tobytes()
    assert label == classify(expected, ctx("classify")).output["label"]


def test_reference_pipeline_normalises_mode() -> None:
    out, _ = reference_pipeline(photo().convert("P"))
    assert out.mode == "RGB"


def test_bundled_task_definitions_match_the_registry() -> None:
    """Each definition's module registers the task as defined (loaded here by its path, as a
    worker does, not left to whichever test imported it first)."""
    for definition in bundled_task_definitions():
        spec = load_task(definition["module"])
        assert spec.name == definition["name"]
        assert spec.to_definition() == definition
