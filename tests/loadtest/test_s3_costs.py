"""``cdiflow bench s3`` on the embedded endpoint and on moto: both clients, both operations, every
size, in JSON and as a table (no timing is asserted). s3proxy is left out: its first use fetches
a 40 MB jar with Maven."""

from __future__ import annotations

import json

from click.testing import CliRunner

from loadtest.s3_costs import bench_s3_command


def test_bench_s3_measures_both_clients() -> None:
    shown = CliRunner().invoke(
        bench_s3_command,
        ["--sizes", "10KB,100KB", "--calls", "2", "--blocks", "2", "--json",
         "--server", "versitygw,moto"],
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.output)["results"]
    assert {(r["server"], r["client"], r["op"], r["size"]) for r in rows} == {
        (server, client, op, size)
        for server in ("versitygw", "moto")
        for client in ("boto3", "cdiflow")
        for op in ("get", "put")
        for size in (10_000, 100_000)
    }
    assert all(r["calls"] == 4 and r["wall_ms"] > 0 and r["client_cpu_ms"] >= 0 for r in rows)
    assert all(r["start_s"] > 0 and r["rss_mb"] > 0 for r in rows)
    table = CliRunner().invoke(
        bench_s3_command, ["--sizes", "10KB", "--calls", "1", "--blocks", "1"]
    )
    assert table.exit_code == 0, table.output
    assert "client cpu" in table.output and "versitygw" in table.output
