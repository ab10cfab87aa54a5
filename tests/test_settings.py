"""Settings from ``GPULAYER_*`` variables and flags, read from an explicit mapping."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import gpulayer as gl
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
        ("GPULAYER_LOG_MAX_LINES", "10k", "not a whole number: '10k'"),
        ("GPULAYER_LOG_MAX_LINES", "lots", "not a whole number: 'lots'"),
        ("GPULAYER_TELEMETRY_INTERVAL", "often", "not a duration"),
    ],
)
def test_a_bad_value_raises_config_error_naming_the_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{variable}: {message}"):
        Settings.from_env({variable: value})


def test_a_zero_size_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"^GPULAYER_MAX_JOB_BYTES must be above 0, not 0$"):
        Settings.from_env({"GPULAYER_MAX_JOB_BYTES": "0"})
    with pytest.raises(ConfigError, match=r"^GPULAYER_KILL_GRACE_SECONDS must be 0 or more, not -1$"):
        Settings(kill_grace_seconds=-1)


def test_every_field_is_read_from_its_variable() -> None:
    # A field added without a way to read it fails here, not in a user's shell.
    for field in dataclasses.fields(Settings):
        assert callable(field.metadata["parse"]), field.name


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://localhost:99999/0", r"redis://localhost:99999/0 \(its port 99999 is over 65535\)"),
        ("redis://localhost:abc/0", r"redis://localhost:abc/0 \(its port 'abc' is not a number\)"),
        ("redis://user:s3cret@db:70000/0", r"redis://user:\*\*\*@db:70000/0 \(its port 70000"),
        ("http://db:6379/0", r"http://db:6379/0 \(expected redis://host:port/db"),
        ("redis://db:6379/0?db=x", r"redis://db:6379/0\?db=x \(Invalid value for 'db'"),
        (
            "redis+sentinel://u:s3cret@s1:26379,s2",
            r"redis\+sentinel://u:\*\*\*@s1:26379,s2 \(it names no master",
        ),
        (
            "redis+sentinel://s1:99999/gl",
            r"redis\+sentinel://s1:99999/gl \(the port of 's1:99999' is not a port",
        ),
        ("redis+sentinel://s1,,s2/gl", r"redis\+sentinel://s1,,s2/gl \(a sentinel's address is empty"),
        ("rediss+sentinel://s1/gl/x", r"rediss\+sentinel://s1/gl/x \(its database 'x' is not a number"),
        ("redis+sentinel://s1/gl?ssl=1", r"redis\+sentinel://s1/gl\?ssl=1 \(a Sentinel URL takes no options"),
    ],
)
def test_a_redis_url_redis_cannot_use_is_refused_in_one_line_without_its_password(
    url: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=f"^not a Redis URL: {message}") as from_env:
        Settings.from_env({"GPULAYER_REDIS_URL": url})
    with pytest.raises(ConfigError, match=f"^not a Redis URL: {message}"):
        Settings.from_env({}, redis_url=url)
    assert "s3cret" not in str(from_env.value)
    assert "\n" not in str(from_env.value)
    # The SDK's Client(url) does not go through Settings; the connection checks it the same way.
    with pytest.raises(ConfigError, match=f"^not a Redis URL: {message}"):
        gl.Client(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://db:6379/0",
        "rediss://u:p@db/1",
        "unix:///run/redis.sock",
        "redis://[::1]:6379",
        "redis+sentinel://u:p@s1:26379,s2,[::1]:26380/gl",
        "rediss+sentinel://s1/gl/0",
    ],
)
def test_the_redis_urls_redis_takes_are_kept(url: str) -> None:
    assert Settings(redis_url=url).redis_url == url


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().prefix = "other"  # type: ignore[misc]


def test_a_text_given_in_code_is_read_as_its_variable_would_be(tmp_path: Path) -> None:
    settings = Settings(home=str(tmp_path / "gl"), lease_ttl="30s", max_job_bytes="1MiB")  # type: ignore[arg-type]
    assert settings.home == tmp_path / "gl"
    assert (settings.lease_ttl, settings.max_job_bytes) == (30.0, 1024 * 1024)
    assert Settings(home="~/gl").home == Path("~/gl").expanduser()  # type: ignore[arg-type]


def test_a_text_that_cannot_be_read_raises_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="lease_ttl"):
        Settings(lease_ttl="soon")  # type: ignore[arg-type]
