"""Draws the charts of docs/performance.md from the recorded results: one small SVG per chart, written
into docs/charts/, from benchmarks/results/*.json and nothing else (no plotting library, no clock, no
randomness), so the same results always make the same bytes.

    .venv/bin/python benchmarks/charts.py            # redraw every chart after a benchmark's run
    .venv/bin/python benchmarks/charts.py --check    # exit 1, naming any chart the results no longer make
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CHARTS = HERE.parent / "docs" / "charts"

#: GPUlayer's bars, the peers' bars, and the parts of a stacked bar, in order.
OURS, PEER = "#2f6fd1", "#9aa4ae"
PARTS = ("#2f6fd1", "#7fb3f0", "#e39b3b", "#5aa469", "#b07cc6")
INK, FAINT, GRID = "#24292f", "#57606a", "#d0d7de"

WIDTH, LABEL_W, VALUE_W, ROW, TOP, PAD = 720, 300, 90, 24, 46, 12


@dataclasses.dataclass(frozen=True)
class Bar:
    label: str
    #: One value, or the parts of a stacked bar (drawn left to right in ``Chart.parts``' order).
    values: tuple[float, ...]
    #: GPUlayer's (drawn in colour) or a peer's (grey); a stacked bar uses the parts' colours.
    ours: bool = True


@dataclasses.dataclass(frozen=True)
class Chart:
    """A chart as drawn."""

    name: str
    title: str
    unit: str
    bars: tuple[Bar, ...]
    #: The results file the bars come from, and the date of that run: the chart's footnote.
    source: str
    #: "higher is better" or "lower is better", and anything else to read it by: under the title.
    better: str
    #: The names of the parts of stacked bars; empty for plain bars.
    parts: tuple[str, ...] = ()


Data = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Spec:
    """A chart as declared: what it shows, and how its bars come out of one results file."""

    name: str
    results_file: str
    #: The title and what is better may name the results file's top-level values (``{calls}``).
    title: str
    unit: str
    better: str
    bars: Callable[[Data], list[Bar]]
    parts: tuple[str, ...] = ()

    def chart(self, data: Data) -> Chart:
        machine = data.get("machine", {})
        source = f"benchmarks/results/{self.results_file}.json, {machine.get('date', '?')}, "
        source += f"{machine.get('cpus', '?')} CPUs"
        bars = tuple(self.bars(data))
        title, better = self.title.format(**data), self.better.format(**data)
        return Chart(self.name, title, self.unit, bars, source, better, self.parts)


def number(value: float) -> str:
    """A value as the page writes it: thousands with a comma, small values to two or three figures."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def pretty(name: str) -> str:
    """A results file's row name as the page spells it."""
    for raw, spelled in (("gpulayer", "GPUlayer"), ("dramatiq", "Dramatiq"), ("rq ", "RQ ")):
        if name.startswith(raw):
            return spelled + name[len(raw) :]
    return name


def rows(section: str, field: str | None = None) -> Callable[[Data], list[Bar]]:
    """A bar per row of a section of a results file, GPUlayer's rows in colour: the row's ``field``
    (a row without it is left out), or the row itself if ``field`` is None."""

    def bars(data: Data) -> list[Bar]:
        return [
            Bar(name, (row if field is None else row[field],), name.startswith("gpulayer"))
            for name, row in data[section].items()
            if field is None or field in row
        ]

    return bars


CPU_PARTS = ("cpu_ms_worker", "cpu_ms_jobs", "cpu_ms_redis", "cpu_ms_client")


def cpu_parts(data: Data) -> list[Bar]:
    return [
        Bar(name, tuple(row[part] for part in CPU_PARTS))
        for name, row in data["end_to_end"].items()
        if all(part in row for part in CPU_PARTS)
    ]


def worker_parts(data: Data) -> list[Bar]:
    return [
        Bar(name, (ms,))
        for name, ms in sorted(data["parts_ms"].items(), key=lambda item: (-item[1], item[0]))
    ]


def map_rates(data: Data) -> list[Bar]:
    dramatiq = Bar("dramatiq, 2 processes x 4 threads", (data["dramatiq"]["calls_per_s"],), False)
    return [*rows("runs", "calls_per_s")(data), dramatiq]


def script_call_costs(data: Data) -> list[Bar]:
    calls = data["redis_us_per_call"]
    return [Bar("FCALL", (calls["fcall"],)), Bar("EVALSHA (before)", (calls["evalsha"],), False)]


