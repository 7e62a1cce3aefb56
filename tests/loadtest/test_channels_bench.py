"""A tiny run of ``cdiflow bench channels``: every system gives its rows, and every CDI message
arrives whole and unaltered (one of them in two chunks). Never timings."""

from __future__ import annotations

import json

from click.testing import CliRunner

from loadtest.channel_peers import System
from loadtest.channels import bench_channels_command, measure_channels
from tests.loadtest.conftest import require

SAMPLES, BURST = 5, 20
SIZES = [16, 70_000]  # the second is longer than a slot (64 KiB): it goes as two chunks


def test_every_system_gives_its_rows_and_cdi_messages_arrive_intact() -> None:
    require("paho", "redis")
    rows = measure_channels(
        list(System), SIZES, samples=SAMPLES, burst=BURST, gap_us=0, spin_us=200
    )
    assert [(r.system, r.message_bytes, r.wake) for r in rows] == [
        ("cdi", 16, "futex"),
        ("cdi", 16, "spin"),
        ("cdi", 70_000, "futex"),
        ("cdi", 70_000, "spin"),
        ("mosquitto", 16, "socket"),
        ("mosquitto", 70_000, "socket"),
        ("redis", 16, "socket"),
        ("redis", 70_000, "socket"),
    ]
    for row in rows:
        assert row.hosts == 1
        if row.system == "cdi":
            assert row.not_run is None
            assert row.delivered == row.sent  # a twentieth of the burst at 70 KB: one
            assert row.intact == row.received == SAMPLES + row.sent
        if row.not_run is not None:  # a peer not installed here: the row says why
            assert row.system != "cdi" and row.p50_us is None
            continue
        assert row.samples == SAMPLES and row.p50_us is not None and row.p50_us > 0
        assert row.messages_per_s is not None and row.messages_per_s > 0
        assert 0 < row.intact == row.received  # QoS 0 may drop a message, never alter one


def test_the_command_prints_json_rows() -> None:
    result = CliRunner().invoke(
        bench_channels_command,
        ["--json", "--systems", "cdi", "--sizes", "16", "--samples", "3", "--burst", "5",
         "--gap-us", "0", "--spin-us", "0"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    [row] = document["rows"]
    assert row["system"] == "cdi" and row["hosts"] == 1 and row["message_bytes"] == 16
    assert set(row) >= {"p50_us", "messages_per_s", "intact", "received"}
    assert row["intact"] == row["received"] == 8
    assert document["hosts"]["count"] == 1
