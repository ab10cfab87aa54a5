"""The documentation's links land: every relative link names a file that exists, and every anchor a
heading of the page it points into, spelled as GitHub spells it; the performance page's charts are
what benchmarks/charts.py draws from the recorded results."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
PERFORMANCE = ROOT / "docs" / "performance.md"
#: A Markdown link or image: its target, up to a closing parenthesis or a title.
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: Where another file names a section of the performance page.
PERFORMANCE_ANCHOR = re.compile(r"performance\.md#([\w-]+)")


def pages() -> list[Path]:
    """The Markdown the project writes (not the virtualenv's, not the skills' vendored ones)."""
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md"]
    found += sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "benchmarks").rglob("*.md"))
    return [page for page in found if page.is_file()]


def outside_code(text: str) -> str:
    """The page less its fenced code blocks and inline code, where nothing is a link or heading."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Each heading's anchor (a repeated one numbered, as GitHub does) and any explicit ``id``."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    seen: dict[str, int] = {}
    found = set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(outside_code(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            continue  # a URL (or an absolute path, which no page should hold: the other test says so)
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}: {target}"
        if not linked.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where} (no such heading)")
    return broken


def test_every_relative_link_in_the_docs_lands_on_a_file_and_a_heading() -> None:
    broken = [problem for page in pages() for problem in broken_links(page)]
    assert broken == []


def test_every_link_into_the_performance_page_names_one_of_its_sections() -> None:
    # Code and docstrings cite the page's sections too, outside any Markdown link.
    sources = [*pages(), *sorted((ROOT / "gpulayer").rglob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]
    sources += sorted((ROOT / "benchmarks").glob("*.py"))
    cited = {
        (source.relative_to(ROOT).as_posix(), anchor)
        for source in sources
        if source != Path(__file__).resolve()
        for anchor in PERFORMANCE_ANCHOR.findall(source.read_text())
    }
    assert cited, "the other pages link into the performance page's sections"
    assert sorted(where for where in cited if where[1] not in anchors(PERFORMANCE)) == []


def test_the_files_pyproject_cites_exist() -> None:
    cited = re.findall(r"#.*?\b([\w/]+\.(?:md|py))\b", (ROOT / "pyproject.toml").read_text())
    assert "CONTRIBUTING.md" in cited
    assert [name for name in cited if not (ROOT / name).is_file()] == []


def test_the_docs_name_no_path_of_one_machine() -> None:
    named = [
        page.relative_to(ROOT).as_posix()
        for page in pages()
        if re.search(r"(?<![\w.])/(?:home|work|Users|tmp/pytest)/\w", outside_code(page.read_text()))
    ]
    assert named == []


def test_the_performance_charts_are_what_the_recorded_results_draw() -> None:
    checked = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "charts.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr


def test_every_chart_the_performance_page_shows_is_an_svg_it_alone_draws() -> None:
    shown = re.findall(r"!\[[^\]]*\]\((charts/[\w.-]+\.svg)\)", PERFORMANCE.read_text())
    charts = sorted(path.name for path in (ROOT / "docs" / "charts").glob("*.svg"))
    assert sorted(Path(chart).name for chart in shown) == charts, "each chart shown once, none left out"
    for chart in charts:
        root = ElementTree.parse(ROOT / "docs" / "charts" / chart).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg", chart
        assert root.find("{http://www.w3.org/2000/svg}text") is not None, chart


def test_the_lab_notebook_keeps_every_dated_entry() -> None:
    # The performance page is the reference; the history of how its numbers came about is kept.
    history = (ROOT / "benchmarks" / "results" / "HISTORY.md").read_text()
    dated = re.findall(r"^### 2026-\d\d-\d\d", history, re.MULTILINE)
    assert len(dated) >= 15
    assert "[docs/performance.md](../../docs/performance.md)" in history
