"""`hongbao withdrawals pending` as an operator runs it, as a subprocess on each database:
the lines it prints, oldest first, and its exit codes (1 while any withdrawal waits for
its outcome, 0 when none does, 2 on bad input)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import typer

from hongbao.cli.withdrawals import format_age, parse_pending_age
from hongbao.ledger import SqlLedger
from hongbao.withdrawals import Withdrawals
from tests.api.serving import run_cli
from tests.api.test_cli import assert_usage_error
from tests.ledger.test_withdrawals_by_status import oldest_first, requested_at

#: one line of `pending`: id, user, amount, when requested, age
LINE = re.compile(
    r"^(wd_[0-9a-z]{26})  (\S+)  (\d+) fen  requested (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)  "
    r"age (.+)$"
)


def pending(sql_url: str, *args: str) -> tuple[int, list[tuple[str, ...]], str]:
    """Exit code, the parsed withdrawal lines and the summary line of `pending`."""
    done = run_cli("withdrawals", "pending", "--database-url", sql_url, *args)
    assert "Traceback" not in done.stderr, done.stderr
    *lines, summary = done.stdout.splitlines()
    parsed = []
    for line in lines:
        match = LINE.match(line)
        assert match is not None, done.stdout
        parsed.append(match.groups())
    return done.returncode, parsed, summary


async def test_pending_lists_the_oldest_first_and_exits_1(ledger: SqlLedger, sql_url: str) -> None:
    book = Withdrawals(ledger)
    code, lines, summary = pending(sql_url)
    assert (code, lines) == (0, [])
    assert summary == "no withdrawal awaits its outcome"

    await ledger.deposit("alice", 10_000, "d1")
    await ledger.deposit("bob", 10_000, "d1")
    now = datetime.now(UTC).replace(microsecond=0)
    ages = {"3h": timedelta(hours=3), "2d": timedelta(days=2), "30m": timedelta(minutes=30)}
    made = {}
    for i, (name, age) in enumerate(ages.items()):
        made[name] = (await book.request(("alice", "bob")[i % 2], 100 * (i + 1), name))[0]
        await requested_at(ledger, made[name].id, now - age)
    paid, _ = await book.request("alice", 7, "paid")
    await book.complete(paid.id)

    code, lines, summary = pending(sql_url)
    assert code == 1
    assert [line[:3] for line in lines] == [
        (made["2d"].id, "bob", "200"),
        (made["3h"].id, "alice", "100"),
        (made["30m"].id, "alice", "300"),
    ]
    assert lines[0][3] == (now - ages["2d"]).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert re.fullmatch(r"2d( 0h)?", lines[0][4]) and re.fullmatch(r"3h( [01]m)?", lines[1][4])
    assert re.fullmatch(r"3[01]m( \d+s)?", lines[2][4]), lines[2]
    assert summary.startswith("3 withdrawals await their outcome (600 fen): ask the payment")

    code, lines, summary = pending(sql_url, "--older-than", "1h")
    assert code == 1 and [line[0] for line in lines] == [made["2d"].id, made["3h"].id]
    assert summary.startswith("2 withdrawals requested more than 1h ago await their outcome")

    code, lines, summary = pending(sql_url, "--older-than", "1d", "--limit", "5")
    assert code == 1 and [line[0] for line in lines] == [made["2d"].id]
    assert summary.startswith("1 withdrawal requested more than 1d ago awaits its outcome")

    code, lines, summary = pending(sql_url, "--limit", "2")
    assert code == 1 and [line[0] for line in lines] == [made["2d"].id, made["3h"].id]
    assert summary.startswith("more than 2 withdrawals await their outcome (300 fen in the 2")

    code, lines, summary = pending(sql_url, "--older-than", "3d")
    assert (code, lines) == (0, [])
    assert summary == "no withdrawal requested more than 3d ago awaits its outcome"

    # once the payment system's outcomes are reported, nothing waits
    await book.complete(made["2d"].id)
    await book.fail(made["3h"].id)
    await book.complete(made["30m"].id)
    code, lines, summary = pending(sql_url)
    assert (code, lines, summary) == (0, [], "no withdrawal awaits its outcome")


async def test_pending_pages_past_one_read(ledger: SqlLedger, sql_url: str) -> None:
    """More than the 200 a single read returns: every one listed once, in order."""
    book = Withdrawals(ledger)
    await ledger.deposit("alice", 10_000, "d1")
    made = [(await book.request("alice", 1, f"w{i}"))[0] for i in range(230)]
    code, lines, summary = pending(sql_url, "--limit", "1000")
    assert code == 1 and [line[0] for line in lines] == [w.id for w in oldest_first(made)]
    assert summary.startswith("230 withdrawals await their outcome (230 fen)")
    code, lines, summary = pending(sql_url, "--limit", "201")
    assert code == 1 and len(lines) == 201 and summary.startswith("more than 201 withdrawals")


async def test_bad_input_is_a_usage_error(ledger: SqlLedger, sql_url: str) -> None:
    await ledger.deposit("alice", 100, "d1")
    await Withdrawals(ledger).request("alice", 10, "w1")
    url = ["--database-url", sql_url]
    for bad in ("30", "1.5h", "-1h", "2w", "3651d", "h"):
        done = run_cli("withdrawals", "pending", "--older-than", bad, *url)
        assert_usage_error(done, "--older-than", bad)
        assert done.stdout == ""
    for bad in ("0", "10001", "all"):
        done = run_cli("withdrawals", "pending", "--limit", bad, *url)
        assert_usage_error(done, "--limit")
        assert done.stdout == ""
    assert_usage_error(run_cli("withdrawals", "pending", "--database-url", "nope://"), "nope")
    assert_usage_error(run_cli("withdrawals", "lost"), "lost")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30m", timedelta(minutes=30)),
        ("12h", timedelta(hours=12)),
        ("2d", timedelta(days=2)),
        ("0m", timedelta(0)),
        ("90m", timedelta(minutes=90)),
        ("3650d", timedelta(days=3650)),
    ],
)
def test_pending_ages(value: str, expected: timedelta) -> None:
    assert parse_pending_age(value) == expected


@pytest.mark.parametrize("value", ["", "30", "m", "30x", "30M", "1.5d", "-1d", "3651d", "9" * 30])
def test_bad_pending_ages(value: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_pending_age(value)


@pytest.mark.parametrize(
    ("age", "shown"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=8), "8s"),
        (timedelta(minutes=6, seconds=7), "6m 7s"),
        (timedelta(minutes=30), "30m"),
        (timedelta(hours=4, minutes=5, seconds=6), "4h 5m"),
        (timedelta(hours=12), "12h"),
        (timedelta(days=2, hours=3, minutes=4), "2d 3h"),
        (timedelta(days=2, minutes=4), "2d"),
        (timedelta(seconds=-3), "0s"),
    ],
)
def test_ages_shown(age: timedelta, shown: str) -> None:
    assert format_age(age) == shown
