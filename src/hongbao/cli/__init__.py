"""The `hongbao` command (Typer): serve, worker, migrate, audit, recover, dead-letters,
token, bench."""

from hongbao.cli.main import app, main

__all__ = ["app", "main"]
