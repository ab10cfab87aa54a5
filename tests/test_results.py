"""Results are data: a client unpickles a function's result through an allow-list, so a worker's
credentials (which sign results) cannot run code on it; ``allow_pickle=True`` trusts workers with code.

The red-team tests sign their payloads with the real result key of the session's installation, as
anyone holding a worker's join line can, and put them in place of a real job's result through the
worker's Redis user. Functions defined here travel by value, as a script's do.
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import datetime
import decimal
import io
import json
import os
import pickle
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import gpulayer as gl
from gpulayer import Client, Settings
from gpulayer import access as accesses
from gpulayer.payloads import ERROR, RESULT, dump_result, load_result
from gpulayer.signing import ResultSigner, SigningKey, WorkerKey, sign_result
from gpulayer.unpickling import OwnCode, Policy, Refused, loads_data

from .conftest import WAIT, Workers
from .test_sdk import run_script

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Call:
    """A pickle that calls ``function`` with ``args``: what a payload's ``__reduce__`` can name."""

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self.function = function
        self.args = args

    def __reduce__(self) -> Any:
        return self.function, self.args


def attacks(marker: Path) -> dict[str, tuple[str, bytes]]:
    """Payloads that create ``marker`` if anything of them runs, by what each calls."""
    touch = f"open({str(marker)!r}, 'w').close()"
    return {
        "os.system": ("system", pickle.dumps(Call(os.system, f"touch {marker}"))),
        "subprocess.Popen": (
            "subprocess.Popen",
            pickle.dumps(Call(subprocess.Popen, ["touch", str(marker)])),
        ),
        "exec": ("builtins.exec", pickle.dumps(Call(builtins.exec, touch))),
        "eval": ("builtins.eval", pickle.dumps(Call(builtins.eval, touch))),
        # Any function at all, here one that writes where it is told.
        "a function": ("makedirs", pickle.dumps(Call(os.makedirs, str(marker)))),
        "a class made": ("builtins.type", pickle.dumps(Call(type, "Made", (), {}))),
        "code by value": ("cloudpickle", cloudpickle.dumps(lambda: None)),
    }


ATTACKS = list(attacks(Path("unused")))


def square(x: int) -> int:
    return x * x


def fail(x: int) -> int:
    raise ValueError(f"bad {x}")


@pytest.fixture
def remote(client: Client, tmp_path: Path) -> Callable[..., Any]:
    def decorate(function: Callable[..., Any], **options: Any) -> Any:
        return gl.remote(function, client=client, source=tmp_path, **options)

    return decorate


def replace_result(home: Path, job_id: str, name: str, payload: bytes) -> None:
    """What anyone holding a worker's credentials can do: sign ``payload`` for the job's attempt with
    the result key of the worker that ran it (whose token this home holds), and put it in place of
    the job's result through that worker's Redis user."""
    worker = accesses.load(home, "worker")
    assert worker is not None
    assert worker.keyring.result_key is not None
    assert worker.identity is not None
    client = Client(settings=Settings(home=home), access=worker)
    try:
        attempt = client.get(job_id).status().attempt
        signer = ResultSigner(worker.identity, worker.keyring.result_key)
        signed = sign_result(signer, job_id, attempt, name, payload)
        outputs = client.keys.outputs(job_id)
        client.redis.delete(outputs)
        client.stores.artifacts.put_outputs(job_id, 0, name, io.BytesIO(signed))
        client.redis.rename(client.keys.staged_outputs(job_id, 0), outputs)
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.parametrize("attack", ATTACKS)
def test_a_result_signed_with_a_workers_key_that_calls_code_is_refused_naming_what_it_calls(
    attack: str, workers: Workers, remote: Callable[..., Any], home: Path, tmp_path: Path
) -> None:
    workers.start("w1", 1)
    handle = remote(square).remote(2)
    assert handle.result(timeout=WAIT) == 4
    marker = tmp_path / "pwned"
    named, payload = attacks(marker)[attack]
    replace_result(home, handle.id, RESULT, payload)
    with pytest.raises(
        gl.UnsafePickle, match=f"job {handle.id} returned a pickle that calls .*{named}"
    ) as refused:
        handle.result()
    assert "\n" not in str(refused.value)
    assert "allow_pickle=True" in str(refused.value)
    assert not marker.exists()


