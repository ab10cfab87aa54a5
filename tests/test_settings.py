"""Settings from ``GPULAYER_*`` variables and flags, read from an explicit mapping."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpulayer import ConfigError, Settings


def test_no_variables_give_the_defaults() -> None:
    assert Settings.from_env({}) == Settings()


def test_the_prefix_and_redis_url_are_read_from_the_mapping() -> None:
    settings = Settings.from_env({"GPULAYER_PREFIX": "teamA", "GPULAYER_REDIS_URL": "redis://db:6379/2"})
    assert settings.prefix == "teamA"
    assert settings.redis_url == "redis://db:6379/2"


def test_the_process_environment_is_not_read_when_a_mapping_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_PREFIX", "from-process")
    assert Settings.from_env({}).prefix == "gpulayer"


def test_a_home_with_a_tilde_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings.from_env({"GPULAYER_HOME": "~/gl"}).home == tmp_path / "gl"


def test_sizes_take_units_and_durations_take_suffixes() -> None:
    settings = Settings.from_env(
        {
            "GPULAYER_MAX_SOURCE_BYTES": "1GiB",
            "GPULAYER_MAX_JOB_BYTES": "2GB",
            "GPULAYER_LOG_LINE_MAX_BYTES": "4KiB",
            "GPULAYER_LOG_MAX_LINES": "500",
            "GPULAYER_RETENTION_SECONDS": "2d",
            "GPULAYER_KILL_GRACE_SECONDS": "90s",
        }
    )
    assert settings.max_source_bytes == 2**30
    assert settings.max_job_bytes == 2 * 10**9
    assert settings.log_line_max_bytes == 4096
    assert settings.log_max_lines == 500
    assert settings.retention_seconds == 2 * 86400
    assert isinstance(settings.retention_seconds, int)
    assert settings.kill_grace_seconds == 90.0


def test_an_empty_variable_is_ignored() -> None:
    assert Settings.from_env({"GPULAYER_PREFIX": "", "GPULAYER_MAX_JOB_BYTES": ""}) == Settings()


def test_overrides_win_over_the_environment_but_none_overrides_are_ignored() -> None:
    env = {"GPULAYER_PREFIX": "from-env", "GPULAYER_REDIS_URL": "redis://env/0"}
    settings = Settings.from_env(env, prefix="from-flag", redis_url=None)
    assert settings.prefix == "from-flag"
    assert settings.redis_url == "redis://env/0"


@pytest.mark.parametrize("prefix", ["team A", "a:b", "x" * 65, "é"])
def test_an_invalid_prefix_raises_config_error(prefix: str) -> None:
    with pytest.raises(ConfigError, match="GPULAYER_PREFIX"):
        Settings.from_env({"GPULAYER_PREFIX": prefix})
    with pytest.raises(ConfigError, match="GPULAYER_PREFIX"):
        Settings.from_env({}, prefix=prefix)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GPULAYER_MAX_JOB_BYTES", "lots", "not a size"),
        ("GPULAYER_MAX_SOURCE_BYTES", "5XB", "not a size"),
        ("GPULAYER_RETENTION_SECONDS", "forever", "not a duration"),
        ("GPULAYER_LOG_MAX_LINES", "10k", "invalid literal"),
    ],
)
def test_a_bad_value_raises_config_error_naming_the_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{variable}: {message}"):
        Settings.from_env({variable: value})


def test_a_zero_size_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_job_bytes must be positive"):
        Settings.from_env({"GPULAYER_MAX_JOB_BYTES": "0"})


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().prefix = "other"  # type: ignore[misc]
