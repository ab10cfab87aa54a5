"""Jobs that bring their own Python environment: built by the worker with uv, once per machine, from a
folder of wheels written here (uv is pointed at it, and at no index: nothing is downloaded)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import cloudpickle
import pytest
import redis
import uv
from click.testing import Result

import gpulayer as gl
from gpulayer import Client, JobState, Settings
from gpulayer.environments import PythonEnvironment, requirements_file_lines
from gpulayer.errors import InvalidJobSpec
from gpulayer.options import SubmitOptions
from gpulayer.profiles import profiles
from gpulayer.submits import command_spec, environment, options_and_needs
from gpulayer.worker.env_builds import READY, EnvironmentCache, Failed, Ready
from tests.conftest import WAIT, Hub, Workers

# The functions of this module travel by value, as a script's would.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: What a job prints to say where it runs: the package's value and its Python's prefix.
PROBE = "import glprobe, sys; print(glprobe.VALUE, sys.prefix)"


def write_wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of package ``name``, whose ``VALUE`` is its version, written by hand."""
    dist = f"{name}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    wheel_info = "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", f"VALUE = {version!r}\n")
        wheel.writestr(
            f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        wheel.writestr(f"{dist}.dist-info/WHEEL", wheel_info)
        wheel.writestr(f"{dist}.dist-info/RECORD", "")
    return path


@pytest.fixture
def cache(env: dict[str, str], tmp_path: Path) -> Path:
    """The workers' environment cache; uv finds packages only among the wheels written here."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("1.0", "2.0", "3.0", "4.0"):
        write_wheel(wheels, "glprobe", version)
    root = tmp_path / "envs"
    env.update(
        GPULAYER_ENV_CACHE=str(root),
        UV_FIND_LINKS=str(wheels),
        UV_NO_INDEX="1",
        UV_OFFLINE="1",
        UV_CACHE_DIR=str(tmp_path / "uv-cache"),
    )
    return root


def built(job: gl.Job) -> list[str]:
    """What the job's log says of its environment: ``built`` or ``found``."""
    return [
        line.text.split()[3]
        for line in job.logs()
        if line.stream == "system" and line.text.startswith("Python environment ")
    ]


def stdout(job: gl.Job) -> list[str]:
    return [line.text for line in job.logs() if line.stream == "stdout"]


def test_a_job_with_pip_runs_with_the_package_and_the_next_one_finds_it_built(
    client: Client, workers: Workers, cache: Path
) -> None:
    workers.start()
    first = client.submit(["python3", "-c", PROBE], pip=["glprobe==1.0"])
    assert first.wait(WAIT).state is JobState.SUCCEEDED, stdout(first)
    [(value, prefix)] = [line.split() for line in stdout(first)]
    assert value == "1.0"
    assert Path(prefix).parent == cache
    assert built(first) == ["built"]
    # The worker's own Python is untouched.
    assert importlib.util.find_spec("glprobe") is None
    plain = client.submit(["python3", "-c", "import sys; print(sys.prefix)"])
    assert plain.wait(WAIT).state is JobState.SUCCEEDED
    assert Path(stdout(plain)[0]).parent != cache

    again = client.submit(
        ["python", "-c", PROBE + "; import os; print(os.environ['VIRTUAL_ENV'])"], pip=["glprobe==1.0"]
    )
    assert again.wait(WAIT).state is JobState.SUCCEEDED
    assert built(again) == ["found"]
    assert stdout(again)[1] == prefix
    assert stdout(again)[0].split() == ["1.0", prefix]


def test_concurrent_first_jobs_of_one_environment_on_two_workers_build_it_once(
    client: Client, workers: Workers, cache: Path
) -> None:
    workers.start("w1", 3)
    workers.start("w2", 3)
    jobs = client.submit_many([["python3", "-c", PROBE]] * 6, pip=["glprobe==2.0"])
    for job in jobs:
        assert job.wait(WAIT).state is JobState.SUCCEEDED, stdout(job)
        assert stdout(job)[0].startswith("2.0 ")
    said = sorted(word for job in jobs for word in built(job))
    assert said == ["built"] + ["found"] * 5
    assert len([folder for folder in cache.iterdir() if not folder.name.startswith(".")]) == 1


def test_a_build_that_fails_ends_the_job_failed_with_uvs_error_and_its_report_in_the_log(
    client: Client, workers: Workers, cache: Path
) -> None:
    workers.start()
    job = client.submit(["true"], pip=["glnowhere==1.0"])
    record = job.wait(WAIT)
    assert record.state is JobState.FAILED
    assert record.reason is not None
    assert record.reason.startswith("cannot build its Python environment: error: ")
    assert "glnowhere" in record.reason
    assert "\n" not in record.reason
    logged = "\n".join(line.text for line in job.logs())
    assert "uv said:" in logged
    assert "glnowhere was not found" in logged
    # Nothing half built is left to be found by the next job.
    assert [folder.name for folder in cache.iterdir()] == [".locks"]


def test_a_remote_function_with_pip_runs_in_its_environment(
    client: Client, workers: Workers, cache: Path, tmp_path: Path
) -> None:
    workers.start()
    probe = gl.remote(where_it_runs, client=client, source=tmp_path, pip=["glprobe==3.0"])
    value, prefix = probe.remote().result(timeout=WAIT)
    assert value == "3.0"
    assert Path(prefix).parent == cache
    # The next call goes to the same warm executor; a call without the environment, to another.
    assert probe.remote().result(timeout=WAIT) == (value, prefix)
    plain = gl.remote(sys_prefix, client=client, source=tmp_path)
    assert Path(plain.remote().result(timeout=WAIT)).parent != cache


def where_it_runs() -> tuple[str, str]:
    import glprobe  # type: ignore[import-not-found]

    return str(glprobe.VALUE), sys.prefix


def sys_prefix() -> str:
    return sys.prefix


def test_an_environment_rewritten_with_a_workers_credentials_is_refused(
    client: Client, workers: Workers, cache: Path, session_hub: Hub
) -> None:
    job = client.submit(["python3", "-c", PROBE], pip=["glprobe==1.0"])
    as_worker = redis.Redis.from_url(session_hub.worker.redis_url, socket_timeout=5)
    key = client.keys.job(job.id)
    spec = json.loads(as_worker.hget(key, "gl_spec") or b"{}")
    spec["environment"] = {"requirements": ["glprobe==4.0"]}
    as_worker.hset(key, "gl_spec", json.dumps(spec))
    workers.start("w1", 1)
    record = job.wait(WAIT)
    assert record.state is JobState.FAILED
    assert record.reason == "refused: the job's signature does not match it; it was not run"
    assert not cache.exists() or [folder.name for folder in cache.iterdir()] == []


def test_a_profile_of_ones_own_sets_its_accelerator_and_packages_and_options_given_win(
    home: Path, workers: Workers, cache: Path, tmp_path: Path
) -> None:
    mine = tmp_path / "profiles.toml"
    mine.write_text('[probe]\ndescription = "the probe"\naccelerator = "cpu"\npip = ["glprobe==1.0"]\n')
    client = Client(settings=Settings(home=home, profiles=mine))
    workers.start()
    job = client.submit(["python3", "-c", PROBE], profile="probe")
    assert job.wait(WAIT).state is JobState.SUCCEEDED
    assert stdout(job)[0].startswith("1.0 ")
    pinned = client.submit(["python3", "-c", PROBE], profile="probe", pip=["glprobe==4.0"])
    assert pinned.wait(WAIT).state is JobState.SUCCEEDED
    assert stdout(pinned)[0].startswith("4.0 ")
    assert pinned.status().spec.environment == PythonEnvironment(requirements=("glprobe==4.0",))
    client.close()


# --- the spec, without a worker ----------------------------------------------------------------------
def spec_of(profiles_file: Path | None = None, **keywords: object) -> gl.JobSpec:
    options, needs = options_and_needs(None, None, keywords, profiles_file)
    return command_spec(["true"], options, needs, environment=environment(options, None, profiles_file))


def test_pip_specs_are_the_environments_and_never_the_workers_frameworks() -> None:
    spec = spec_of(pip=["torch==2.5.1", "Six>=1.16 ; python_version >= '3'"])
    assert spec.requirements.frameworks == ()
    assert spec.requirements.is_default
    assert spec.environment is not None
    assert spec.environment.requirements == ('Six>=1.16; python_version >= "3"', "torch==2.5.1")


def test_each_builtin_profile_sets_what_gpulayer_profiles_says_and_says_where_it_was_tested() -> None:
    table = profiles()
    assert {"cpu", "pytorch-cpu", "pytorch-cuda", "pytorch-mps", "jax-cuda", "cupy-cuda", "mlx"} <= set(table)
    cuda = spec_of(profile="pytorch-cuda")
    assert (cuda.requirements.accelerator, cuda.requirements.gpus) == ("cuda", 1)
    assert cuda.environment == PythonEnvironment(requirements=("torch",))
    assert spec_of(profile="cpu").environment is None
    # Options given beside it win: another accelerator, another torch.
    mps = spec_of(profile="pytorch-cuda", accelerator="mps", pip=["torch==2.5.1", "numpy"])
    assert mps.requirements.accelerator == "mps"
    assert mps.environment == PythonEnvironment(requirements=("numpy", "torch==2.5.1"))
    assert all(found.tested for found in table.values())
    with pytest.raises(InvalidJobSpec, match=r"no profile 'nope' \(there are cpu, "):
        spec_of(profile="nope")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"pip": ["six @ https://example.invalid/six.whl"]}, "names a URL"),
        ({"pip": ["not a requirement!"]}, "is not a requirement"),
        ({"requirements_text": "six\n--index-url https://example.invalid/simple\n"}, "no options"),
        ({"requirements_text": "-r other.txt\n"}, "no options"),
        ({"project_env": True}, "it needs a source folder"),
    ],
)
def test_an_environment_naming_a_host_a_file_or_an_option_is_refused_at_submit(
    given: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidJobSpec, match=message):
        spec_of(**given)