def claims(data: Data) -> list[Bar]:
    bars = []
    for depth in sorted(data["gpulayer"], key=int):
        bars.append(Bar(f"GPUlayer claim, {int(depth):,} queued", (data["gpulayer"][depth]["claim_ms"],)))
        bars.append(Bar(f"RQ dequeue_any, {int(depth):,} queued", (data["rq"][depth]["claim_ms"],), False))
    return bars


def failover_times(data: Data) -> list[Bar]:
    median = data["median"]
    return [
        Bar("the sentinels name the new master", (median["sentinels_s"],), False),
        Bar("the first new job starts", (median["first_new_job_started_s"],)),
        Bar("the interrupted jobs have ended", (median["interrupted_jobs_done_s"],)),
    ]


GANG_ROWS = {
    "gpulayer_direct": "GPUlayer, direct launcher",
    "gpulayer_torchrun": "GPUlayer, torchrun launcher",
    "processes_by_hand": "4 processes started by hand",
    "torchrun_by_hand": "torchrun started by hand",
}


def gang_starts(data: Data) -> list[Bar]:
    summary = data["summary"]
    return [
        Bar(label, (summary[key]["p50_s"] * 1000,), key.startswith("gpulayer"))
        for key, label in GANG_ROWS.items()
    ]


def api_rates(data: Data) -> list[Bar]:
    bars = []
    for what in ("listing", "submit"):
        bars.append(Bar(f"{what} through the HTTP API", (data[what]["per_s"],)))
        bars.append(Bar(f"{what} by the Python client", (data[what]["direct_per_s"],), False))
    return bars


TRAINER_ROWS = {
    "plain": "plain PyTorch loop",
    "trainer": "Trainer",
    "trainer_defaults": "Trainer, defaults",
    "lightning": "Lightning",  # in a run where Lightning was importable
}


def trainer_steps(data: Data) -> list[Bar]:
    steps = data["us_per_step"]
    return [
        Bar(label, (steps[key] / 1000,), key != "plain")
        for key, label in TRAINER_ROWS.items()
        if key in steps
    ]


LOWER, HIGHER = "lower is better", "higher is better"

SPECS = (
    Spec(
        "end_to_end",
        "core_throughput",
        "Short command jobs end to end: a submit loop, then a wait on each",
        "jobs/s",
        f"{HIGHER}; two workers on the same 2 cores as the client and Redis",
        rows("end_to_end", "jobs_per_s"),
    ),
    Spec(
        "cpu_per_job",
        "core_throughput",
        "Where a short job's CPU goes, end to end",
        "ms of CPU per job",
        LOWER,
        cpu_parts,
        ("workers", "the job (true)", "Redis", "client"),
    ),
    Spec(
        "drain",
        "core_throughput",
        "2,000 queued jobs of true drained by two workers",
        "jobs/s",
        HIGHER,
        rows("throughput", "jobs_per_s"),
    ),
    Spec(
        "idle_dispatch",
        "core_throughput",
        "Submit to start on an idle worker, p50",
        "ms",
        LOWER,
        rows("idle_latency", "p50_ms"),
    ),
    Spec(
        "worker_profile",
        "worker_profile",
        "A worker's own CPU per short job, part by part",
        "ms",
        f"{LOWER}; {{worker_cpu_ms_per_job:.2f}} ms in all",
        worker_parts,
    ),
    Spec(
        "remote_functions",
        "sdk_map",
        ".map over {calls:,} no-op calls on two workers",
        "calls/s",
        HIGHER,
        map_rates,
    ),
    Spec(
        "cpu_sweep",
        "cpu_sweep",
        "{calls} calls of a {size} x {size} ridge fit",
        "s",
        LOWER,
        rows("seconds"),
    ),
    Spec(
        "script_calls",
        "script_calls",
        "Redis's CPU per script call: the function library against EVALSHA",
        "µs",
        LOWER,
        script_call_costs,
    ),
    Spec(
        "placement",
        "placement_scale",
        "A claim over 50 queues, {workers:,} workers registered",
        "ms",
        f"{LOWER}; GPUlayer's claim also places the job on GPUs, slots and memory",
        claims,
    ),
    Spec(
        "recovery",
        "recovery",
        "A worker's machine dies: until its job runs again elsewhere, p50",
        "s",
        LOWER,
        rows("results", "p50_s"),
    ),
    Spec(
        "failover",
        "failover",
        "From the Redis master's SIGKILL, median of the trials",
        "s",
        f"{LOWER}; the sentinels' own switch is the floor",
        failover_times,
    ),
    Spec(
        "gang_start",
        "gang_start",
        "A {world} gang job from submit until every rank runs, p50",
        "ms",
        LOWER,
        gang_starts,
    ),
    Spec(
        "api_load",
        "api_load",
        "The HTTP API under {clients} clients, {jobs_in_redis:,} jobs in Redis",
        "requests/s",
        f"{HIGHER}; the client goes straight to Redis",
        api_rates,
    ),
    Spec(
        "trainer",
        "trainer_overhead",
        "Per training step on the CPU, median of interleaved runs",
        "ms",
        LOWER,
        trainer_steps,
    ),
)


