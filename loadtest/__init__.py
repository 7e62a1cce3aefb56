"""The benchmark harness: load tests of cdiflow against its peers, and the cost benchmarks
behind ``cdiflow bench``.

It runs from a source checkout and is not part of the installed cdiflow: the product and its
harness stay apart, and the harness's dependencies (locust, Ray, Celery, the Conductor SDK)
are the ``bench`` extra's. The processes it starts (locust, the peers' workers) import it by
module name wherever they run, so their environment carries this checkout on ``PYTHONPATH``
(``harness_env``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = ["CHECKOUT", "harness_env"]

CHECKOUT: Final = Path(__file__).resolve().parent.parent  # the folder holding ``loadtest/``


def harness_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this checkout first on ``PYTHONPATH``."""
    paths = [str(CHECKOUT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(env, PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)))