def test_a_requirements_files_text_and_a_projects_dependencies_make_the_environment(tmp_path: Path) -> None:
    text = "# pinned\nsix==1.16.0  # why\n\nidna\\\n>=3\n"
    assert requirements_file_lines(text) == ["six==1.16.0", "idna >=3"]
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\nversion = "1"\ndependencies = ["idna>=3"]\n'
    )
    options = SubmitOptions(project_env=True, requirements_text="six==1.16.0\n")
    assert environment(options, tmp_path) == PythonEnvironment(requirements=("idna>=3", "six==1.16.0"))


def test_a_projects_uv_lock_gives_its_pinned_packages(
    tmp_path: Path, cache: Path, env: dict[str, str]
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\nversion = "1"\nrequires-python = ">=3.10"\ndependencies = ["glprobe>=2"]\n'
    )
    subprocess.run([uv.find_uv_bin(), "lock", "--quiet", "--directory", str(tmp_path)], env=env, check=True)
    found = environment(SubmitOptions(project_env=True), tmp_path)
    assert found == PythonEnvironment(requirements=("glprobe==4.0",))


def test_submit_reads_the_requirements_file_it_is_given_into_the_job(
    cli: Callable[..., Result], client: Client, tmp_path: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# pinned\nglprobe==1.0\n")
    result = cli("submit", "--requirements", str(requirements), "--pip", "idna", "--", "true")
    assert result.exit_code == 0, result.output
    spec = client.get(result.output.split()[0]).status().spec
    assert spec.environment == PythonEnvironment(requirements=("glprobe==1.0", "idna"))


def test_gpulayer_profiles_lists_each_with_what_it_sets_and_where_it_was_tested(
    cli: Callable[..., Result],
) -> None:
    result = cli("profiles")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["cpu", "accelerator", "cpu"]
    assert "tested here: CPU only" in lines[2]
    assert any(line.split()[:4] == ["pytorch-cuda", "accelerator", "cuda,", "pip"] for line in lines)


def test_past_its_size_the_cache_removes_the_least_recently_used_but_none_in_use(tmp_path: Path) -> None:
    """The worker's cache itself, with real uv builds: each build makes room by removing the
    environments used longest ago (past a minute), never the one just built or one a job holds."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("1.0", "2.0", "3.0"):
        write_wheel(wheels, "glprobe", version)
    environ = {
        **os.environ,
        "UV_FIND_LINKS": str(wheels),
        "UV_NO_INDEX": "1",
        "UV_OFFLINE": "1",
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
    }
    cache = EnvironmentCache(tmp_path / "envs", max_bytes=1, timeout=120, environ=environ)
    said: list[str] = []

    def of(version: str) -> PythonEnvironment:
        return PythonEnvironment(requirements=[f"glprobe=={version}"])

    def aged(ready: Ready | Failed) -> Path:
        assert isinstance(ready, Ready), ready
        long_ago = time.time() - 3600
        os.utime(ready.folder / READY, (long_ago, long_ago))
        return ready.folder

    with cache.held(of("1.0"), said.append) as first:
        oldest = aged(first)
    with cache.held(of("2.0"), said.append) as second:  # over the size: 1.0, unused, goes
        held = aged(second)
        assert not oldest.exists()
        with cache.held(of("3.0"), said.append) as third:  # 2.0 is held by a job: it stays
            assert isinstance(third, Ready)
            assert held.exists()
    assert cache.builds == 3
