"""``cdiflow bench workflows --hosts N``: the hosts every system's workers are spread over.

The hosts are network namespaces on one bridge (``cdi.hosts``) with an emulated link between
them (``cdi.link_emulator``: bandwidth by ``tbf``, round trip in user space), which every
connection between hosts crosses whatever system opens it: cdiflow's gateways moving CDI
objects, its workers' Redis, Postgres and S3 connections from host 2, Ray's object transfers
and control traffic between its head and its worker node. Postgres, Redis and S3 stay in the
root namespace and count as host 1's; S3 sits behind the regional link as well
(``--s3-link regional``). What the link does is measured before the first system starts
(``cdi.link_probe``) and printed beside the results.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from cdi.hosts import HostNetwork
from cdi.link_probe import probe
from loadtest.stats import PointResult

if TYPE_CHECKING:
    from loadtest.runner import BenchConfig

__all__ = ["DEFAULT_HOST_SYSTEMS", "HOST_SYSTEMS", "bench_hosts", "host_goals"]

# The systems that can spread their workers over hosts; the floor is one process (a
# reference on one host, for the ratios).
HOST_SYSTEMS: Final = ("floor", "affinity", "transfer", "auto", "object-store", "ray")
DEFAULT_HOST_SYSTEMS: Final = HOST_SYSTEMS
GOAL_TRANSFER_VS_OBJECT_STORE: Final = 1.3
GOAL_AUTO_SLACK: Final = 0.05


@contextlib.contextmanager
def bench_hosts(
    config: BenchConfig, folder: Path, figures: dict[str, Any], echo: Callable[[str], None]
) -> Iterator[HostNetwork | None]:
    """The run's hosts with their link, measured into ``figures``; ``None`` for one host.
    Everything is removed on the way out."""
    if config.hosts == 1:
        yield None
        return
    network = HostNetwork.create(config.hosts, fallback=False)
    try:
        network.emulate_link(config.host_link, str(folder))
        measured = probe(network, network.hosts[0], network.hosts[1])
        figures.update(stated=config.host_link.describe(), measured=measured.as_dict())
        echo(
            f"{config.hosts} hosts, link {config.host_link.describe()}; measured host1 -> "
            f"host2: {measured.rtt_ms:.3f} ms round trip, {measured.mbit:.0f} Mbit/s"
        )
        yield network
    finally:
        network.close()


def host_goals(results: Sequence[PointResult]) -> str:
    """The cross-host goals, one line each per size: met or not, with the figures.

    ``transfer`` >= 1.3x the object-store plane's throughput and >= Ray's; ``auto`` not below
    the better of ``affinity`` and ``transfer`` by more than 5 %."""
    by: dict[tuple[int | None, int], dict[str, float]] = {}
    for r in results:
        if r.scenario == "1" and r.completed:
            by.setdefault((r.size, r.round), {})[r.system] = r.throughput_wps
    lines = []
    for (size, round_no), wps in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0] or 0)):
        label = f"{(size or 0) / 1e6:g} MB" + (f" (round {round_no})" if round_no > 1 else "")
        transfer = wps.get("transfer")
        if transfer is not None and (store := wps.get("object-store")):
            ratio = transfer / store
            ok = ratio >= GOAL_TRANSFER_VS_OBJECT_STORE
            lines.append(f"{label}: transfer / object-store = {ratio:.2f} "
                         f"(goal >= {GOAL_TRANSFER_VS_OBJECT_STORE}) {_met(ok)}")  # fmt: skip
        if transfer is not None and (ray := wps.get("ray")):
            lines.append(f"{label}: transfer / ray = {transfer / ray:.2f} (goal >= 1) "
                         f"{_met(transfer >= ray)}")  # fmt: skip
        best = max((wps[s] for s in ("affinity", "transfer") if s in wps), default=None)
        if best and (auto := wps.get("auto")) is not None:
            ok = auto >= best * (1 - GOAL_AUTO_SLACK)
            lines.append(f"{label}: auto / best of affinity, transfer = {auto / best:.2f} "
                         f"(goal >= {1 - GOAL_AUTO_SLACK:.2f}) {_met(ok)}")  # fmt: skip
    return "\n".join(lines) or "no point with the systems the goals compare"


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"
