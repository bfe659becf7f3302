"""`hongbao bench`: every scenario in one run, a table, JSON, a plot.

`hongbao.cli` imports this module only when ``hongbao bench`` runs, and hands it every
argument (`main`); the heavy imports wait until the bench itself runs, so that
``hongbao bench --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

Scenarios = Annotated[
    str | None,
    typer.Option(
        "--scenarios",
        help="Comma-separated subset of: seed-baseline, redis-benchmark, hongbao, "
        "hongbao-nocoalesce, hongbao-spread, ack-modes, hongbao-rules, hongbao-http, designs, "
        "memory, micro, history, settle, hongbao-cluster, webhooks, peers (default: all but "
        "peers, which starts servers of other languages; hongbao-cluster needs a "
        "redis+cluster:// URL).",
        show_default=False,
    ),
]


def bench(
    quick: Annotated[
        bool, typer.Option("--quick", help="A smaller run (under 2 minutes on 2 cores).")
    ] = False,
    size: Annotated[
        str | None,
        typer.Option(
            "--size",
            help="tiny, quick or full, or N: grabs in the hongbao scenario "
            "(others scaled). Default: full, or quick with --quick.",
            show_default=False,
        ),
    ] = None,
    scenarios: Scenarios = None,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write every figure to this JSON file.")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Draw throughput and p99 per scenario to this PNG."),
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option("--markdown", help="Write the table and targets as Markdown."),
    ] = None,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            min=1,
            help="Run the scenarios this many times, interleaved, and report each at its "
            "median rate (a shared machine's speed drifts between minutes).",
        ),
    ] = 1,
    redis_url: Annotated[
        str | None,
        typer.Option(
            "--redis-url",
            help="A Redis for the bench alone (it writes grab events to hongbao's streams), "
            "or redis+cluster://h:p,h:p for a cluster (scenarios built on seed 002's "
            "one-server script are then skipped); default: an embedded server in a "
            "temporary folder.",
            show_default=False,
        ),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="Ledger for the hongbao scenarios (default: SQLite in the temporary folder).",
            show_default=False,
        ),
    ] = None,
    postgres_url: Annotated[
        str,
        typer.Option("--postgres-url", help="Admin URL for the seed designs (private databases)."),
    ] = "postgresql://postgres@127.0.0.1:5432/test",
    mysql_url: Annotated[
        str,
        typer.Option("--mysql-url", help="Admin URL for the seed designs on MariaDB/MySQL."),
    ] = "mysql://root@127.0.0.1:3306/test",
) -> None:
    """Benchmark hongbao against seed 002's client, redis-benchmark and seed 003's designs."""
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from hongbao.console import fail, run_async
    from hongbao_bench import report
    from hongbao_bench.common import BenchContext, Outcome
    from hongbao_bench.meters import peak_rss_mb
    from hongbao_bench.profiles import profile_for
    from hongbao_bench.rounds import combine
    from hongbao_bench.scenarios import BY_DEFAULT, RUNNERS, SCENARIOS

    out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    err = Console(stderr=True, highlight=False)
    try:
        profile = profile_for(size, quick)
    except ValueError as exc:
        fail(str(exc))
    chosen = list(BY_DEFAULT)
    if scenarios:
        chosen = [s.strip() for s in scenarios.split(",") if s.strip()]
        unknown = [s for s in chosen if s not in SCENARIOS]
        if unknown:
            fail(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if plot is not None:
        _check_plotting()
    command = _command_line(
        quick, size, scenarios, rounds, json_file, plot, markdown, redis_url, database_url
    )
    started = time.perf_counter()
    load_before = os.getloadavg()
    outcomes: list[Outcome] = []
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="hongbao-bench-") as tmp:
        work = Path(tmp)
        with _redis(redis_url, work) as url:
            ctx = BenchContext(
                redis_url=url,
                database_url=database_url or f"sqlite+aiosqlite:///{work / 'ledger.sqlite3'}",
                work_dir=work,
                profile=profile,
                postgres_url=postgres_url or None,
                mysql_url=mysql_url or None,
            )
            progress = Progress(
                TextColumn("[bold]{task.fields[scenario]}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=err,
                transient=False,
            )

            async def run_all() -> None:
                task = progress.add_task("", total=len(chosen) * rounds, scenario="")
                ctx.say = lambda text: progress.update(task, description=text)
                for round_ in range(rounds):
                    this_round: list[Outcome] = []
                    for name in chosen:
                        label = name if rounds == 1 else f"{name} ({round_ + 1}/{rounds})"
                        progress.update(task, scenario=label, description="")
                        began = time.perf_counter()
                        try:
                            this_round.extend(await RUNNERS[name](ctx))
                        except Exception as exc:
                            note = f"{type(exc).__name__}: {exc}"[:400]
                            this_round.append(Outcome(name, name, "error", note=note))
                        timings[name] = round(
                            timings.get(name, 0.0) + time.perf_counter() - began, 1
                        )
                        progress.advance(task)
                    by_round.append(this_round)
                progress.update(task, scenario="done", description="")

            by_round: list[list[Outcome]] = []
            with progress:
                run_async(run_all())
            outcomes.extend(combine(by_round))
    meta: dict[str, Any] = {
        "command": command,
        "profile": profile.name,
        "profile_settings": profile.__dict__,
        "scenarios_run": chosen,
        "rounds": rounds,
        "seconds": round(time.perf_counter() - started, 1),
        "seconds_per_scenario": timings,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "redis": _redis_kind(redis_url),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        # other work on the machine skews every figure: the load averages around the run
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    report.show(out, outcomes, meta)
    if json_file is not None:
        report.write_json(json_file, outcomes, meta)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(report.markdown(outcomes, meta), encoding="utf-8")
    if plot is not None:
        report.write_plot(plot, outcomes)
    out.print(f"done in {meta['seconds']}s", style="dim")
    if report.failed_ours(outcomes):
        raise typer.Exit(1)


def _check_plotting() -> None:
    """--plot needs matplotlib, an optional dependency: say so before the run, not after."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        from hongbao.console import fail

        fail(f"--plot needs matplotlib ({exc}): pip install 'hongbao[bench]'")


@contextlib.contextmanager
def _redis(url: str | None, work: Path) -> Iterator[str]:
    if url:
        yield url
        return
    from hongbao.serving.embedded import EmbeddedServer

    server = EmbeddedServer(work / "embedded")
    try:
        yield server.start()
    finally:
        server.stop()


def _redis_kind(url: str | None) -> str:
    if not url:
        return "embedded (temporary)"
    from hongbao_bench.cluster import is_cluster_url

    return "external cluster" if is_cluster_url(url) else "external"


def _command_line(
    quick: bool,
    size: str | None,
    scenarios: str | None,
    rounds: int,
    json_file: Path | None,
    plot: Path | None,
    markdown: Path | None,
    redis_url: str | None,
    database_url: str | None,
) -> str:
    args = ["hongbao", "bench"]
    if quick:
        args.append("--quick")
    for flag, value in (
        ("--size", size),
        ("--scenarios", scenarios),
        ("--rounds", rounds if rounds > 1 else None),
        ("--json", json_file),
        ("--plot", plot),
        ("--markdown", markdown),
        ("--redis-url", "URL" if redis_url else None),
        ("--database-url", "URL" if database_url else None),
    ):
        if value is not None:
            args += [flag, str(value)]
    return shlex.join(args)


def main(args: list[str], prog_name: str) -> None:
    """Run `bench` on command-line `args`, as ``hongbao bench ARGS`` does; exits with its code."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(bench)
    app(args, prog_name=prog_name)
