"""Reading Sentinel URLs (pure logic): what every role's URL, the CLI and the SDK accept."""

from __future__ import annotations

import pytest
from redis.sentinel import MasterNotFoundError, Sentinel

from gpulayer import access as accesses
from gpulayer import sentinel
from gpulayer.errors import ConfigError
from gpulayer.installation import Installation, endpoint_of
from gpulayer.network import free_port, unreachable


def test_a_sentinel_url_names_its_sentinels_master_database_and_user() -> None:
    found = sentinel.parse("rediss+sentinel://gl-web:p%40ss@s1:26380,s2,[fd00::1]:26381/my%20master/0")
    assert found.sentinels == (("s1", 26380), ("s2", 26379), ("fd00::1", 26381))
    assert (found.master, found.db, found.username, found.password, found.tls) == (
        "my master",
        0,
        "gl-web",
        "p@ss",
        True,
    )
    assert sentinel.hosts_text(found.sentinels) == "s1:26380,s2:26379,[fd00::1]:26381"


def test_every_role_of_an_installation_on_sentinels_gets_a_sentinel_url_without_the_admins_password() -> None:
    endpoint = endpoint_of("redis+sentinel://default:nodes-secret@s1:26379,s2:26379/gl")
    assert endpoint == "redis+sentinel://s1:26379,s2:26379/gl"
    made = Installation.generate("gpulayer", endpoint)
    url = made.url("submitter")
    assert url.startswith("redis+sentinel://gpulayer-submitter:")
    assert url.endswith("@s1:26379,s2:26379/gl")
    assert sentinel.parse(url).password == made.passwords["submitter"]
    assert accesses.describe(made.access("viewer")) == (
        "viewer (Redis user gpulayer-viewer at master gl via sentinels s1:26379,s2:26379)"
    )
    with pytest.raises(ConfigError, match="--host does not apply to a Sentinel URL"):
        made.url("submitter", host="10.0.0.5")


def test_a_sentinel_url_naming_another_database_is_refused_as_a_plain_one_is() -> None:
    with pytest.raises(ConfigError, match=r"^redis\+sentinel://s1/gl/3 names database 3"):
        endpoint_of("redis+sentinel://s1/gl/3")


def test_no_sentinel_answering_is_said_in_one_line_without_the_clients_settings() -> None:
    watchers = Sentinel(
        [("127.0.0.1", free_port()), ("127.0.0.1", free_port())], sentinel_kwargs={"password": "s3cret"}
    )
    with pytest.raises(MasterNotFoundError) as raised:
        watchers.discover_master("gl")
    said = unreachable(raised.value)
    assert said.startswith("No master found for 'gl' : ")
    assert said.count("Connection refused") == 2
    assert "\n" not in said
    assert "<redis.client" not in said
    assert "s3cret" not in said
