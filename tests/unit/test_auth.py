"""Bearer tokens and the server secret."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import stat
from pathlib import Path

import pytest

from hongbao.auth import (
    Principal,
    bearer_token,
    issue_token,
    issue_tokens,
    load_or_create_secret,
    secret_from_env_or_dir,
    valid_user_id,
    verify_token,
)
from hongbao.errors import AuthError, ConfigurationError, HongbaoError, InvalidRequest

SECRET = b"0123456789abcdef0123456789abcdef"
OTHER = b"fedcba9876543210fedcba9876543210"
NOW = 1_700_000_000.0


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_round_trip() -> None:
    token = issue_token(SECRET, "alice", ttl=60, now=NOW)
    assert token.startswith("v1.") and token.count(".") == 2
    principal = verify_token(SECRET, token, now=NOW + 1)
    assert principal == Principal(user_id="alice", admin=False, expires_at=int(NOW) + 60)


def test_admin_flag() -> None:
    token = issue_token(SECRET, "root@ops", admin=True, now=NOW)
    assert verify_token(SECRET, token, now=NOW).admin is True


def test_default_clock() -> None:
    assert verify_token(SECRET, issue_token(SECRET, "bob")).user_id == "bob"


def test_expired() -> None:
    token = issue_token(SECRET, "alice", ttl=60, now=NOW)
    verify_token(SECRET, token, now=NOW + 59)
    with pytest.raises(AuthError, match="expired") as caught:
        verify_token(SECRET, token, now=NOW + 60)
    assert caught.value.code == "unauthorized"
    assert isinstance(caught.value, HongbaoError)
    assert caught.value.reason == "token expired"


def test_forged_signature() -> None:
    token = issue_token(SECRET, "alice", now=NOW)
    head, payload, sig = token.split(".")
    forged = b64(bytes(32))
    with pytest.raises(AuthError, match="signature"):
        verify_token(SECRET, f"{head}.{payload}.{forged}", now=NOW)
    flipped = sig[:-2] + ("A" if sig[-2] != "A" else "B") + sig[-1]
    with pytest.raises(AuthError, match="signature"):
        verify_token(SECRET, f"{head}.{payload}.{flipped}", now=NOW)


@pytest.mark.parametrize("key_length", [16, 32, 63, 64, 65, 200])
def test_signature_is_standard_hmac_sha256(key_length: int) -> None:
    """The signature is HMAC-SHA256 as `hmac` makes it, for keys up to and beyond
    SHA-256's 64-byte block (a longer key is hashed first)."""
    secret = bytes(range(7, 7 + key_length))
    token = issue_token(secret, "alice", now=NOW)
    signed, _, sig = token.rpartition(".")
    expected = hmac.new(secret, signed.encode(), hashlib.sha256).digest()
    assert sig == b64(expected)
    assert verify_token(secret, token, now=NOW).user_id == "alice"


def test_tampered_payload() -> None:
    token = issue_token(SECRET, "alice", now=NOW)
    head, payload, sig = token.split(".")
    data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    for change in ({"sub": "mallory"}, {"adm": True}, {"exp": data["exp"] + 10**6}):
        tampered = b64(json.dumps({**data, **change}, separators=(",", ":")).encode())
        with pytest.raises(AuthError, match="signature"):
            verify_token(SECRET, f"{head}.{tampered}.{sig}", now=NOW)


@pytest.mark.parametrize(
    "token",
    [
        "",
        None,
        "v1",
        "v1.",
        "v1..",
        "v2.eyJ9.c2ln",
        "Bearer v1.eyJ9.c2ln",
        "v1.eyJ9",
        "v1.!!!.c2ln",
        "v1.eyJ9.c2ln=",
        "v1.eyJ9.c2ln.extra",
        "v1.a.b.c",
        "v1." + "A" * 1000 + ".c2ln",
    ],
)
def test_malformed(token: str | None) -> None:
    with pytest.raises(AuthError):
        verify_token(SECRET, token, now=NOW)


