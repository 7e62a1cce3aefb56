"""``cdiflow bench s3`` on its own embedded endpoint: both clients, both operations, every size,
in JSON and as a table (no timing is asserted)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from loadtest.s3_costs import bench_s3_command


def test_bench_s3_measures_both_clients() -> None:
    shown = CliRunner().invoke(
        bench_s3_command, ["--sizes", "10KB,100KB", "--calls", "2", "--blocks", "2", "--json"]
    )
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.output)["results"]
    assert {(r["client"], r["op"], r["size"]) for r in rows} == {
        (client, op, size)
        for client in ("boto3", "cdiflow")
        for op in ("get", "put")
        for size in (10_000, 100_000)
    }
    assert all(r["calls"] == 4 and r["wall_ms"] > 0 and r["client_cpu_ms"] >= 0 for r in rows)
    table = CliRunner().invoke(
        bench_s3_command, ["--sizes", "10KB", "--calls", "1", "--blocks", "1"]
    )
    assert table.exit_code == 0, table.output
    assert "client cpu" in table.output and "cdiflow" in table.output
