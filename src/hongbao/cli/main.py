"""The `hongbao` Typer app: every command, registered here from the modules that hold them.

With no Redis URL (no ``--redis-url``, no ``HONGBAO_REDIS_URL``), ``hongbao serve``
runs everything in one command: an embedded Valkey server and an SQLite ledger
under ``--data-dir``, the persister and the expiry sweeper in-process.

Exit codes: 0 done, 1 a server or database failed, 2 bad input or configuration.
"""

from __future__ import annotations

import typer

from hongbao.cli.serve import serve, worker
from hongbao.cli.statement import statement
from hongbao.cli.tools import audit, dead_letters, migrate, recover, token
from hongbao.cli.webhooks import app as webhooks_app
from hongbao.cli.withdrawals import app as withdrawals_app
from hongbao.console import fail

app = typer.Typer(
    name="hongbao",
    help="Red-packet (红包) service: HTTP API, workers and tools.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(serve)
app.command()(worker)
app.command()(migrate)
app.command()(audit)
app.command()(recover)
app.command("dead-letters")(dead_letters)
app.command()(token)
app.command()(statement)
app.add_typer(webhooks_app, name="webhooks")
app.add_typer(withdrawals_app, name="withdrawals")


@app.command(
    "bench",
    # every argument, --help included, goes to the benchmark's own command
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
    help="Benchmark hongbao against seed 002's client, redis-benchmark and seed 003's "
    "designs (its options: hongbao bench --help).",
)
def bench(ctx: typer.Context) -> None:
    # imported here: the service's commands never load the benchmark package
    try:
        from hongbao_bench.command import main as run_bench
    except ImportError as exc:
        fail(
            f"hongbao bench needs the hongbao_bench package ({exc}): "
            "install hongbao with its benchmark, pip install 'hongbao[bench]'"
        )
    run_bench(ctx.args, ctx.command_path)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
