"""Job specs: one-line reasons for what is refused, and a lossless round trip for what is accepted."""

from __future__ import annotations

import pytest

from gpulayer import InvalidJobSpec, JobSpec, JobState
from gpulayer.models import build_spec

OUTSIDE = "must be a path inside the job's folder (relative, no '..')"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"command": []}, "command: the command is empty"),
        ({"command": [""]}, "command: the command is empty"),
        ({"command": ["  ", "x"]}, "command: the command is empty"),
        ({"command": ["echo", "a\0b"]}, "command: the command holds a NUL byte"),
        ({"env": {"1BAD": "x"}}, "env: '1BAD' is not a valid environment variable name"),
        ({"env": {"A-B": "x"}}, "env: 'A-B' is not a valid environment variable name"),
        (
            {"env": {"GPULAYER_JOB_ID": "x"}},
            "env: GPULAYER_JOB_ID is set by the worker for each job; a job's env may not set it",
        ),
        (
            {"env": {"GPULAYER_ATTEMPT": "1"}},
            "env: GPULAYER_ATTEMPT is set by the worker for each job; a job's env may not set it",
        ),
        ({"env": {"FOO": "a\0"}}, "env: the value of FOO holds a NUL byte"),
        ({"outputs": ["/etc/passwd"]}, f"outputs: output '/etc/passwd' {OUTSIDE}"),
        ({"outputs": ["a/../../x"]}, f"outputs: output 'a/../../x' {OUTSIDE}"),
        ({"outputs": [".."]}, f"outputs: output '..' {OUTSIDE}"),
        ({"outputs": ["a\0"]}, "outputs: output pattern 'a\\x00' is empty or holds a NUL byte"),
        ({"outputs": [""]}, "outputs.0: String should have at least 1 character"),
        ({"name": "a\nb"}, "name: the name must be one line"),
        ({"name": "a\rb"}, "name: the name must be one line"),
        ({"timeout": -1}, "timeout: Input should be greater than 0"),
        ({"timeout": 0}, "timeout: Input should be greater than 0"),
        ({"gpus": 1}, "gpus: Extra inputs are not permitted"),
    ],
)
def test_an_invalid_spec_raises_one_line_naming_the_problem(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidJobSpec) as raised:
        build_spec(**{"command": ["true"], **fields})
    assert str(raised.value) == f"invalid job: {message}"
    assert "\n" not in str(raised.value)


def test_a_valid_spec_round_trips_through_json() -> None:
    spec = build_spec(
        command=["python", "train.py", "--lr", "0.1"],
        env={"OMP_NUM_THREADS": "4", "_X1": "ünïcode"},
        timeout=3600.5,
        name="train run",
        outputs=["model.pt", "logs/**/*.json"],
        source=True,
        inputs=["data", "config.yaml"],
    )
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec


def test_a_minimal_spec_has_empty_defaults() -> None:
    spec = build_spec(command=["true"])
    assert (spec.env, spec.timeout, spec.name, spec.outputs, spec.source, spec.inputs) == (
        {},
        None,
        None,
        [],
        False,
        [],
    )


#: State → (RQ's status for it, whether it is an end).
STATES = {
    JobState.QUEUED: ("queued", False),
    JobState.SCHEDULED: ("started", False),
    JobState.RUNNING: ("started", False),
    JobState.SUCCEEDED: ("finished", True),
    JobState.FAILED: ("failed", True),
    JobState.TIMED_OUT: ("failed", True),
    JobState.CANCELLED: ("canceled", True),
}


@pytest.mark.parametrize("state", list(JobState))
def test_each_state_maps_to_rq_status_and_knows_if_it_is_an_end(state: JobState) -> None:
    assert (state.rq_status, state.is_terminal) == STATES[state]
