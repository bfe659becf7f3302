"""The `hongbao` Typer app: every command, registered here from the modules that hold them.

With no Redis URL (no ``--redis-url``, no ``HONGBAO_REDIS_URL``), ``hongbao serve``
runs everything in one command: an embedded Valkey server and an SQLite ledger
under ``--data-dir``, the persister and the expiry sweeper in-process.

Exit codes: 0 done, 1 a server or database failed, 2 bad input or configuration.
"""

from __future__ import annotations

import typer

from hongbao.cli.serve import serve, worker
from hongbao.cli.tools import audit, dead_letters, migrate, recover, token

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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
