"""The worker's budget of images held between a workflow's tasks."""

from __future__ import annotations

import time

import pytest
from PIL import Image

from cdi import ObjectKey
from orchestrator.worker.held import STALE_AFTER_S, Held, HeldImages


def _held(nbytes: int, since: float | None = None) -> Held:
    image = Image.new("L", (2, 2))
    if since is None:
        return Held(ObjectKey("base"), "1", image, nbytes)
    return Held(ObjectKey("base"), "1", image, nbytes, since)


def test_images_are_held_within_the_budget_and_taken_once() -> None:
    held = HeldImages(max_bytes=100)
    assert held.put(ObjectKey("a"), _held(60))
    assert not held.put(ObjectKey("b"), _held(50))  # over the budget: the worker writes it instead
    assert (len(held), held.nbytes) == (1, 60)
    first = held.take(ObjectKey("a"))
    assert first is not None and first.nbytes == 60
    assert held.take(ObjectKey("a")) is None
    # A taken image is the running task's input: it takes memory until it is released.
    assert held.usage() == (1, 60) and not held.put(ObjectKey("b"), _held(50))
    held.release(first)
    assert held.usage() == (0, 0)
    assert held.put(ObjectKey("b"), _held(50)) and held.nbytes == 50


def test_a_zero_budget_holds_nothing() -> None:
    held = HeldImages(max_bytes=0)
    assert not held.put(ObjectKey("a"), _held(1))
    assert len(held) == 0


def test_a_stale_image_makes_room_and_a_fresh_one_does_not() -> None:
    held = HeldImages(max_bytes=100)
    assert held.put(ObjectKey("old"), _held(60, since=time.monotonic() - STALE_AFTER_S - 1))
    assert held.put(ObjectKey("fresh"), _held(40))
    assert held.put(ObjectKey("new"), _held(60))  # the stale one gave way
    assert held.take(ObjectKey("old")) is None
    assert not held.put(ObjectKey("more"), _held(10))  # the fresh ones stay
    assert held.nbytes == 100


def test_one_image_per_workflow() -> None:
    held = HeldImages(max_bytes=100)
    assert held.put(ObjectKey("a"), _held(10))
    assert not held.put(ObjectKey("a"), _held(10))  # the caller writes this one instead
    assert held.usage() == (1, 10)
    with pytest.raises(ValueError, match="max_bytes"):
        HeldImages(max_bytes=-1)
