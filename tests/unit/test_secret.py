"""The server secret: the data folder's file, the environment, at least 32 bytes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from hongbao.errors import ConfigurationError
from hongbao.identity.config import (
    IdentityConfig,
    load_or_create_secret,
    secret_from_env_or_dir,
)
from tests.tokens import claims_of


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


@pytest.mark.parametrize("content", ["tiny", "a" * 31])
def test_short_secret_file_is_rejected(tmp_path: Path, content: str) -> None:
    (tmp_path / "secret").write_text(content)
    with pytest.raises(ConfigurationError, match="32 bytes"):
        load_or_create_secret(tmp_path)


def test_secret_from_env_or_dir(tmp_path: Path) -> None:
    env_secret = "an-env-secret-of-enough-length-0123456789"
    assert secret_from_env_or_dir(env_secret, tmp_path) == env_secret.encode()
    assert not (tmp_path / "secret").exists()  # env wins; nothing created
    from_dir = secret_from_env_or_dir(None, tmp_path)
    assert from_dir == secret_from_env_or_dir("", tmp_path) == load_or_create_secret(tmp_path)
    with pytest.raises(ConfigurationError):
        secret_from_env_or_dir(None, None)


@pytest.mark.parametrize("short", ["short-secret", "x" * 31])
def test_a_secret_under_32_bytes_is_a_configuration_error(short: str) -> None:
    with pytest.raises(ConfigurationError, match="at least 32 bytes") as caught:
        secret_from_env_or_dir(short, None)
    assert short not in str(caught.value)
    assert secret_from_env_or_dir("x" * 32, None) == b"x" * 32
    with pytest.raises(ConfigurationError, match="at least 32 bytes"):
        IdentityConfig(b"x" * 32, previous_secrets=(short.encode(),))


def test_config_from_env(tmp_path: Path) -> None:
    env = {
        "HONGBAO_SECRET": "s" * 40,
        "HONGBAO_PREVIOUS_SECRETS": "p" * 32 + ", " + "q" * 32,
        "HONGBAO_JWT_JWKS_URL": "https://id.example/.well-known/jwks.json",
        "HONGBAO_JWT_ISSUER": "https://id.example/",
        "HONGBAO_JWT_AUDIENCE": "hongbao",
        "HONGBAO_JWT_LEEWAY": "5",
        "HONGBAO_JWT_ROLES_CLAIM": "groups",
    }
    config = IdentityConfig.from_env(env, tmp_path)
    assert config.secret == b"s" * 40
    assert config.previous_secrets == (b"p" * 32, b"q" * 32)
    assert (config.issuer, config.audience, config.leeway) == ("https://id.example/", "hongbao", 5)
    assert config.roles_claim == "groups"
    assert config.allowed_algorithms == {"HS256", "RS256", "ES256", "EdDSA"}
    assert IdentityConfig(b"s" * 32).allowed_algorithms == {"HS256"}
    bad = [
        {"HONGBAO_JWT_JWKS_URL": "ftp://id.example/jwks"},
        {"HONGBAO_JWT_LEEWAY": "soon"},
        {"HONGBAO_JWT_ALGORITHMS": "HS512"},
        {"HONGBAO_JWT_JWKS_URL": "file:///k.json", "HONGBAO_JWT_PUBLIC_KEY_FILE": "/k.pem"},
    ]
    for extra in bad:
        with pytest.raises(ConfigurationError):
            IdentityConfig.from_env({"HONGBAO_SECRET": "s" * 40, **extra})


def test_file_secret_works_from_env(tmp_path: Path) -> None:
    from hongbao.identity.mint import mint_token

    secret = load_or_create_secret(tmp_path)
    token = mint_token(secret, "alice")
    env_secret = secret_from_env_or_dir((tmp_path / "secret").read_text(), None)
    assert claims_of(token, env_secret)["sub"] == "alice"
