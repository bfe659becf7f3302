"""The `hongbao` command as a user runs it: exit codes, messages, tokens."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from hongbao.identity.config import load_or_create_secret
from tests.api.serving import clean_env, free_port, run_cli, servers_for
from tests.servers import RedisNode
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
        env=clean_env(HONGBAO_SECRET=SECRET),
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "cannot start" in out and "Traceback" not in out


def test_worker_needs_a_redis_url(tmp_path: Path) -> None:
    done = run_cli("worker", "--data-dir", str(tmp_path))
    assert_usage_error(done, "--redis-url")
    assert "no hongbao serve runs on" in done.stderr


def test_token_ttl_out_of_range() -> None:
    done = run_cli(
        "token", "--ttl", "999999999999999999999", "alice", env=clean_env(HONGBAO_SECRET=SECRET)
    )
    assert_usage_error(done, "--ttl")
    assert done.stdout == ""


def nothing_started(data_dir: Path) -> None:
    """No server process, and no file: not the data folder, nor a ledger in it."""
    assert servers_for(data_dir) == []
    assert not data_dir.exists(), sorted(p.name for p in data_dir.iterdir())


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        pytest.param("HONGBAO_BUCKETS", "0", ["HONGBAO_BUCKETS", "from 1 to 1024"], id="buckets-0"),
        pytest.param("HONGBAO_MAX_SHARE", "abc", ["HONGBAO_MAX_SHARE", "whole number"], id="text"),
        pytest.param(
            "HONGBAO_MAX_SHARE",
            "4294967296",
            ["HONGBAO_MAX_SHARE", "from 1 to 4294967295"],
            id="share-beyond-32-bits",
        ),
        pytest.param(
            "HONGBAO_MIN_SHARE", "30000", ["HONGBAO_MIN_SHARE", "must not exceed"], id="min>max"
        ),
        pytest.param(
            "HONGBAO_PERSISTER_BLOCK_MS", "0", ["HONGBAO_PERSISTER_BLOCK_MS"], id="block-0"
        ),
        pytest.param("HONGBAO_SWEEP_INTERVAL", "nan", ["HONGBAO_SWEEP_INTERVAL"], id="nan"),
        pytest.param("HONGBAO_ACK_MODE", "fsync", ["--ack", "fsync"], id="ack"),
        pytest.param("HONGBAO_RATE_LIMIT_USER", "-1", ["HONGBAO_RATE_LIMIT_USER"], id="negative"),
        pytest.param(
            "HONGBAO_PERSISTER_CONSUMER", "a b", ["HONGBAO_PERSISTER_CONSUMER"], id="name"
        ),
    ],
)
def test_serve_refuses_a_bad_setting_before_starting(
    tmp_path: Path, variable: str, value: str, words: list[str]
) -> None:
    data_dir = tmp_path / "data"
    done = run_cli(
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        str(free_port()),
        env=clean_env(**{variable: value}),
    )
    assert_usage_error(done, *words)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    nothing_started(data_dir)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(["--redis-url", "garbage"], ["unsupported Redis URL scheme"], id="garbage"),
        pytest.param(["--redis-url", "redis://h:port/0"], ["bad Redis URL"], id="bad-port"),
        pytest.param(["--redis-url", "unix://"], ["socket's path"], id="unix-no-path"),
        pytest.param(["--database-url", "oracle://x/y"], ["unsupported database"], id="oracle"),
        pytest.param(["--database-url", "garbage"], ["database URL"], id="db-garbage"),
        pytest.param(
            ["--host", "nosuchhost.invalid"], ["cannot resolve host nosuchhost"], id="host"
        ),
        pytest.param(["--no-persister"], ["--no-persister needs --redis-url"], id="no-persister"),
    ],
)
def test_serve_checks_before_starting(tmp_path: Path, args: list[str], words: list[str]) -> None:
    data_dir = tmp_path / "data"
    done = run_cli(
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        str(free_port()),
        *args,
        env=clean_env(HONGBAO_SECRET=SECRET),
    )
    assert_usage_error(done, *words)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "serving on" not in done.stderr
    nothing_started(data_dir)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_busy_port_starts_nothing(tmp_path: Path, workers: str) -> None:
    data_dir = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli(
            "serve", "--data-dir", str(data_dir), "--port", str(port), "--workers", workers
        )
    assert_usage_error(done, f"error: cannot listen on 127.0.0.1:{port}: port {port} is in use")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    nothing_started(data_dir)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_busy_metrics_port_starts_nothing(tmp_path: Path, workers: str) -> None:
    data_dir = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        done = run_cli(
            "serve",
            *("--data-dir", str(data_dir), "--port", str(free_port()), "--workers", workers),
            *("--metrics-port", str(busy)),
        )
    assert_usage_error(done, f"error: cannot listen on 127.0.0.1:{busy}: port {busy} is in use")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    nothing_started(data_dir)
    port = free_port()
    done = run_cli(
        "serve",
        *("--data-dir", str(data_dir), "--port", str(port), "--workers", workers),
        *("--metrics-port", str(port)),
    )
    assert_usage_error(done, f"error: --metrics-port must differ from --port ({port})")
    nothing_started(data_dir)


@pytest.mark.parametrize("value", [pytest.param("", id="empty"), pytest.param("FILE", id="a-file")])
def test_serve_refuses_a_bad_data_dir(tmp_path: Path, value: str) -> None:
    if value == "FILE":
        value = str(tmp_path / "a-file")
        Path(value).write_text("not a folder")
    done = run_cli("serve", "--data-dir", value, "--port", str(free_port()), cwd=tmp_path)
    assert_usage_error(done, "--data-dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == (["a-file"] if value else [])


def test_api_hosts_on_one_redis_need_a_configured_secret(tmp_path: Path, redis_url: str) -> None:
    """Two API processes on one Redis, each with its own data folder: without a shared
    secret (or JWT keys) each would mint and accept tokens of its own, so both refuse."""
    for host in ("a", "b"):
        data_dir = tmp_path / host
        done = run_cli(
            "serve",
            "--data-dir",
            str(data_dir),
            "--port",
            str(free_port()),
            "--redis-url",
            redis_url,
        )
        assert_usage_error(done, "HONGBAO_SECRET", "HONGBAO_JWT_JWKS_URL")
        nothing_started(data_dir)


def test_serve_refuses_a_redis_that_may_evict(tmp_path: Path) -> None:
    node = RedisNode().start(
        None, tmp_path / "redis", extra_args=["--maxmemory-policy", "allkeys-lru"]
    )
    try:
        args = ["serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port())]
        args += ["--redis-url", node.url]
        done = run_cli(*args, env=clean_env(HONGBAO_SECRET=SECRET))
        assert_usage_error(done, "maxmemory-policy is allkeys-lru", "--allow-eviction")
        assert "serving on" not in done.stderr
    finally:
        node.stop()


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
    for command in ("serve", "worker", "migrate", "token", "webhooks", "withdrawals"):
        assert command in done.stdout
