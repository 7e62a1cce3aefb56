"""Settings read the environment and refuse clearly bad values with the variable to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.settings import load_settings


def test_defaults_need_nothing_configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("CDIFLOW_DATA_DIR", "DATABASE_URL", "REDIS_URL", "S3_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert settings.data_dir == tmp_path / ".data"
    assert settings.database_url is None
    assert settings.s3_bucket == "cdiflow"


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CDIFLOW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", "postgres://app:pw@db.internal:5432/app")
    monkeypatch.setenv("REDIS_URL", "")  # empty means unset
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    monkeypatch.delenv("AWS_REGION", raising=False)
    settings = load_settings()
    assert settings.data_dir == tmp_path
    # SQLAlchemy would pick psycopg2 (not installed) for postgres://, so we name psycopg.
    assert settings.database_url == "postgresql+psycopg://app:pw@db.internal:5432/app"
    assert settings.redis_url is None
    assert settings.aws_region == "eu-west-3"


@pytest.mark.parametrize(
    ("overrides", "env_name"),
    [
        ({"database_url": "mysql://app:topsecret@db/app"}, "DATABASE_URL"),
        ({"database_url": "postgresql+psycopg2://app:topsecret@db/app"}, "DATABASE_URL"),
        ({"redis_url": "http://cache:6379"}, "REDIS_URL"),
        ({"s3_endpoint_url": "s3.amazonaws.com"}, "S3_ENDPOINT_URL"),
        ({"s3_bucket": "Not_A_Bucket"}, "S3_BUCKET"),
        ({"data_dir": Path(__file__)}, "CDIFLOW_DATA_DIR"),
    ],
)
def test_bad_values_are_refused(overrides: dict[str, object], env_name: str) -> None:
    with pytest.raises(ConfigError, match=env_name) as caught:
        load_settings(**overrides)
    assert "topsecret" not in str(caught.value)
