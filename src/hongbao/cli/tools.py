"""The operator's commands: migrate, audit, recover, dead-letters, token."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hongbao.cli.options import DEFAULT_DATA_DIR, DatabaseUrl, DataDir, RedisUrl, safe_url
from hongbao.console import err, fail, friendly_errors, run_async
from hongbao.domain.ids import valid_user_id
from hongbao.errors import HongbaoError
from hongbao.identity.config import SECRET_FILE, load_or_create_secret, secret_from_env_or_dir
from hongbao.identity.principal import DEFAULT_TTL, MAX_ADMIN_TTL

#: the longest token lifetime `hongbao token` issues: ten years, seconds
MAX_TTL = 315_360_000

if TYPE_CHECKING:
    from hongbao.settings import Settings


def migrate(
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Bring the ledger's schema up to date."""
    from hongbao.ledger import SqlLedger
    from hongbao.serving.embedded import ledger_url

    url = database_url or ledger_url(data_dir)
    if not database_url:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    async def run() -> None:
        ledger = SqlLedger.from_url(url)
        try:
            await ledger.migrate()
        finally:
            await ledger.aclose()

    with friendly_errors():
        try:
            run_async(run())
        except HongbaoError:
            raise
        except Exception as exc:
            fail(f"migration failed on {safe_url(url)}: {exc}", 1)
    err.print(f"ledger {safe_url(url)} is up to date", style="green", markup=False)


# -- audit, recover, dead letters ------------------------------------------------------------


def audit(
    redis_url: RedisUrl = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Check every money invariant; exit 1 naming the packet or wallet on a violation."""
    with friendly_errors():
        code = _audit(data_dir, redis_url, database_url, do_recover=False)
    raise typer.Exit(code)


def recover(
    redis_url: RedisUrl = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Rebuild Redis state of open packets from the ledger, then audit (safe to repeat)."""
    with friendly_errors():
        code = _audit(data_dir, redis_url, database_url, do_recover=True)
    raise typer.Exit(code)


def dead_letters(
    retry: Annotated[
        list[str] | None,
        typer.Option(
            "--retry",
            metavar="b<BUCKET>/<ID>",
            help="Put this parked entry back on its event stream (repeatable).",
        ),
    ] = None,
    retry_all: Annotated[
        bool, typer.Option("--retry-all", help="Put every parked entry back.")
    ] = False,
    resolve: Annotated[
        list[str] | None,
        typer.Option(
            "--resolve",
            metavar="b<BUCKET>/<ID>",
            help="Set this entry aside, never to be applied (repeatable; needs --note).",
        ),
    ] = None,
    note: Annotated[str, typer.Option(help="Why the --resolve entries are set aside.")] = "",
    redis_url: RedisUrl = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """List the events the persister parked, with why; exit 1 while any are left.

    Fix the cause first (the reason says it), then retry: the persister applies the
    entries again, and the ledger applies each claim and refund only once. An entry
    that must never be applied is resolved, with a note, and kept for the record."""
    if sum((bool(retry), retry_all, bool(resolve))) > 1:
        fail("give one of --retry, --retry-all and --resolve")
    if note and not resolve:
        fail("--note goes with --resolve")
    with friendly_errors():
        code = _dead_letters(
            data_dir,
            redis_url,
            retry_refs=retry,
            retry_all=retry_all,
            resolve_refs=resolve,
            note=note,
        )
    raise typer.Exit(code)


# -- token ------------------------------------------------------------------------------------


def token(
    users: Annotated[
        list[str],
        typer.Argument(
            help="User ids (1-64 of A-Z a-z 0-9 _ . : @ -); '-' reads them from stdin.",
        ),
    ],
    admin: Annotated[
        bool,
        typer.Option("--admin", help="Admin tokens (deposits, any wallet, the dashboard)."),
    ] = False,
    service: Annotated[
        bool,
        typer.Option(
            "--service",
            help="Service tokens: the host app's backend, acting for users (X-On-Behalf-Of).",
        ),
    ] = False,
    ttl: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_TTL,
            help=f"Seconds until the tokens expire (admin: {MAX_ADMIN_TTL} at most).",
        ),
    ] = DEFAULT_TTL,
    data_dir: DataDir = DEFAULT_DATA_DIR,
) -> None:
    """Print a bearer token (an HS256 JWT) per user, one per line, in the order given."""
    if "-" in users:
        users = [u for arg in users for u in (sys.stdin.read().split() if arg == "-" else [arg])]
    bad = next((u for u in users if not valid_user_id(u)), None)
    if bad is not None:
        fail(f"invalid user id {bad!r}: use 1-64 characters of letters, digits and _ . : @ -")
    if admin and ttl > MAX_ADMIN_TTL:
        fail(f"--ttl {ttl}: an admin token lives at most {MAX_ADMIN_TTL} seconds (24 h)")
    env_secret = os.environ.get("HONGBAO_SECRET")
    with friendly_errors():
        if env_secret is not None and env_secret.strip():
            secret = secret_from_env_or_dir(env_secret, None)
        elif (data_dir / SECRET_FILE).is_file():
            secret = load_or_create_secret(data_dir)
        else:
            fail(
                f"no secret: {data_dir / SECRET_FILE} does not exist. Start `hongbao serve "
                f"--data-dir {data_dir}` once, or set HONGBAO_SECRET."
            )
        from hongbao.identity.mint import mint_tokens  # PyJWT, only when minting

        tokens = mint_tokens(secret, users, admin=admin, service=service, ttl=ttl)
    sys.stdout.write("\n".join(tokens) + "\n")
    sys.stdout.flush()