def returns_a_call(index: int, marker: Path) -> Any:
    """The second call returns what a hostile worker would: a pickle that calls ``os.system``."""
    return Call(os.system, f"touch {marker}") if index == 1 else index


@pytest.mark.slow
def test_map_refuses_a_result_that_calls_code_when_its_turn_comes_and_runs_nothing(
    workers: Workers, remote: Callable[..., Any], tmp_path: Path
) -> None:
    workers.start("w1", 2)
    marker = tmp_path / "pwned"
    results = remote(returns_a_call).starmap([(0, marker), (1, marker), (2, marker)])
    assert next(results) == 0
    with pytest.raises(gl.UnsafePickle, match=r"returned a pickle that calls posix\.system"):
        next(results)
    assert not marker.exists()


@pytest.mark.slow
def test_an_exception_whose_pickle_calls_code_comes_back_described_and_runs_nothing(
    workers: Workers, remote: Callable[..., Any], home: Path, tmp_path: Path
) -> None:
    workers.start("w1", 1)
    handle = remote(fail).remote(1)
    with pytest.raises(ValueError, match="bad 1"):
        handle.result(timeout=WAIT)
    marker = tmp_path / "pwned"
    report = {
        "type": "builtins.ValueError",
        "message": "bad 1",
        "traceback": "Traceback (most recent call last):\nValueError: bad 1\n",
        "exception": attacks(marker)["os.system"][1],
    }
    replace_result(home, handle.id, ERROR, pickle.dumps(report))
    with pytest.raises(gl.RemoteError) as described:
        handle.result()
    first_line = str(described.value).splitlines()[0]
    assert first_line.startswith("builtins.ValueError: bad 1 (not rebuilt here: its pickle calls ")
    assert "system, which is not data" in first_line
    assert "Remote traceback" in str(described.value)
    assert not marker.exists()
    # And a report whose own pickle calls code is refused whole.
    replace_result(home, handle.id, ERROR, attacks(marker)["exec"][1])
    with pytest.raises(gl.UnsafePickle, match=r"builtins\.exec"):
        handle.result()
    assert not marker.exists()


@dataclasses.dataclass
class Measured:
    """A data class of the caller's own (this module travels by value, as a script does)."""

    name: str
    value: float


def everything(_: object = None) -> dict[str, Any]:
    """Data of every kind the allow-list admits, made on the worker."""
    import numpy
    import pandas
    import torch

    return {
        "scalars": [1, 2.5, 3 + 4j, True, None, "text", b"bytes", bytearray(b"mutable"), ..., NotImplemented],
        "containers": ({"a": [1, (2, 3)]}, {4, 5}, frozenset({6}), slice(1, 9, 2), range(3), type(None)),
        "collections": [
            collections.OrderedDict(a=1),
            collections.deque([1, 2], maxlen=5),
            collections.Counter("aab"),
            collections.defaultdict(list, a=[1]),
        ],
        "stdlib": [
            datetime.datetime(2026, 12, 4, 12, tzinfo=datetime.timezone.utc),
            datetime.timedelta(seconds=5),
            decimal.Decimal("1.10"),
            uuid.UUID(int=7),
            Path("/data/run"),
        ],
        "exception": KeyError("missing"),
        "numpy": [numpy.arange(6, dtype=numpy.float32).reshape(2, 3), numpy.int64(7), numpy.dtype("<f8")],
        "torch": [
            torch.arange(4, dtype=torch.float32).reshape(2, 2),
            torch.nn.Parameter(torch.ones(2)),
            torch.Size([2, 3]),
            torch.bfloat16,
            torch.device("cpu"),
            torch.nn.Linear(2, 1).state_dict(),
        ],
        "pandas": pandas.DataFrame(
            {
                "name": ["a", "b"],
                "value": [1.5, 2.5],
                "when": pandas.date_range("2026-12-04", periods=2, tz="UTC"),
            }
        ),
        "mine": Measured("loss", 0.25),
    }


