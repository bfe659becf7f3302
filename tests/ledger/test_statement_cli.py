"""`hongbao statement` as an operator runs it, on each database: the day's entries, the
check, exit 1 when an entry was changed afterwards, exit 2 on bad input."""

from __future__ import annotations

import csv
import io
import json
import stat
from datetime import UTC, datetime
from pathlib import Path

from hongbao.ledger import SqlLedger
from hongbao.ledger.records import utcnow
from hongbao.ledger.schema import entries
from tests.api.serving import run_cli
from tests.ledger.test_history import close, grab, open_packet


def sections(text: str) -> list[list[list[str]]]:
    """The CSV's blank-line separated tables."""
    out: list[list[list[str]]] = [[]]
    for row in csv.reader(io.StringIO(text)):
        if row:
            out[-1].append(row)
        else:
            out.append([])
    return out


async def test_statement_adds_up_and_a_changed_entry_breaks_it(
    ledger: SqlLedger, sql_url: str, tmp_path: Path
) -> None:
    await ledger.deposit("sender", 1000, "d1")
    packet = await open_packet(ledger, "sender", [120, 80, 300], created_at=datetime.now(UTC))
    await grab(ledger, packet, 0, "ann", datetime.now(UTC), 120)
    await grab(ledger, packet, 2, "bo", datetime.now(UTC), 300)
    await close(ledger, packet, 80, 1)
    day = utcnow().date().isoformat()

    done = run_cli("statement", "--date", day, "--database-url", sql_url)
    assert done.returncode == 0, done.stderr
    lines, kinds, check = sections(done.stdout)
    assert lines[0] == ["reference", "wallet", "kind", "amount", "packet", "time"]
    assert len(lines) == 1 + 6  # two deposits, a send, two claims, a refund
    assert {row[1] for row in lines[1:]} == {"sender", "ann", "bo"}
    assert all(row[5].startswith(day) and row[5].endswith("Z") for row in lines[1:])
    day_total = sum(int(row[3]) for row in lines[1:])
    assert day_total == 1500
    assert {row[0]: (int(row[1]), int(row[2])) for row in kinds[1:]} == {
        "claim": (2, 420),
        "deposit": (2, 1500),
        "refund": (1, 80),
        "send": (1, -500),
    }
    assert check == [
        ["date", "start_balance", "entries_total", "end_balance", "difference", "check"],
        [day, "0", "1500", "1500", "0", "balanced"],
    ]
    assert "balanced" in done.stderr

    out = tmp_path / "statement.json"
    done = run_cli(
        "statement", "--date", day, "--format", "json", "--out", str(out), "--database-url", sql_url
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    body = json.loads(out.read_text(encoding="utf-8"))
    assert (body["start_balance"], body["entries_total"], body["end_balance"]) == (0, 1500, 1500)
    assert body["balanced"] is True and len(body["entries"]) == 6

    async with ledger.engine.begin() as conn:
        await conn.execute(
            entries.update()
            .where(entries.c.user_id == "bo", entries.c.kind == "claim")
            .values(amount=299)
        )
    done = run_cli("statement", "--date", day, "--database-url", sql_url)
    assert done.returncode == 1, done.stderr
    assert "NOT BALANCED" in done.stderr and "wallet bo" in done.stderr
    assert "Traceback" not in done.stderr
    *_, check, off = sections(done.stdout)
    assert check[1] == [day, "0", "1499", "1500", "1", "NOT BALANCED"]
    assert off == [["wallet", "start", "entries", "end"], ["bo", "0", "299", "300"]]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, words in [
        (["--date", "2026-02-30"], "date must be a day"),
        (["--date", "yesterday"], "date must be a day"),
        (["--format", "xml"], "--format must be one of csv, json"),
        ([], "holds no ledger"),
    ]:
        done = run_cli("statement", "--data-dir", str(tmp_path / "none"), *args)
        assert done.returncode == 2, done.stdout + done.stderr
        assert words in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "none").exists()  # a statement creates no ledger


def test_out_is_private_whatever_was_there_and_never_follows_a_link(tmp_path: Path) -> None:
    done = run_cli("migrate", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    args = ["statement", "--date", "2026-11-26", "--data-dir", str(tmp_path)]

    out = tmp_path / "statement.csv"
    out.write_text("an older, longer statement\n" * 100)
    out.chmod(0o644)  # readable by everyone: the statement must not stay so
    done = run_cli(*args, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.read_text().startswith("reference,wallet,kind") and "older" not in out.read_text()

    target = tmp_path / "elsewhere"
    target.write_text("not yours\n")
    target.chmod(0o644)
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    done = run_cli(*args, "--out", str(link))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"--out {link} is a symbolic link" in " ".join(done.stderr.split())
    assert target.read_text() == "not yours\n" and stat.S_IMODE(target.stat().st_mode) == 0o644
