"""A detection: where a person is in a frame, how sure the detector is, and its label."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LABEL", "Box"]

LABEL = "person"


@dataclass(frozen=True, order=True)
class Box:
    """A detection in frame pixels; ``score`` is the SVM's margin (higher is surer, > 0 found)."""

    x: int
    y: int
    w: int
    h: int
    score: float

    def as_list(self) -> list[float]:
        return [self.x, self.y, self.w, self.h, round(self.score, 3)]

    @property
    def label(self) -> str:
        return f"{LABEL} {self.score:.2f}"
