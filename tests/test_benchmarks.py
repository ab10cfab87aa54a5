"""The benchmarks whose figures the README quotes still run: each, short, against its own Redis."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
# The benchmarks import each other by their file names, as scripts run from their folder do;
# appended, so that nothing there shadows a module the other tests import.
sys.path.append(str(BENCHMARKS))

import placement_scale  # noqa: E402


@pytest.mark.slow
def test_placement_scale_runs_short_and_saves_each_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "placement_scale.json"

    def save(name: str, result: dict[str, object]) -> Path:  # not over the recorded results
        saved.write_text(json.dumps(result))
        return saved

    monkeypatch.setattr(placement_scale, "save", save)
    monkeypatch.setattr(sys, "argv", ["placement_scale.py", "--jobs", "1000", "--workers", "5"])
    placement_scale.main()
    result = json.loads(saved.read_text())
    assert set(result["gpulayer"]["1000"]) == {"submit_ms", "claim_ms", "plan_ms"}
    assert set(result["rq"]["1000"]) == {"submit_ms", "claim_ms"}
