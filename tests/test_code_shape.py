"""The shape the code keeps: complexity gates that stay on, with nothing let past them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_complexity_gates_are_on_and_nothing_escapes_them() -> None:
    config = (ROOT / "pyproject.toml").read_text()
    select = re.search(r"^select = \[(.*)\]$", config, re.MULTILINE)
    ignore = re.search(r"^ignore = \[(.*)\]$", config, re.MULTILINE)
    limit = re.search(r"^max-complexity = (\d+)$", config, re.MULTILINE)
    assert select is not None
    assert ignore is not None
    assert limit is not None
    assert {'"C90"', '"PL"'} <= {rule.strip() for rule in select.group(1).split(",")}
    assert not {"C901", "PLR0912", "PLR0915"} & set(re.findall(r"[A-Z]+\d+", ignore.group(1)))
    assert int(limit.group(1)) <= 13
    escapes = [
        path.relative_to(ROOT).as_posix()
        for path in sorted((ROOT / "gpulayer").rglob("*.py"))
        if re.search(r"noqa:[^\n]*\b(C901|PLR0912|PLR0915)\b", path.read_text())
    ]
    assert escapes == []


def test_the_worker_shares_how_a_job_ends_through_a_leaf_module() -> None:
    # The lease keeper needs the reasons a job stops, not the runner that stops it.
    leases = (ROOT / "gpulayer" / "worker" / "leases.py").read_text()
    endings = (ROOT / "gpulayer" / "worker" / "endings.py").read_text()
    assert "from .runner" not in leases
    assert not re.search(r"^from \.(?!\.)", endings, re.MULTILINE)


def test_the_worker_core_reads_in_one_sitting() -> None:
    # Short functions, and a job's kind is a launch the lifecycle composes, not a runner subclass.
    worker = ROOT / "gpulayer" / "worker"
    long = []
    for path in sorted(worker.glob("*.py")):
        tree = ast.parse(path.read_text())
        long += [
            f"{path.name}:{node.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and (node.end_lineno or 0) - node.lineno >= 60
        ]
        assert not re.search(r"^class \w+\(JobRunner\)", path.read_text(), re.MULTILINE), path.name
    assert long == []
    for client_side in ("client.py", "worker/worker.py"):
        assert not re.search(r"\w+Store\(", (ROOT / "gpulayer" / client_side).read_text()), client_side


def test_what_several_modules_need_is_written_once() -> None:
    # Each of these was once written out in several modules, and one copy drifted from the others
    # (issue 17): the socket helpers, the spool size, the job id's variable, the loop that retries a
    # submit whose random id was taken.
    package = ROOT / "gpulayer"
    sources = {path.relative_to(package).as_posix(): path.read_text() for path in package.rglob("*.py")}

    def where(pattern: str) -> list[str]:
        return sorted(name for name, text in sources.items() if re.search(pattern, text, re.MULTILINE))

    assert where(r"^def (free_port|address_towards|redact)\(") == ["network.py"]
    assert where(r"^_?SPOOL\w* = ") == ["archive.py"]
    assert where(r'"GPULAYER_JOB_ID"') == ["models.py"]
    assert where(r"token_hex\(6\)") == ["store/jobs.py"]


def test_no_module_passes_600_lines() -> None:
    package = ROOT / "gpulayer"
    over = {
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if len(path.read_text().splitlines()) > 600
    }
    assert over == set()