# -- the bodies of the operator commands ---------------------------------------------------------


def _audit(
    data_dir: Path, redis_url: str | None, database_url: str | None, *, do_recover: bool
) -> int:
    """`hongbao audit` / `hongbao recover`: 0 clean, 1 a violation (named on stdout)."""
    from hongbao.audit import SETTLE_SECONDS, audit, recover
    from hongbao.service import Hongbao
    from hongbao.serving.offline import run_offline

    async def run(settings: Settings) -> int:
        service = await Hongbao.connect(settings, migrate=False)
        try:
            if do_recover:
                fixed = await recover(service)
                print(
                    f"recover: rebuilt {fixed.rebuilt} packet(s), "
                    f"restored {fixed.repaired_claims} claim(s), "
                    f"gave {fixed.claims_lifetimes} spent packet(s)' claims a lifetime"
                )
                for line in fixed.conflicts:
                    print(f"CONFLICT {line}")
            report = await audit(service, SETTLE_SECONDS)
            for line in report.lines():
                print(line)
            return 0 if report.clean else 1
        finally:
            await service.aclose()

    return run_offline(data_dir, redis_url, database_url, run)


def _dead_letters(
    data_dir: Path,
    redis_url: str | None,
    *,
    retry_refs: Sequence[str] | None,
    retry_all: bool,
    resolve_refs: Sequence[str] | None,
    note: str,
) -> int:
    """`hongbao dead-letters`: 0 when nothing is left parked, 1 otherwise."""
    from hongbao.dead_letters import count, parked, resolve, retry
    from hongbao.serving.offline import run_offline
    from hongbao.storage import store_from_url

    async def run(settings: Settings) -> int:
        store = store_from_url(settings.redis_url, settings.buckets)
        try:
            if resolve_refs:
                _report_moves(await resolve(store, resolve_refs, note), "resolved")
            elif retry_all or retry_refs:
                moved = await retry(store, None if retry_all else retry_refs)
                _report_moves(moved, "back on the event stream")
            left = await parked(store)
            total = max(len(left), await count(store))
        finally:
            await store.aclose()
        for entry in left:
            fields = " ".join(f"{k}={v}" for k, v in entry.fields.items())
            print(f"{entry.ref} (event {entry.event_id}): {entry.reason}\n    {fields}")
        shown = f" (the first {len(left)} listed)" if total > len(left) else ""
        print(f"dead-letter entries: {total}{shown}")
        return 1 if total else 0

    return run_offline(data_dir, redis_url, None, run)


def _report_moves(moved: list[tuple[str, str | None]], where: str) -> None:
    for ref, new_id in moved:
        if new_id is None:
            print(f"{ref}: gone from the dead-letter stream meanwhile")
        else:
            print(f"{ref}: {where} as {new_id}")
