"""Reading Sentinel URLs (pure logic): what every role's URL, the CLI and the SDK accept."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from gpulayer import access as accesses
from gpulayer import sentinel
from gpulayer.errors import ConfigError
from gpulayer.installation import Installation, endpoint_of
from gpulayer.store.connection import NoSentinelAnswered, connect


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


def test_no_sentinel_answering_is_said_at_once_in_one_line() -> None:
    # A client retries through a failover (the sentinels answer, naming no master yet), not when no
    # sentinel answers at all: a wrong URL or CA, which waiting does not mend. Each of these two
    # "sentinels" hangs up on whoever connects, and counts them.
    accepted = [0, 0]
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in accepted]
    for listener in listeners:
        listener.settimeout(0.2)

    def hang_up(index: int, listener: socket.socket, until: threading.Event) -> None:
        while not until.is_set():
            with contextlib.suppress(TimeoutError):
                listener.accept()[0].close()
                accepted[index] += 1

    done = threading.Event()
    threads = [
        threading.Thread(target=hang_up, args=(i, listener, done)) for i, listener in enumerate(listeners)
    ]
    for thread in threads:
        thread.start()
    hosts = ",".join(f"127.0.0.1:{listener.getsockname()[1]}" for listener in listeners)
    client = connect(f"redis+sentinel://u:s3cret@{hosts}/gl")
    try:
        with pytest.raises(NoSentinelAnswered) as raised:
            client.ping()
    finally:
        done.set()
        for thread in threads:
            thread.join()
        client.close()
    said = str(raised.value)
    for listener in listeners:
        assert f"127.0.0.1:{listener.getsockname()[1]}: " in said
        listener.close()
    assert said.startswith("no sentinel answered for master 'gl': 127.0.0.1:")
    assert "\n" not in said
    assert "s3cret" not in said
    assert accepted == [1, 1]  # asked once each: no retry
