"""The synthetic sample images: size targets, reproducibility and the committed demo files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from workflows.imagebuf import decode_bytes
from workflows.samples import (
    BUNDLED_LABELS,
    SIZE_TARGETS,
    bundled_samples,
    make_bundled_samples,
    make_sample_images,
)
from workflows.samples.__main__ import main
from workflows.samples.generate import SCENES, render_scene


def test_size_targets_within_30_percent(tmp_path: Path) -> None:
    paths = make_sample_images(tmp_path, seed=1)
    assert set(paths) == set(SIZE_TARGETS)
    for name, path in paths.items():
        size = path.stat().st_size
        assert 0.7 * SIZE_TARGETS[name] <= size <= 1.3 * SIZE_TARGETS[name], (name, size)
        img = decode_bytes(path.read_bytes())
        assert img.mode == "RGB"
        # Photo-like compression: about 0.3 bytes per pixel at quality 85.
        assert 0.2 <= size / (img.width * img.height) <= 0.45


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = make_sample_images(tmp_path / "a", seed=5, sizes=["10k", "100k"])
    b = make_sample_images(tmp_path / "b", seed=5, sizes=["10k", "100k"])
    c = make_sample_images(tmp_path / "c", seed=6, sizes=["10k"])
    assert a["10k"].read_bytes() == b["10k"].read_bytes()
    assert a["100k"].read_bytes() == b["100k"].read_bytes()
    assert a["10k"].read_bytes() != c["10k"].read_bytes()


def test_samples_are_not_flat() -> None:
    img = np.asarray(render_scene(120, 80, SCENES["landscape"], seed=0), dtype=np.float64)
    assert img.std() > 20  # not a flat colour
    rows = np.abs(np.diff(img, axis=1)).mean()
    assert rows > 3  # detail at the pixel scale, as in a photo


def test_unknown_size_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'1g'"):
        make_sample_images(tmp_path, sizes=["1g"])


def test_render_refuses_tiny_images() -> None:
    with pytest.raises(ValueError, match="8x8"):
        render_scene(4, 4, SCENES["landscape"], seed=0)


@pytest.mark.parametrize("filename", sorted(BUNDLED_LABELS))
def test_bundled_files_are_committed_and_small(filename: str) -> None:
    path = bundled_samples()[filename]
    assert path.is_file() and path.stat().st_size <= 60_000
    with Image.open(path) as img:
        assert img.format == "JPEG"


def test_bundled_generator_reproduces_committed_images(tmp_path: Path) -> None:
    fresh = make_bundled_samples(tmp_path)
    for name, path in bundled_samples().items():
        new = np.asarray(decode_bytes(fresh[name].read_bytes()), dtype=np.int16)
        old = np.asarray(decode_bytes(path.read_bytes()), dtype=np.int16)
        # Bytes may differ across libjpeg builds; the pictures may not.
        assert new.shape == old.shape and np.abs(new - old).mean() < 1.0


def test_cli_writes_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "--seed", "3"]) == 0
    assert (tmp_path / "sample_10k.jpg").is_file()
    assert "sample_2m.jpg" in capsys.readouterr().out