@pytest.mark.slow
def test_data_of_every_admitted_kind_round_trips_through_a_real_worker(
    workers: Workers, remote: Callable[..., Any]
) -> None:
    numpy = pytest.importorskip("numpy")
    pandas = pytest.importorskip("pandas")
    torch = pytest.importorskip("torch")
    workers.start("w1", 1)
    got = remote(everything).remote().result(timeout=WAIT)
    want = everything()
    for kind in ("scalars", "containers", "collections", "stdlib", "mine"):
        assert got[kind] == want[kind], kind
    assert isinstance(got["exception"], KeyError)
    assert got["exception"].args == ("missing",)
    array, scalar, dtype = got["numpy"]
    assert numpy.array_equal(array, want["numpy"][0])
    assert array.dtype == numpy.float32
    assert (scalar, dtype) == (numpy.int64(7), numpy.dtype("<f8"))
    tensor, parameter, size, dtype, device, state = got["torch"]
    assert torch.equal(tensor, want["torch"][0])
    assert isinstance(parameter, torch.nn.Parameter)
    assert parameter.requires_grad
    assert (size, dtype, device) == (torch.Size([2, 3]), torch.bfloat16, torch.device("cpu"))
    assert set(state) == {"weight", "bias"}
    pandas.testing.assert_frame_equal(got["pandas"], want["pandas"])
    assert type(got["mine"]) is Measured


def a_function(_: object = None) -> Callable[[int], int]:
    return lambda x: x + 1


@pytest.mark.slow
def test_allow_pickle_per_client_or_per_function_gets_code_back(
    workers: Workers, remote: Callable[..., Any], home: Path, tmp_path: Path
) -> None:
    workers.start("w1", 1)
    returns_code = remote(a_function)
    with pytest.raises(gl.UnsafePickle, match=r"cloudpickle.*code pickled by value"):
        returns_code.remote().result(timeout=WAIT)
    assert returns_code.options(allow_pickle=True).remote().result(timeout=WAIT)(1) == 2
    [returned] = returns_code.options(allow_pickle=True).map([None])
    assert returned(2) == 3
    trusting = Client(settings=Settings(home=home), allow_pickle=True)
    try:
        assert gl.remote(a_function, client=trusting, source=tmp_path).remote().result(timeout=WAIT)(3) == 4
        # A function's own choice wins over its client's.
        refusing = gl.remote(a_function, client=trusting, source=tmp_path, allow_pickle=False)
        with pytest.raises(gl.UnsafePickle):
            refusing.remote().result(timeout=WAIT)
    finally:
        trusting.close()


PROJECT_MODULE = """
import dataclasses, subprocess


@dataclasses.dataclass
class Point:
    x: int
    y: int


class ProjectError(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code


class Runner(subprocess.Popen):
    pass
"""

PROJECT_SCRIPT = """
import dataclasses, json, sys
import gpulayer as gl
from shapes import Point, ProjectError


@dataclasses.dataclass
class Local:
    label: str


@gl.remote
def from_module():
    return [Point(1, 2), Point(3, 4)]


@gl.remote
def from_script():
    return {"local": Local("here")}


@gl.remote
def raises():
    raise ProjectError(7)


@gl.remote
def defined_inside():
    @dataclasses.dataclass
    class Inner:
        n: int

    return Inner(1)


@gl.remote
def returns_popen_subclass():
    from shapes import Runner
    return Runner


def outcome(call):
    try:
        return repr(call())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    out = {
        "module": outcome(lambda: from_module.remote().result(timeout=60)),
        "module_type": type(from_module.remote().result(timeout=60)[0]) is Point,
        "script": outcome(lambda: from_script.remote().result(timeout=60)),
        "script_type": type(from_script.remote().result(timeout=60)["local"]) is Local,
        "raised": outcome(lambda: raises.remote().result(timeout=60)),
        "inside": outcome(lambda: defined_inside.remote().result(timeout=60)),
        "inside_allowed": outcome(
            lambda: defined_inside.options(allow_pickle=True).remote().result(timeout=60)
        ),
        "popen": outcome(lambda: returns_popen_subclass.remote().result(timeout=60)),
    }
    try:
        raises.remote().result(timeout=60)
    except ProjectError as exc:
        out["caught_code"] = exc.code
    json.dump(out, sys.stdout)
"""