def render(chart: Chart) -> str:
    """The chart as an SVG document: a title, what is better, a row per bar, a legend for parts."""
    longest = max(sum(bar.values) for bar in chart.bars) or 1.0
    scale = (WIDTH - LABEL_W - VALUE_W - PAD) / longest
    legend = 22 if chart.parts else 0
    height = TOP + legend + ROW * len(chart.bars) + 30
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="-apple-system, Segoe UI, Helvetica, Arial, sans-serif" '
        f'font-size="13" role="img" aria-label="{escape(chart.title)}">',
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        f'<text x="{PAD}" y="20" font-size="15" font-weight="600" fill="{INK}">{escape(chart.title)}</text>',
        f'<text x="{PAD}" y="37" fill="{FAINT}">{escape(chart.unit)}, {escape(chart.better)}</text>',
    ]
    x = PAD
    for index, name in enumerate(chart.parts):
        colour = PARTS[index % len(PARTS)]
        lines.append(f'<rect x="{x}" y="{TOP + 2}" width="11" height="11" fill="{colour}"/>')
        lines.append(f'<text x="{x + 16}" y="{TOP + 12}" fill="{INK}">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    for row, bar in enumerate(chart.bars):
        y = TOP + legend + row * ROW
        label = escape(pretty(bar.label))
        lines.append(f'<text x="{LABEL_W - 8}" y="{y + 16}" text-anchor="end" fill="{INK}">{label}</text>')
        left = float(LABEL_W)
        for index, value in enumerate(bar.values):
            colour = PARTS[index % len(PARTS)] if chart.parts else (OURS if bar.ours else PEER)
            width = value * scale
            lines.append(
                f'<rect x="{left:.1f}" y="{y + 4}" width="{width:.1f}" height="{ROW - 8}" fill="{colour}"/>'
            )
            left += width
        lines.append(f'<text x="{left + 6:.1f}" y="{y + 16}" fill="{INK}">{number(sum(bar.values))}</text>')
    bottom = TOP + legend + ROW * len(chart.bars)
    lines.append(f'<line x1="{LABEL_W}" y1="{TOP + legend}" x2="{LABEL_W}" y2="{bottom}" stroke="{GRID}"/>')
    lines.append(
        f'<text x="{PAD}" y="{bottom + 20}" font-size="11" fill="{FAINT}">{escape(chart.source)}</text>'
    )
    lines.append("</svg>")
    return "\n".join(lines) + "\n"


def charts(results_dir: Path = RESULTS) -> dict[str, str]:
    """Each chart's file name and its SVG, made from the results in ``results_dir``."""

    def results(name: str) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((results_dir / f"{name}.json").read_text())
        return loaded

    return {f"{spec.name}.svg": render(spec.chart(results(spec.results_file))) for spec in SPECS}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results' folder")
    parser.add_argument("--out", type=Path, default=CHARTS, help="where the SVG files go")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a chart is stale")
    args = parser.parse_args(argv)
    made = charts(args.results)
    if args.check:
        stale = [
            name
            for name, svg in made.items()
            if not (args.out / name).is_file() or (args.out / name).read_text() != svg
        ]
        extra = sorted(path.name for path in args.out.glob("*.svg") if path.name not in made)
        for name in stale:
            print(f"{args.out / name}: not what the results make; run benchmarks/charts.py", file=sys.stderr)
        for name in extra:
            print(f"{args.out / name}: no chart makes it", file=sys.stderr)
        return 1 if stale or extra else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, svg in made.items():
        (args.out / name).write_text(svg)
    print(f"{len(made)} charts in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
