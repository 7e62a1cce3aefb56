"""The chaos suite's faults between two hosts, short versions (``cdiflow bench chaos`` cuts for
10 s): on one ``--hosts 2`` stack under load, host 2 cut off the network for 5 s (no workflow
may fail), then every process of host 2 killed at once; every workflow judged as in
``tests/orchestrator/test_chaos.py``, and host 2's worker must beat again after."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from cdi.hosts import namespaces_available
from loadtest.chaos.faults import Target, host_killed, partition
from loadtest.chaos.run import chaos_stack, run_case
from tests.orchestrator.chaos_support import passed

WORKFLOWS = 12


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    able, why = namespaces_available()
    if not able:
        pytest.skip(f"the host faults need network namespaces: {why}")
    if shutil.which("nft") is None:
        pytest.skip("the host faults need `nft` (make nft installs it)")
    with chaos_stack(rig=partition().rig) as running:
        yield running


def test_a_short_partition_fails_no_workflow(target: Target) -> None:
    result = run_case(target, partition(cut_s=5.0), workflows=WORKFLOWS, deadline_s=120.0)
    assert passed(result), result.as_dict()
    assert result.failed == 0, result.failures


def test_a_host_killed_whole_comes_back(target: Target) -> None:
    result = run_case(target, host_killed(), workflows=WORKFLOWS, deadline_s=120.0)
    assert passed(result), result.as_dict()
    assert result.completed + result.failed == result.workflows + result.probes + result.fed
