"""Access tokens from `gpulayer access export --host` to `gpulayer connect`: the host given as HOST,
HOST:PORT or [v6]:PORT, and a token kept only once it is shown to reach its installation."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gpulayer import access as accesses
from gpulayer.errors import ConfigError
from gpulayer.installation import Installation
from gpulayer.network import free_port
from tests.conftest import gpulayer


def connect_with(token: str, env: dict[str, str], home: Path) -> tuple[int, str]:
    done = gpulayer({**env, "GPULAYER_HOME": str(home)}, "connect", "--token-file", "-", input=token)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("host", "where"),
    [
        ("10.0.0.5", "10.0.0.5:{port}"),
        ("10.0.0.5:7000", "10.0.0.5:7000"),
        ("gpu-box.lan:7000", "gpu-box.lan:7000"),
        ("[fd00::1]:7000", "[fd00::1]:7000"),
        ("[fd00::1]", "[fd00::1]:{port}"),
        ("fd00::1", "[fd00::1]:{port}"),
    ],
)
def test_a_host_for_other_machines_is_host_host_port_or_v6_port(
    installation: Installation, host: str, where: str
) -> None:
    port = urlsplit(installation.endpoint).port
    url = installation.access("submitter", host).redis_url
    assert url.rpartition("@")[2] == where.format(port=port) + "/0"


@pytest.mark.parametrize("host", ["[fd00::1", "[fd00::1]7000", "gpu-box:port", "gpu-box:70000", ":7000"])
def test_a_host_that_is_no_address_is_one_line_naming_the_option(
    installation: Installation, host: str
) -> None:
    with pytest.raises(ConfigError, match=r"^--host: "):
        installation.access("submitter", host)


def test_a_token_exported_with_host_and_port_is_kept_by_connect_and_every_command_then_works(
    admin_env: dict[str, str], env: dict[str, str], installation: Installation, tmp_path: Path
) -> None:
    port = urlsplit(installation.endpoint).port
    exported = gpulayer(admin_env, "access", "export", "submitter", "--host", f"127.0.0.1:{port}")
    assert exported.returncode == 0, exported.stderr

    laptop = tmp_path / "laptop"
    code, said = connect_with(exported.stdout, env, laptop)
    assert code == 0, said
    assert f"at redis://127.0.0.1:{port}" in said
    listed = gpulayer({**env, "GPULAYER_HOME": str(laptop)}, "jobs")
    assert listed.returncode == 0, listed.stderr


def test_connect_keeps_nothing_from_a_token_that_cannot_reach_its_installation(
    admin_env: dict[str, str], env: dict[str, str], installation: Installation, tmp_path: Path
) -> None:
    nowhere = gpulayer(admin_env, "access", "export", "submitter", "--host", f"127.0.0.1:{free_port()}")
    assert nowhere.returncode == 0, nowhere.stderr
    viewer = installation.access("viewer")
    wrong_password = viewer.with_url(viewer.redis_url.replace(installation.passwords["viewer"], "wrong"))
    for token in (nowhere.stdout, wrong_password.token()):
        laptop = tmp_path / "laptop"
        code, said = connect_with(token, env, laptop)
        assert code != 0
        assert "nothing kept" in said, said
        assert len(said.strip().splitlines()) == 1, said
        assert "Traceback" not in said
        assert sorted(accesses.folder(laptop).glob("*")) == []
