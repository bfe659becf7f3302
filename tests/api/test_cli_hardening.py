"""The `hongbao` command under faults and odd input: API workers that cannot start,
Ctrl-C, user input that looks like Rich markup, commands on a folder with no ledger."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hongbao.errors import ConfigurationError
from tests.api.serving import Serve, clean_env, command, free_port, run_cli, worker_pids

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: the CLI with the API workers' backoff shortened, so that the tests wait less
QUICK_BACKOFF = [
    sys.executable,
    "-c",
    "import hongbao.serving.workers as w; w.RESTART_BACKOFF = (0.2, 0.4); "
    "from hongbao.cli import main; main()",
]

#: the CLI with API workers that run `broken_app` (how it breaks: $BROKEN_APP)
BROKEN_WORKERS = [
    sys.executable,
    "-c",
    "import hongbao.serving.workers as w; real = w.serve_workers; "
    "w.serve_workers = lambda app, *a: real('tests.api.test_cli_hardening:broken_app', *a); "
    "from hongbao.cli import main; main()",
]


def broken_app() -> Any:
    """An API worker's app factory that cannot build the app."""
    if os.environ.get("BROKEN_APP") == "settings":
        raise ConfigurationError("HONGBAO_SOMETHING must be a number, not 'x'")
    raise RuntimeError("the app cannot be built")


def one_line(text: str) -> str:
    return " ".join(text.split())  # Rich wraps long lines


def wait_until(condition: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


# -- serve --workers N: a worker that cannot start ---------------------------------------------


@pytest.mark.parametrize(("how", "code"), [("settings", 2), ("crash", 1)])
def test_api_workers_that_cannot_start_at_first_stop_serve(
    tmp_path: Path, how: str, code: int
) -> None:
    data_dir = tmp_path / "data"
    port = str(free_port())
    done = subprocess.run(
        [*BROKEN_WORKERS, "serve", "--data-dir", str(data_dir), "--port", port, "--workers", "2"],
        env=clean_env(BROKEN_APP=how),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == code, done.stderr
    assert "could not be started or kept running" in one_line(done.stderr)


def test_a_replacement_worker_that_cannot_start_is_tried_again(tmp_path: Path) -> None:
    """Long after the first start, a replacement worker that fails to start does not
    stop serve: the other worker serves on, and the replacement is started again with
    backoff until one holds."""
    data_dir = tmp_path / "data"
    server = Serve(data_dir, None, "--workers", "2", launcher=QUICK_BACKOFF)
    with server:
        workers = worker_pids(server)
        assert len(workers) == 2, server.log()
        secret = (data_dir / "secret").read_bytes()
        (data_dir / "secret").write_text("short\n")  # a new worker refuses the secret
        os.kill(workers[0], signal.SIGKILL)
        wait_until(lambda: one_line(server.log()).count("could not start") >= 3, 90, server.log())
        assert server.proc is not None and server.proc.poll() is None, server.log()
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        (data_dir / "secret").write_bytes(secret)
        wait_until(
            lambda: (
                len(worker_pids(server)) == 2
                and all(pid not in worker_pids(server) for pid in workers[:1])
            ),
            90,
            server.log(),
        )
        assert server.stop() == 0, server.log()


def test_serve_exits_1_when_no_api_worker_can_be_kept_running(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = Serve(data_dir, None, "--workers", "2", launcher=QUICK_BACKOFF)
    with server:
        workers = worker_pids(server)
        assert len(workers) == 2, server.log()
        (data_dir / "secret").write_text("short\n")
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert server.proc is not None
        assert server.proc.wait(120) == 1, server.log()
        words = one_line(server.log())
        assert "no worker runs" in words and "could not be started or kept running" in words
        assert "embedded server stopped" in words


# -- Ctrl-C --------------------------------------------------------------------------------------


def test_ctrl_c_on_serve_with_workers_prints_no_traceback(tmp_path: Path) -> None:
    """Ctrl-C signals the terminal's whole process group: serve and its workers."""
    server = Serve(tmp_path / "data", None, "--workers", "2", launcher=["setsid", *command()])
    with server:
        assert len(worker_pids(server)) == 2, server.log()
        assert server.proc is not None
        os.killpg(server.proc.pid, signal.SIGINT)
        assert server.proc.wait(60) == 0, server.log()
        assert "Traceback" not in server.log() and "KeyboardInterrupt" not in server.log()


# -- user input that looks like Rich markup --------------------------------------------------

SECRET = "cli-hardening-secret-0123456789abcdef"


def assert_one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    text = one_line(done.stderr)
    assert text.startswith("error: "), done.stderr
    for word in words:
        assert word in text, done.stderr


@pytest.mark.parametrize("typed", ["[/x]", "[bold]x", "a[/]b", "\\[x]"])
def test_input_that_looks_like_markup_is_shown_as_typed(tmp_path: Path, typed: str) -> None:
    data_dir = tmp_path / "data"
    done = run_cli("token", typed, env=clean_env(HONGBAO_SECRET=SECRET))
    assert_one_line_error(done, 2, f"invalid user id {typed!r}")
    port = str(free_port())
    done = run_cli("serve", "--data-dir", str(data_dir), "--port", port, "--ack", typed)
    assert_one_line_error(done, 2, f"not {typed!r}")
    done = run_cli(
        "serve", "--data-dir", str(data_dir), "--port", port, env=clean_env(HONGBAO_BUCKETS=typed)
    )
    assert_one_line_error(done, 2, "HONGBAO_BUCKETS", typed)
    assert not data_dir.exists()  # refused before anything was made


def test_messages_hongbao_escapes_itself_are_not_escaped_twice(tmp_path: Path) -> None:
    done = run_cli("migrate", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    done = run_cli("webhooks", "enable", "[/x]", "--data-dir", str(tmp_path))
    assert_one_line_error(done, 2, "no webhook endpoint '[/x]' (see hongbao webhooks list)")
    assert "\\" not in done.stderr


# -- commands on a data folder with no ledger ---------------------------------------------------

LEDGER_COMMANDS = [
    ["withdrawals", "pending"],
    ["webhooks", "list"],
    ["webhooks", "failed"],
    ["webhooks", "retry", "1"],
    ["webhooks", "retry-all"],
    ["webhooks", "enable", "wh1"],
    ["webhooks", "prune", "--older-than", "30d"],
    ["webhooks", "dispatch"],
    ["statement", "--date", "2026-11-26"],
]


@pytest.mark.parametrize("args", LEDGER_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("exists", [True, False], ids=["empty-folder", "no-folder"])
def test_a_folder_without_a_ledger_is_refused_and_left_alone(
    tmp_path: Path, args: list[str], exists: bool
) -> None:
    data_dir = tmp_path / "data"
    if exists:
        data_dir.mkdir()
    done = run_cli(*args, "--data-dir", str(data_dir), timeout=30)
    assert_one_line_error(done, 2, f"{data_dir} holds no ledger (ledger.sqlite3)")
    assert sorted(data_dir.iterdir()) == [] if exists else not data_dir.exists()
