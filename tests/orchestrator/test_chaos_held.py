"""The chaos suite's faults that last, short versions (``cdiflow bench chaos`` runs them at
full length: a 30 s S3 outage and 30 s slow, a 30 s full disk): each on a stack of its own,
under load, every workflow judged as in ``test_chaos.py``.

* S3 down 5 s, then 1 s a request for 5 s (a proxy before it): no workflow may fail, and the
  API's own S3 routes answer 503 while it is down.
* The data folder's disk (Postgres, S3, logs on a 256 MB tmpfs) full for 10 s: the API's
  refusals say so, Postgres passes ``amcheck`` after, and everything runs again.
"""

from __future__ import annotations

import os

import pytest

from loadtest.chaos.faults import disk_full, s3_outage
from loadtest.chaos.run import CaseResult, chaos_stack, run_case
from tests.orchestrator.chaos_support import passed

WORKFLOWS = 12


def _passed(result: CaseResult) -> None:
    assert passed(result), result.as_dict()
    assert result.completed + result.failed == result.workflows + result.probes + result.fed


def test_a_short_s3_outage_fails_no_workflow() -> None:
    fault = s3_outage(down_s=5.0, slow_s=5.0, per_request_s=1.0)
    with chaos_stack(external=True, rig=fault.rig) as target:
        result = run_case(target, fault, workflows=WORKFLOWS, deadline_s=120.0)
    _passed(result)
    assert result.failed == 0, result.failures
    assert set(result.observed) >= {"POST /api/inputs"}, result.observed
    assert all(answer.startswith("503 ") for answer in result.observed.values())


@pytest.mark.skipif(os.geteuid() != 0, reason="a disk of its own (a tmpfs) needs root to mount")
def test_a_full_disk_says_so_and_corrupts_nothing() -> None:
    fault = disk_full(full_s=10.0)
    with chaos_stack(rig=fault.rig) as target:
        result = run_case(target, fault, workflows=WORKFLOWS, deadline_s=120.0)
    _passed(result)  # its checks: the refusals said the disk is full; amcheck found nothing
