"""Settings read the environment and refuse clearly bad values with the variable to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.settings import load_settings
from workflows.filetypes import matches


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
        ({"upload_types": "video/mp4,mp4"}, "CDIFLOW_UPLOAD_TYPES"),
        ({"upload_types": " , "}, "CDIFLOW_UPLOAD_TYPES"),
        ({"upload_max_bytes": 0}, "CDIFLOW_UPLOAD_MAX_BYTES"),
        ({"upload_max_bytes": 2000, "max_input_bytes": 1000}, "CDIFLOW_UPLOAD_MAX_BYTES"),
    ],
)
def test_bad_values_are_refused(overrides: dict[str, object], env_name: str) -> None:
    with pytest.raises(ConfigError, match=env_name) as caught:
        load_settings(**overrides)
    assert "topsecret" not in str(caught.value)


def test_the_upload_policy_defaults_to_what_tasks_read_and_is_set_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CDIFLOW_UPLOAD_TYPES", raising=False)
    monkeypatch.delenv("CDIFLOW_UPLOAD_MAX_BYTES", raising=False)
    default = load_settings(max_input_bytes=5000)
    assert default.upload_limit == 5000  # MAX_INPUT_BYTES
    for kind in ("image/png", "video/mp4", "audio/mpeg", "application/x-npy",
                 "application/json", "application/octet-stream", "text/csv"):  # fmt: skip
        assert matches(kind, default.upload_types), kind
    assert not matches("text/html", default.upload_types)
    monkeypatch.setenv("CDIFLOW_UPLOAD_TYPES", "Video/*, application/x-npy")
    monkeypatch.setenv("CDIFLOW_UPLOAD_MAX_BYTES", "4000")
    chosen = load_settings(max_input_bytes=5000)
    assert chosen.upload_types == ["video/*", "application/x-npy"]
    assert chosen.upload_limit == 4000
