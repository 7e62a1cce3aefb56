"""Image memory settings (workflows.memory): what they set, how to turn them off, and that a
process that passes large images around then reuses memory instead of faulting in fresh pages.

Each case runs in a child interpreter: the settings are process-wide."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from tests.cdi.conftest import ROOT

_PROBE = """
import json, resource, sys, threading
from PIL import Image, ImageFilter
from workflows.memory import tune_for_images
applied = tune_for_images() if sys.argv[1] == "tune" else {}
img = Image.new("RGB", (2400, 1800), (90, 120, 200))  # 17 MB inside Pillow

def one_pass():
    out = img.filter(ImageFilter.GaussianBlur(radius=1))
    return len(out.tobytes())

def chain():  # a pipeline's steps on one slot thread: each image replaces the one before
    step = photo.copy()
    for f in (ImageFilter.UnsharpMask(radius=2, percent=150, threshold=3),
              ImageFilter.GaussianBlur(radius=1)):
        step = step.filter(f)
    return step.size

if sys.argv[2] == "thread":  # the second of two pipelines run on a worker's slot thread
    photo = Image.new("RGB", (3136, 2091), (90, 120, 200))  # a 2 MB JPEG's pixels: 20 MB
    counted = []
    def slot():
        chain()
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        chain()
        counted.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    thread = threading.Thread(target=slot)
    thread.start()
    thread.join()
    faults = counted[0]
else:
    one_pass()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    one_pass()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": applied, "blocks": Image.core.get_blocks_max(), "faults": faults}))
"""


def _probe(mode: str, where: str = "main", **env: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode, where],
        cwd=ROOT,
        env={**os.environ, **env},
        text=True,
        capture_output=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_settings_apply_and_can_be_turned_off() -> None:
    tuned = _probe("tune")
    assert tuned["applied"] == {"malloc": platform.libc_ver()[0] == "glibc"}
    assert tuned["blocks"] == 0  # Pillow's block cache is left at its default: none
    off = _probe("tune", CDIFLOW_MEMORY_TUNING="0")
    assert off["applied"] == {"malloc": False}
    theirs = _probe("tune", PILLOW_BLOCKS_MAX="3")
    assert theirs["blocks"] == 3  # a user's own Pillow setting is Pillow's to honour


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_second_pass_reuses_memory_instead_of_faulting_in_fresh_pages() -> None:
    default = _probe("default")
    tuned = _probe("tune")
    # By default the second pass faults in fresh pages for the blurred image and its bytes
    # (~4,300 here); with the settings it reuses nearly all the first pass freed (~100).
    assert int(str(default["faults"])) > 3000
    assert int(str(tuned["faults"])) < int(str(default["faults"])) // 2


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_pipeline_on_a_slot_thread_reuses_memory_too() -> None:
    # A thread's own arena gives back each heap it outgrew once its blocks are free: there
    # every pipeline faulted in fresh pages whatever the trim threshold. With
    # one arena the thread allocates from the main heap, which keeps them.
    default = _probe("default", "thread")
    tuned = _probe("tune", "thread")
    assert int(str(default["faults"])) > 3000
    assert int(str(tuned["faults"])) < int(str(default["faults"])) // 10
