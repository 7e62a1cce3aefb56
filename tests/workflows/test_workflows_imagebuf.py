"""The buffer layout, its header validation, and decode/encode of image files."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from workflows.errors import InvalidImage, ResultTooLarge
from workflows.imagebuf import (
    HEADER_SIZE,
    MAGIC,
    RESULT_FORMATS,
    ImageHeader,
    decode_bytes,
    decode_into,
    decodes_in_place,
    encode_image,
    image_view,
    map_image,
    normalize_mode,
    open_image,
    read_header,
    read_image,
    required_size,
    write_image,
)


def random_image(mode: str, size: tuple[int, int] = (37, 23), seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    shape = (size[1], size[0]) if channels == 1 else (size[1], size[0], channels)
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)


def buffer_with(img: Image.Image, extra: int = 0) -> memoryview:
    buf = memoryview(bytearray(required_size(img.width, img.height, img.mode) + extra))
    write_image(buf, img)
    return buf


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` and whose pixel data is a stub."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    idat = zlib.compress(b"\0" * 16)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


# --- layout round trip ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA"])
def test_round_trip_each_mode(mode: str) -> None:
    img = random_image(mode)
    buf = memoryview(bytearray(required_size(img.width, img.height, mode) + 100))
    used = write_image(buf, img)
    assert used == HEADER_SIZE + img.width * img.height * {"L": 1, "RGB": 4, "RGBA": 4}[mode]
    assert read_header(buf) == ImageHeader(img.width, img.height, mode)
    back = read_image(buf)
    assert back.mode == mode and back.size == img.size
    assert back.tobytes() == img.tobytes()


def test_header_bytes_are_as_documented() -> None:
    buf = buffer_with(random_image("RGB", (5, 4)))
    assert bytes(buf[:8]) == MAGIC
    assert struct.unpack_from("<II4sQ", buf, 8) == (5, 4, b"RGB\0", 5 * 4 * 4)
    first = np.asarray(random_image("RGB", (5, 4)))[0, 0]
    assert list(buf[HEADER_SIZE : HEADER_SIZE + 3]) == first.tolist()  # then 1 padding byte
    assert HEADER_SIZE == 32


def test_read_image_is_a_copy_and_releases_the_buffer() -> None:
    raw = bytearray(required_size(8, 8, "L"))
    img = random_image("L", (8, 8))
    write_image(memoryview(raw), img)
    out = read_image(memoryview(raw))
    raw[HEADER_SIZE:] = bytes(64)  # a bytearray cannot resize while exported: none is left
    raw.extend(b"x")
    assert out.tobytes() == img.tobytes()


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA"])
def test_map_image_reads_in_place_and_pins_the_buffer(mode: str) -> None:
    img = random_image(mode)
    raw = bytearray(required_size(img.width, img.height, mode))
    write_image(memoryview(raw), img)
    mapped = map_image(memoryview(raw))
    assert mapped.mode == mode and mapped.size == img.size
    assert mapped.tobytes() == img.tobytes()
    _, arr = image_view(memoryview(raw))
    arr[0, 0] = 7  # a write into the buffer shows through the mapped image: no copy
    assert mapped.getpixel((0, 0)) in (7, (7, 7, 7), (7, 7, 7, 7))
    del arr
    with pytest.raises(BufferError):
        raw.extend(b"x")  # the mapped image holds the buffer exported
    mapped.paste(0, (0, 0, 2, 2))  # Pillow copies before changing a mapped image ...
    assert mapped.getpixel((1, 1)) in (0, (0, 0, 0), (0, 0, 0, 0))
    _, after = image_view(memoryview(raw))
    assert np.array_equal(after[1, 1], np.asarray(img)[1, 1])  # ... the buffer stays as it was
    del mapped, after
    raw.extend(b"x")  # released


def test_map_image_rejects_a_short_or_foreign_buffer() -> None:
    full = buffer_with(random_image("RGB"))
    with pytest.raises(InvalidImage, match="truncated or resized"):
        map_image(full[: len(full) - 1])
    with pytest.raises(InvalidImage, match="magic"):
        map_image(memoryview(bytearray(64)))


def test_image_view_is_zero_copy_and_writable() -> None:
    img = random_image("RGB")
    buf = buffer_with(img)
    header, arr = image_view(buf)
    assert header == ImageHeader(img.width, img.height, "RGB")
    assert arr.shape == (img.height, img.width, 3)
    assert np.array_equal(arr, np.asarray(img))
    arr[0, 0] = (1, 2, 3)
    assert read_image(buf).getpixel((0, 0)) == (1, 2, 3)
    _, grey = image_view(buffer_with(random_image("L")))
    assert grey.shape == (23, 37)
    del arr, grey


def test_image_view_of_read_only_buffer_is_read_only() -> None:
    data = bytes(buffer_with(random_image("L")))
    _, arr = image_view(memoryview(data))
    assert not arr.flags.writeable


def test_write_image_converts_other_modes() -> None:
    pal = random_image("RGB").convert("P")
    buf = memoryview(bytearray(required_size(pal.width, pal.height, "RGB")))
    write_image(buf, pal)
    assert read_header(buf).mode == "RGB"
    assert read_image(buf).tobytes() == pal.convert("RGB").tobytes()


def test_write_too_small_raises_and_leaves_buffer_untouched() -> None:
    small = random_image("L", (4, 4))
    buf = buffer_with(small)
    before = bytes(buf)
    big = random_image("RGB", (10, 10))
    with pytest.raises(ResultTooLarge) as info:
        write_image(buf, big)
    assert info.value.needed == required_size(10, 10, "RGB")
    assert info.value.available == len(buf)
    assert str(info.value.needed) in str(info.value)
    assert bytes(buf) == before


def test_write_to_read_only_buffer_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="writable"):
        write_image(memoryview(bytes(1000)), random_image("L", (4, 4)))


def test_typed_and_2d_views_are_cast_to_bytes() -> None:
    raw = bytearray(48)  # 41 bytes needed
    wide = memoryview(raw).cast("I")  # 4-byte items
    write_image(wide, random_image("L", (3, 3)))
    assert read_header(wide).width == 3
    assert read_header(memoryview(raw).cast("B", (6, 8))).height == 3


def test_required_size_rejects_unknown_mode_and_empty_images() -> None:
    with pytest.raises(InvalidImage, match="mode 'CMYK'"):
        required_size(2, 2, "CMYK")
    with pytest.raises(InvalidImage, match="0x5"):
        required_size(0, 5, "L")


# --- header validation ---------------------------------------------------------------------


def corrupt(buf: memoryview, offset: int, fmt: str, *values: object) -> memoryview:
    raw = bytearray(buf)
    struct.pack_into(fmt, raw, offset, *values)
    return memoryview(raw)


def test_bad_magic() -> None:
    buf = corrupt(buffer_with(random_image("L")), 0, "8s", b"NOTANIMG")
    with pytest.raises(InvalidImage, match="magic"):
        read_image(buf)
    with pytest.raises(InvalidImage, match="magic"):
        read_header(memoryview(bytearray(64)))  # a fresh, zeroed buffer


def test_buffer_shorter_than_header() -> None:
    with pytest.raises(InvalidImage, match="shorter than the 32-byte"):
        read_header(memoryview(MAGIC))


def test_truncated_buffer() -> None:
    full = buffer_with(random_image("RGB"))
    with pytest.raises(InvalidImage, match="truncated"):
        read_image(full[: len(full) - 1])


def test_unknown_mode_in_header() -> None:
    buf = corrupt(buffer_with(random_image("L")), 16, "4s", b"CMYK")
    with pytest.raises(InvalidImage, match="mode 'CMYK'"):
        read_header(buf)


def test_zero_width_in_header() -> None:
    buf = corrupt(buffer_with(random_image("L")), 8, "<I", 0)
    with pytest.raises(InvalidImage, match="0x23"):
        read_header(buf)


def test_pixel_count_mismatch_in_header() -> None:
    buf = corrupt(buffer_with(random_image("L")), 20, "<Q", 5)
    with pytest.raises(InvalidImage, match="corrupt"):
        read_header(buf)


def test_huge_dimensions_in_header() -> None:
    buf = corrupt(buffer_with(random_image("L")), 8, "<II", 2**31, 2**31)
    with pytest.raises(InvalidImage):
        read_header(buf)


# --- normalize_mode --------------------------------------------------------------------------


def test_normalize_keeps_storable_modes_as_is() -> None:
    img = random_image("RGBA")
    assert normalize_mode(img) is img


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("1", "L"), ("LA", "RGBA"), ("CMYK", "RGB"), ("YCbCr", "RGB"), ("P", "RGB")],
)
def test_normalize_modes(mode: str, expected: str) -> None:
    assert normalize_mode(random_image("RGB").convert(mode)).mode == expected


def test_normalize_palette_with_transparency_keeps_alpha() -> None:
    pal = random_image("RGB").convert("P")
    pal.info["transparency"] = 0
    assert normalize_mode(pal).mode == "RGBA"


def test_normalize_16_bit_scales_instead_of_clipping() -> None:
    arr = np.array([[0, 32768, 65535]], dtype=np.uint16)
    out = normalize_mode(Image.fromarray(arr))
    assert out.mode == "L"
    assert list(np.asarray(out)[0]) == [0, 128, 255]


def test_normalize_float_in_unit_range() -> None:
    out = normalize_mode(Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32)))
    assert list(np.asarray(out)[0]) == [0, 128, 255]


# --- decode / encode ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA"])
def test_lossless_formats_decode_to_the_same_pixels(mode: str, fmt: str) -> None:
    img = random_image(mode)
    assert decode_bytes(encode_image(img, fmt)).tobytes() == img.tobytes()


def test_raw_is_an_uncompressed_tiff() -> None:
    img = random_image("RGB", (64, 48))
    data = encode_image(img, RESULT_FORMATS["raw"].pillow)
    with Image.open(io.BytesIO(data)) as opened:
        assert opened.format == "TIFF" and opened.info.get("compression") == "raw"
    assert len(data) >= 64 * 48 * 3  # every pixel, none compressed away


def test_jpeg_round_trip_is_close() -> None:
    img = Image.merge("RGB", [Image.linear_gradient("L")] * 3)  # smooth: JPEG-friendly
    back = decode_bytes(encode_image(img, "jpg", quality=95))
    diff = np.abs(np.asarray(back, np.int16) - np.asarray(img, np.int16))
    assert back.mode == "RGB" and float(diff.mean()) < 2


def test_jpeg_flattens_alpha_onto_white() -> None:
    img = Image.new("RGBA", (8, 8), (255, 0, 0, 0))  # fully transparent red
    back = decode_bytes(encode_image(img, "JPEG"))
    assert back.mode == "RGB"
    r, g, b = back.getpixel((4, 4))  # type: ignore[misc]
    assert min(r, g, b) > 245


def test_encode_rejects_unknown_format_and_bad_quality() -> None:
    img = random_image("L")
    with pytest.raises(ValueError, match="'GIF'"):
        encode_image(img, "gif")
    with pytest.raises(ValueError, match="quality"):
        encode_image(img, "JPEG", quality=0)


def test_decode_converts_palette_cmyk_and_16_bit_files() -> None:
    rgb = random_image("RGB")
    out = io.BytesIO()
    rgb.convert("CMYK").save(out, "JPEG")
    assert decode_bytes(out.getvalue()).mode == "RGB"
    out = io.BytesIO()
    rgb.convert("P").save(out, "GIF")
    assert decode_bytes(out.getvalue()).mode == "RGB"
    out = io.BytesIO()
    Image.fromarray(np.full((4, 4), 65535, np.uint16)).save(out, "PNG")
    assert np.asarray(decode_bytes(out.getvalue())).min() == 255


def test_decode_applies_exif_orientation() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees clockwise
    out = io.BytesIO()
    Image.new("RGB", (40, 20)).save(out, "JPEG", exif=exif)
    assert decode_bytes(out.getvalue()).size == (20, 40)


def test_decode_non_image() -> None:
    with pytest.raises(InvalidImage, match="not a recognised image"):
        decode_bytes(b"%PDF-1.7 this is not a picture")
    with pytest.raises(InvalidImage, match="empty"):
        decode_bytes(b"")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_decode_truncated_file(fmt: str) -> None:
    data = encode_image(random_image("RGB", (64, 64)), fmt)
    with pytest.raises(InvalidImage, match="corrupt or truncated"):
        decode_bytes(data[: len(data) // 2])


def test_bomb_guard_uses_max_pixels_before_decoding() -> None:
    data = png_header_only(2000, 1000)  # 2 Mpx claimed; the stub data could never fill it
    with pytest.raises(InvalidImage, match="decompression bomb"):
        decode_bytes(data, max_pixels=1_000_000)


def test_bomb_guard_for_absurd_dimensions() -> None:
    with pytest.raises(InvalidImage, match="decompression bomb"):
        decode_bytes(png_header_only(100_000, 100_000))


def test_pillow_bomb_warning_becomes_invalid_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = encode_image(random_image("L", (40, 40)), "PNG")  # 1600 px: Pillow warns
    with pytest.raises(InvalidImage, match="decompression bomb"):
        decode_bytes(data, max_pixels=1000)
    # A caller limit above Pillow's own one wins, without a warning.
    assert decode_bytes(data, max_pixels=10_000).size == (40, 40)


def test_decode_rejects_bad_max_pixels() -> None:
    with pytest.raises(ValueError, match="max_pixels"):
        decode_bytes(b"x", max_pixels=0)


# --- decoding straight into a buffer ---------------------------------------------------------


def _jpeg(img: Image.Image, **params: object) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", **params)
    return out.getvalue()


@pytest.mark.parametrize(("mode", "progressive"), [("L", False), ("RGB", False), ("RGB", True)])
def test_decode_into_stores_what_decode_then_write_stores(mode: str, progressive: bool) -> None:
    data = _jpeg(random_image(mode, (61, 47)), quality=90, progressive=progressive)
    expected = buffer_with(decode_bytes(data), extra=16)
    img = open_image(data)
    assert decodes_in_place(img)
    got = memoryview(bytearray(len(expected)))
    assert decode_into(got, img) == required_size(61, 47, mode)
    assert bytes(got) == bytes(expected)


def test_only_upright_jpegs_in_a_stored_mode_decode_in_place() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the pixels must be turned, which needs the decoded image
    turned = _jpeg(Image.new("RGB", (40, 20)), exif=exif)
    cmyk = _jpeg(random_image("RGB").convert("CMYK"))
    png = encode_image(random_image("RGB"), "PNG")
    for data in (turned, cmyk, png):
        assert not decodes_in_place(open_image(data))
        with pytest.raises(ValueError, match="JPEG in mode L or RGB"):
            decode_into(memoryview(bytearray(1 << 16)), open_image(data))
    assert decodes_in_place(open_image(_jpeg(random_image("RGB"), exif=Image.Exif())))


def test_decode_into_a_truncated_jpeg_fails_clearly_and_lets_go_of_the_buffer() -> None:
    data = _jpeg(random_image("RGB", (64, 64)))
    view = memoryview(bytearray(required_size(64, 64, "RGB")))
    with pytest.raises(InvalidImage, match="corrupt or truncated") as failed:
        decode_into(view, open_image(data[: len(data) // 2]))
    # The caller still holds the error (as a `with obj.view()` unwinding does), yet nothing
    # exports the buffer any more: releasing it raises BufferError otherwise.
    assert failed.value.__cause__ is not None
    view.release()


def test_decode_into_refuses_a_short_or_read_only_buffer() -> None:
    data = _jpeg(random_image("RGB", (64, 64)))
    with pytest.raises(ValueError, match="too small"):
        decode_into(memoryview(bytearray(HEADER_SIZE + 10)), open_image(data))
    with pytest.raises(TypeError, match="writable"):
        decode_into(memoryview(bytes(required_size(64, 64, "RGB"))), open_image(data))