@pytest.mark.slow
def test_a_projects_classes_come_back_as_themselves_and_what_it_cannot_name_is_refused_saying_why(
    workers: Workers, env: dict[str, str], tmp_path: Path
) -> None:
    workers.start("w1", 2)
    project = tmp_path / "project"
    project.mkdir()
    (project / "shapes.py").write_text(PROJECT_MODULE)
    (project / "main.py").write_text(PROJECT_SCRIPT)
    out = json.loads(run_script(project / "main.py", env).stdout)
    # A data class of a shipped module, and one of the script (sent by name, found here in __main__).
    assert out["module"] == "[Point(x=1, y=2), Point(x=3, y=4)]"
    assert out["module_type"] is True
    assert out["script"] == "{'local': Local(label='here')}"
    assert out["script_type"] is True
    # The project's exception is raised here as itself.
    assert out["raised"] == "ProjectError: 7"
    assert out["caught_code"] == 7
    # A class defined inside a function has no name to be found by: it would come as code.
    assert out["inside"].startswith("UnsafePickle: job ")
    assert "code pickled by value" in out["inside"]
    assert out["inside_allowed"].endswith("Inner(n=1)")
    # A class of the project is data only if what it derives from is.
    assert "whose base subprocess.Popen is not data" in out["popen"]


# --- the allow-list alone, no Redis ---------------------------------------------------------------
@pytest.fixture
def package(tmp_path: Path) -> Iterator[Path]:
    """A module of the caller's, ``ownmod``, on the path but not imported yet."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "ownmod.py").write_text("import os\nfrom subprocess import Popen\n\nclass Data:\n    pass\n")
    (folder / "othermod.py").write_text("class Data:\n    pass\n")
    sys.path.insert(0, str(folder))
    yield folder / "ownmod.py"
    sys.path.remove(str(folder))
    for name in ("ownmod", "othermod"):
        sys.modules.pop(name, None)


def global_pickle(module: str, name: str) -> bytes:
    """A pickle that only names ``module.name`` (protocol 4's STACK_GLOBAL)."""
    named = b"\x8c" + bytes([len(module)]) + module.encode() + b"\x8c" + bytes([len(name)]) + name.encode()
    return b"\x80\x04" + named + b"\x93."


def test_a_module_of_the_callers_gives_only_the_classes_it_defines(package: Path) -> None:
    policy = Policy(OwnCode(lambda: {package.resolve()}))
    assert "ownmod" not in sys.modules
    data = loads_data(global_pickle("ownmod", "Data"), policy)
    assert data.__module__ == "ownmod"  # imported, being the caller's
    for name in ("os.system", "Popen"):
        with pytest.raises(Refused, match=re.escape(f"ownmod.{name}, which is not data")):
            loads_data(global_pickle("ownmod", name), policy)
    # A module that is not the caller's is not even imported to look.
    with pytest.raises(Refused, match=r"othermod\.Data"):
        loads_data(global_pickle("othermod", "Data"), policy)
    assert "othermod" not in sys.modules


def test_data_loads_as_pickle_did_and_code_is_refused_before_it_runs(tmp_path: Path) -> None:
    policy = Policy(OwnCode(frozenset))
    value = {"a": [1, 2.5, None], "when": datetime.date(2026, 12, 4), "error": OSError(2, "gone")}
    assert repr(loads_data(dump_result(value), policy)) == repr(value)
    marker = tmp_path / "pwned"
    for named, payload in attacks(marker).values():
        with pytest.raises(Refused, match=named):
            loads_data(payload, policy)
    assert not marker.exists()
    # allow_pickle: the old arbitrary object, for workers trusted with code.
    assert loads_data(cloudpickle.dumps(lambda: 5), Policy(OwnCode(frozenset), allow_pickle=True))() == 5


def test_results_verify_before_unpickling_then_unpickle_as_data(tmp_path: Path) -> None:
    key = SigningKey.generate()
    signer, checker = ResultSigner("w1", key), WorkerKey("w1", key.public)
    policy = Policy(OwnCode(frozenset))
    marker = tmp_path / "pwned"
    signed = sign_result(signer, "job1", 1, RESULT, attacks(marker)["os.system"][1])
    with pytest.raises(
        gl.UnsafePickle, match=r"^job job1 returned a pickle that calls posix\.system, which is not"
    ):
        load_result(checker, "job1", 1, RESULT, signed, policy)
    with pytest.raises(gl.UntrustedPayload, match="not signed"):
        load_result(checker, "job2", 1, RESULT, signed, policy)
    assert not marker.exists()
