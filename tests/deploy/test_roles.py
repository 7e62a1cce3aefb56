"""Where the stack as containers puts each container on its network (no podman needed)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from deploy.containers.errors import ContainerError
from deploy.containers.roles import Layout, mac_for, plan_addresses


def test_each_container_and_pod_gets_an_address_and_a_mac_of_its_own() -> None:
    layout = Layout("cdiflow-x", Path("/tmp/x"), hosts=3, workers=2)
    plan = plan_addresses(layout, "10.89.0.0/24")
    assert set(plan) == {"postgres", "redis", "s3", "cdi-controller", "api",
                         "host1", "host2", "host3"}  # fmt: skip
    assert len(set(plan.values())) == len(plan)
    assert min(ipaddress.IPv4Address(a) for a in plan.values()) == ipaddress.IPv4Address(
        "10.89.0.10"
    )  # below it: the gateway and what podman hands out itself
    macs = {mac_for(address) for address in plan.values()}
    assert len(macs) == len(plan)
    for mac in macs:
        first = int(mac.split(":")[0], 16)
        assert first & 0x02 and not first & 0x01, mac  # locally administered, unicast
    assert mac_for("10.89.0.14") == "02:00:0a:59:00:0e" == mac_for("10.89.0.14")


def test_a_network_too_small_for_the_stack_is_refused() -> None:
    layout = Layout("cdiflow-x", Path("/tmp/x"), hosts=2, workers=2)
    with pytest.raises(ContainerError, match="too few addresses"):
        plan_addresses(layout, "10.89.0.0/28")
