"""The `hongbao` command as a user runs it: exit codes, messages, tokens."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hongbao.identity.config import load_or_create_secret
from tests.api.serving import clean_env, free_port, run_cli, servers_for
from tests.tokens import claims_of

SECRET = "cli-tests-secret-0123456789abcdef"


def assert_usage_error(done: object, *words: str) -> None:
    code, out = done.returncode, done.stdout + done.stderr  # type: ignore[attr-defined]
    assert code == 2, out
    assert "Traceback" not in out, out
    for word in words:
        assert word in out, out


def test_tokens_in_order_with_env_secret() -> None:
    done = run_cli("token", "alice", "bob", "carol", env=clean_env(HONGBAO_SECRET=SECRET))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3
    for user, token in zip(("alice", "bob", "carol"), lines, strict=True):
        claims = claims_of(token, SECRET.encode())
        assert claims["sub"] == user and "roles" not in claims
        assert claims["exp"] - time.time() == pytest.approx(86_400, abs=60)
        assert claims["exp"] - claims["iat"] == 86_400


def test_admin_token_with_ttl_from_the_data_dir_secret(tmp_path: Path) -> None:
    secret = load_or_create_secret(tmp_path)
    done = run_cli("token", "--admin", "--ttl", "60", "root", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    claims = claims_of(done.stdout.strip(), secret)
    assert claims["roles"] == ["hongbao:admin"] and claims["sub"] == "root"
    assert claims["exp"] - time.time() == pytest.approx(60, abs=10)


def test_100k_tokens_in_seconds() -> None:
    users = [f"user{i}" for i in range(100_000)]
    started = time.monotonic()
    done = run_cli("token", *users, env=clean_env(HONGBAO_SECRET=SECRET))
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 100_000
    for i in (0, 1, 54_321, 99_999):
        assert claims_of(lines[i], SECRET.encode())["sub"] == f"user{i}"
    assert elapsed < 10, f"{elapsed:.1f}s"


def test_tokens_from_stdin() -> None:
    done = run_cli("token", "-", env=clean_env(HONGBAO_SECRET=SECRET), input="x1\nx2\n")
    assert done.returncode == 0, done.stderr
    assert [claims_of(t, SECRET.encode())["sub"] for t in done.stdout.split()] == ["x1", "x2"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(["token", "good", "bad user"], ["invalid user id", "bad user"], id="bad-user"),
        pytest.param(["token", "x" * 65], ["invalid user id"], id="long-user"),
        pytest.param(["token", "alice", "--ttl", "0"], ["ttl"], id="ttl-0"),
        pytest.param(["token", "alice", "--ttl", "soon"], ["ttl"], id="ttl-text"),
        pytest.param(["token"], ["Missing argument"], id="no-users"),
    ],
)
def test_token_usage_errors(args: list[str], words: list[str]) -> None:
    done = run_cli(*args, env=clean_env(HONGBAO_SECRET=SECRET))
    assert_usage_error(done, *words)
    assert done.stdout == ""


def test_token_without_any_secret(tmp_path: Path) -> None:
    done = run_cli("token", "alice", "--data-dir", str(tmp_path / "nothing-here"))
    assert_usage_error(done, "no secret", "HONGBAO_SECRET")
    assert not (tmp_path / "nothing-here").exists()


def test_token_with_short_secret() -> None:
    done = run_cli("token", "alice", env=clean_env(HONGBAO_SECRET="short"))
    assert_usage_error(done, "at least 32 bytes")
    done = run_cli("token", "alice", env=clean_env(HONGBAO_SECRET="x" * 31))
    assert_usage_error(done, "at least 32 bytes")


def test_admin_tokens_live_at_most_a_day_and_service_tokens() -> None:
    env = clean_env(HONGBAO_SECRET=SECRET)
    done = run_cli("token", "--admin", "--ttl", "86401", "root", env=env)
    assert_usage_error(done, "at most 86400")
    done = run_cli("token", "--admin", "--ttl", "86400", "root", env=env)
    assert claims_of(done.stdout.strip(), SECRET.encode())["roles"] == ["hongbao:admin"]
    done = run_cli("token", "--service", "--ttl", "600000", "shop", env=env)
    assert done.returncode == 0, done.stderr
    claims = claims_of(done.stdout.strip(), SECRET.encode())
    assert claims["roles"] == ["hongbao:service"] and claims["exp"] - claims["iat"] == 600_000


@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(["--port", "0"], ["--port"], id="port-0"),
        pytest.param(["--port", "http"], ["--port"], id="port-text"),
        pytest.param(["--workers", "0"], ["--workers"], id="workers-0"),
        pytest.param(["--redis-url", "memcached://x"], ["unsupported Redis URL"], id="bad-scheme"),
        pytest.param(
            ["--redis-url", "redis://127.0.0.1:6379/1", "--database-url", "oracle://x/y"],
            ["unsupported database"],
            id="bad-database",
        ),
        pytest.param(["--log-level", "loud"], ["--log-level"], id="bad-log-level"),
        pytest.param(["--bogus"], ["--bogus"], id="unknown-flag"),
    ],
)
def test_serve_usage_errors(tmp_path: Path, args: list[str], words: list[str]) -> None:
    data_dir = tmp_path / "data"
    done = run_cli("serve", "--data-dir", str(data_dir), "--port", str(free_port()), *args)
    assert_usage_error(done, *words)
    assert servers_for(data_dir) == []


def test_serve_with_unreachable_redis_fails_clearly(tmp_path: Path) -> None:
    done = run_cli(
        "serve",
        "--data-dir",
        str(tmp_path),
        "--port",
        str(free_port()),
        "--redis-url",
        f"redis://127.0.0.1:{free_port()}/0",
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "cannot start" in out and "Traceback" not in out


def test_worker_needs_a_redis_url(tmp_path: Path) -> None:
    done = run_cli("worker", "--data-dir", str(tmp_path))
    assert_usage_error(done, "--redis-url")


def test_migrate_creates_the_ledger(tmp_path: Path) -> None:
    done = run_cli("migrate", "--data-dir", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "d" / "ledger.sqlite3").exists()
    again = run_cli("migrate", "--database-url", f"sqlite:///{tmp_path / 'd' / 'ledger.sqlite3'}")
    assert again.returncode == 0, again.stderr
    bad = run_cli("migrate", "--database-url", "nope://")
    assert_usage_error(bad, "database")


def test_help_lists_the_commands() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    for command in ("serve", "worker", "migrate", "token"):
        assert command in done.stdout