def test_extra_dots_on_a_real_token() -> None:
    token = issue_token(SECRET, "alice", now=NOW)
    for bad in (token + ".", "." + token, token.replace(".", "..", 1), token + ".x"):
        with pytest.raises(AuthError, match="malformed"):
            verify_token(SECRET, bad, now=NOW)


def test_validly_signed_but_malformed_payload_is_rejected() -> None:
    import hashlib
    import hmac

    for payload in (b"not json", b"[1,2]", b'{"sub":"a","adm":0,"exp":9999999999}', b"\xff"):
        body = f"v1.{b64(payload)}"
        sig = b64(hmac.new(SECRET, body.encode(), hashlib.sha256).digest())
        with pytest.raises(AuthError, match="payload"):
            verify_token(SECRET, f"{body}.{sig}", now=NOW)


def test_other_secret_fails() -> None:
    token = issue_token(SECRET, "alice", now=NOW)
    with pytest.raises(AuthError, match="signature"):
        verify_token(OTHER, token, now=NOW)


def test_issue_rejects_bad_input() -> None:
    with pytest.raises(InvalidRequest):
        issue_token(SECRET, "has space")
    with pytest.raises(InvalidRequest):
        issue_token(SECRET, "alice", ttl=0)
    with pytest.raises(ConfigurationError):
        issue_token(b"short", "alice")
    with pytest.raises(InvalidRequest):
        issue_tokens(SECRET, ["ok", "x" * 65])


@pytest.mark.parametrize(
    ("user_id", "ok"),
    [
        ("alice", True),
        ("u_1.2:3@x-y", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("", False),
        ("a b", False),
        ("a/b", False),
        ("张三", False),
        ("alice\n", False),
    ],
)
def test_valid_user_id(user_id: str, ok: bool) -> None:
    assert valid_user_id(user_id) is ok


def test_issue_100k_tokens() -> None:
    users = [f"user-{i}" for i in range(100_000)]
    tokens = issue_tokens(SECRET, users, ttl=3600)
    assert len(tokens) == len(set(tokens)) == 100_000
    for i in (0, 4_242, 99_999):
        assert verify_token(SECRET, tokens[i]).user_id == users[i]


def test_bearer_token() -> None:
    assert bearer_token("Bearer abc.def") == "abc.def"
    assert bearer_token("bearer  abc ") == "abc"
    for bad in (None, "", "Basic abc", "Bearer", "Bearer  "):
        with pytest.raises(AuthError):
            bearer_token(bad)


def test_secret_file_is_private_and_stable(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    secret = load_or_create_secret(data_dir)
    path = data_dir / "secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(secret) == 64 and bytes.fromhex(secret.decode())
    assert load_or_create_secret(data_dir) == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in data_dir.iterdir()] == ["secret"]  # no temp files left


def test_loose_secret_file_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("a" * 64)
    path.chmod(0o644)
    assert load_or_create_secret(tmp_path) == b"a" * 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_short_secret_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("tiny")
    with pytest.raises(ConfigurationError):
        load_or_create_secret(tmp_path)


def test_secret_from_env_or_dir(tmp_path: Path) -> None:
    assert secret_from_env_or_dir("an-env-secret-of-enough-length", tmp_path) == (
        b"an-env-secret-of-enough-length"
    )
    assert not (tmp_path / "secret").exists()  # env wins; nothing created
    from_dir = secret_from_env_or_dir(None, tmp_path)
    assert from_dir == secret_from_env_or_dir("", tmp_path) == load_or_create_secret(tmp_path)
    with pytest.raises(ConfigurationError):
        secret_from_env_or_dir(None, None)
    with pytest.raises(ConfigurationError) as caught:
        secret_from_env_or_dir("short-secret", None)
    assert "short-secret" not in str(caught.value)


def test_file_secret_works_from_env(tmp_path: Path) -> None:
    secret = load_or_create_secret(tmp_path)
    token = issue_token(secret, "alice")
    env_secret = secret_from_env_or_dir((tmp_path / "secret").read_text(), None)
    assert verify_token(env_secret, token).user_id == "alice"
