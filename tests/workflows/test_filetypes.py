"""What a file is, from its bytes alone: the type an upload and a stored result are given."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from workflows.ar.sample import SampleVideo, make_sample_video
from workflows.errors import InvalidData
from workflows.filetypes import FileType, detect, extension_for, matches
from workflows.kinds import Kind, encode_file


def _image(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (10, 200, 30)).save(out, fmt)
    return out.getvalue()


def _npy(value: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, value, allow_pickle=True)
    return out.getvalue()


@pytest.mark.parametrize(
    ("data", "filename", "expected"),
    [
        (_image("JPEG"), None, FileType("image/jpeg", ".jpg")),
        (_image("PNG"), "photo.mp4", FileType("image/png", ".png")),  # the name says nothing
        (_image("WEBP"), None, FileType("image/webp", ".webp")),
        (_image("BMP"), None, FileType("image/bmp", ".bmp")),
        (_image("TIFF"), None, FileType("image/tiff", ".tiff")),
        (_npy(np.arange(6, dtype=np.int16).reshape(2, 3)), None,
         FileType("application/x-npy", ".npy")),
        (b' \n{"a": [1, 2.5, null]}', None, FileType("application/json", ".json")),
        (b"a,b\n1,2\n", "table.csv", FileType("text/csv", ".csv")),
        ("plain words, é\n".encode(), "notes.exe", FileType("text/plain", ".txt")),
        (b"<html><body>hi</body></html>", "page.txt", FileType("text/html", ".html")),
        (b"", None, FileType("application/octet-stream", ".bin")),
        (b"\x00\x01\x02" * 100, "clip.mp4", FileType("application/octet-stream", ".bin")),
    ],
)  # fmt: skip
def test_the_bytes_decide_what_a_file_is(
    data: bytes, filename: str | None, expected: FileType
) -> None:
    assert detect(data, filename) == expected


def test_a_video_is_told_by_its_container(tmp_path: Path) -> None:
    video = make_sample_video(tmp_path / "v.mp4", SampleVideo(width=96, height=64, frames=3))
    assert detect(video.read_bytes()) == FileType("video/mp4", ".mp4")


def test_random_bytes_are_raw_bytes_not_a_guess() -> None:
    """Two-byte signatures match random data now and then; they do not count."""
    rng = np.random.default_rng(7)
    found = {detect(rng.bytes(4096)).content_type for _ in range(2000)}
    assert found == {"application/octet-stream"}


def test_an_npy_that_needs_pickle_or_has_a_broken_header_is_refused() -> None:
    with pytest.raises(InvalidData, match="holds Python objects"):
        detect(_npy(np.array([{}, None], dtype=object)))
    with pytest.raises(InvalidData, match="header NumPy cannot read"):
        detect(b"\x93NUMPY\x01\x00" + os.urandom(40))


def test_a_stored_bytes_result_is_typed_by_its_content(tmp_path: Path) -> None:
    video = make_sample_video(tmp_path / "v.mp4", SampleVideo(width=96, height=64, frames=3))
    data, filetype = encode_file(video.read_bytes(), Kind.BYTES)
    assert filetype == FileType("video/mp4", ".mp4") and data == video.read_bytes()
    assert encode_file(np.ones(3), Kind.ARRAY)[1] == FileType("application/x-npy", ".npy")
    # Bytes that look like a .npy NumPy refuses are still bytes.
    fake = _npy(np.array([{}], dtype=object))
    assert encode_file(fake, Kind.BYTES)[1] == FileType("application/octet-stream", ".bin")


def test_patterns_match_whole_types_and_wildcards() -> None:
    assert matches("video/mp4", ["video/*"]) and matches("video/mp4", ["*/*"])
    assert matches("video/mp4", ["image/png", "video/mp4"])
    assert not matches("video/mp4", ["video/webm", "image/*"])
    assert extension_for("video/mp4") == ".mp4" and extension_for("x/unknown") == ".bin"
