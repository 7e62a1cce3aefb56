"""``cdiflow bench history`` at two small sizes on the session's services: each size is served
by its own stack and database, every call is timed at both sizes in turn, and each ratio is of
times taken in the same round (asserts no timings)."""

from __future__ import annotations

import statistics
from pathlib import Path

import click
import pytest

from loadtest.history import grow
from loadtest.history.cli import KEPT, measure_history, read_kept
from loadtest.history.report import history_table
from orchestrator.services import RunningServices

_SIZES = (200, 2000)


@pytest.mark.timeout(300)
def test_each_call_is_timed_at_every_size_in_turn_and_its_ratio_is_of_the_same_rounds(
    service_stack: RunningServices, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Several chunks a size, each cloned and folded in turn (the totals below still add up).
    monkeypatch.setattr(grow, "CHUNK", 700)
    report = measure_history(short_dir / "bench", _SIZES, repeat=2, templates=50,
                             tab_seconds=1.0, prune=False, plans=False, progress=False,
                             services=service_stack, redis_db=12)  # fmt: skip
    histories = report["histories"]
    assert [h["workflows"] for h in histories] == list(_SIZES)
    assert [h["api_total"] for h in histories] == list(_SIZES)  # each API on its own history
    assert "copy_s" in histories[0] and "copy_s" not in histories[1]
    rows = {(r["call"], r["workflows"]): r for r in report["results"]}
    names = {name for name, _ in rows}
    assert len(names) > 20 and len(rows) == len(report["results"]) == 2 * len(names)
    for name in names:
        small, large = rows[(name, _SIZES[0])], rows[(name, _SIZES[1])]
        rounds = 6 if name.startswith("new") else 2
        assert len(small["samples_ms"]) == len(large["samples_ms"]) == rounds
        began = sorted([(t, 0) for t in small["started_s"]] + [(t, 1) for t in large["started_s"]])
        assert [side for _, side in began] == [0, 1] * rounds, name
        same_round = [b / a for a, b in zip(small["samples_ms"], large["samples_ms"], strict=True)]
        assert large["ratio"] == pytest.approx(statistics.median(same_round), rel=0.01), name
        assert small["ratio"] == 1.0
        assert large["p50_ms"] == pytest.approx(statistics.median(large["samples_ms"]), abs=0.01)
    assert [t["workflows"] for t in report["dashboard_tab"]] == list(_SIZES)
    assert "2k/200" in history_table(report)
    # Timed again without growing: the same databases (each API still sees its own size).
    again = measure_history(short_dir / "bench", (5000,), repeat=1, tab_seconds=1.0,
                            prune=False, plans=False, progress=False, services=service_stack,
                            redis_db=12, again=True)  # fmt: skip
    assert again["again"] is True and again["sizes"] == list(_SIZES)
    small_total, large_total = (h["api_total"] for h in again["histories"])
    # (plus the new runs the first timing started, as many at each size)
    assert small_total > _SIZES[0] and large_total - small_total == _SIZES[1] - _SIZES[0]
    assert {(r["call"], r["workflows"]) for r in again["results"]} == set(rows)
    assert "templates_s" not in again and "timed again" in history_table(again)
    assert "timed again" not in history_table(report)


def test_timing_again_needs_a_kept_history(tmp_path: Path) -> None:
    with pytest.raises(click.UsageError, match="grow one first with --keep"):
        read_kept(tmp_path)
    for wrong in ('{"sizes": [1000]}', "[1000]", '{"sizes": [1000], "spread_days": 365, '
                  '"databases": ["a", "b"], "histories": [{}]}'):  # fmt: skip
        (tmp_path / KEPT).write_text(wrong)
        with pytest.raises(click.UsageError, match="which databases hold which size"):
            read_kept(tmp_path)
    (tmp_path / KEPT).write_text("{")
    with pytest.raises(click.UsageError, match="is not JSON"):
        read_kept(tmp_path)
