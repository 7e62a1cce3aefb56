"""The benchmark's shared services hand each system its own Redis database, for as many
systems as a run starts."""

from __future__ import annotations

from pathlib import Path

import redis

from loadtest.systems.services import BenchServices
from orchestrator.services import RunningServices


def test_redis_databases_are_handed_out_again_emptied_once_all_were_used(
    tmp_path: Path, service_stack: RunningServices
) -> None:
    with BenchServices(tmp_path, given=service_stack, first_redis_db=14) as shared:
        first, second = shared.redis_url(), shared.redis_url()
        assert (first.rsplit("/", 1)[1], second.rsplit("/", 1)[1]) == ("14", "15")
        with redis.Redis.from_url(first) as client:
            client.set("left-by-an-earlier-system", "1")
        again = shared.redis_url()  # a run of more systems than databases goes on
        assert again == first
        with redis.Redis.from_url(again) as client:
            assert client.dbsize() == 0
