"""What the identity layer is configured with: secrets, public keys, claims to check.

Everything comes from ``HONGBAO_*`` environment variables (`IdentityConfig.from_env`):

- ``HONGBAO_SECRET`` (else the data folder's ``secret`` file, made on first start):
  the HS256 key, at least 32 bytes; ``HONGBAO_PREVIOUS_SECRETS`` (comma-separated)
  still verify tokens signed before a rotation, until they expire.
- ``HONGBAO_JWT_JWKS_URL`` (``https://``, ``http://`` or ``file://``) or
  ``HONGBAO_JWT_PUBLIC_KEY_FILE`` (PEM): the host app's public keys, for RS256, ES256
  and EdDSA tokens.
- ``HONGBAO_JWT_ISSUER``, ``HONGBAO_JWT_AUDIENCE``: checked when set.
- ``HONGBAO_JWT_LEEWAY``: seconds of clock skew allowed on exp, nbf and iat (30).
- ``HONGBAO_JWT_ROLES_CLAIM``: the claim listing the roles (``roles``).
- ``HONGBAO_JWT_ALGORITHMS``: restricts the algorithms accepted (default: HS256, and
  the asymmetric ones when public keys are configured).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hongbao.errors import ConfigurationError

logger = logging.getLogger("hongbao.identity")

#: HS256 keys shorter than SHA-256's output are weaker than the algorithm (RFC 7518 §3.2)
MIN_SECRET_BYTES = 32
SECRET_FILE = "secret"
DEFAULT_LEEWAY = 30
DEFAULT_ROLES_CLAIM = "roles"
HMAC_ALGORITHMS = ("HS256",)
ASYMMETRIC_ALGORITHMS = ("RS256", "ES256", "EdDSA")
JWKS_SCHEMES = ("https://", "http://", "file://")
#: what the secret is keyed with to make the passphrase key (a key of its own, so a
#: passphrase digest is never a token signature and the reverse)
PASSPHRASE_KEY_LABEL = b"hongbao packet passphrase key v1"


@dataclass(frozen=True)
class IdentityConfig:
    """How bearer tokens are verified (see the module docstring for the variables)."""

    #: the HS256 key `hongbao token` signs with
    secret: bytes
    #: earlier HS256 keys, still accepted
    previous_secrets: tuple[bytes, ...] = ()
    jwks_url: str | None = None
    public_key_file: Path | None = None
    issuer: str | None = None
    audience: str | None = None
    leeway: int = DEFAULT_LEEWAY
    roles_claim: str = DEFAULT_ROLES_CLAIM
    #: None: HS256, plus the asymmetric algorithms when public keys are configured
    algorithms: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for key in (self.secret, *self.previous_secrets):
            require_secret(key)
        if self.jwks_url is not None and self.public_key_file is not None:
            raise ConfigurationError(
                "set HONGBAO_JWT_JWKS_URL or HONGBAO_JWT_PUBLIC_KEY_FILE, not both"
            )
        if self.jwks_url is not None and not self.jwks_url.startswith(JWKS_SCHEMES):
            raise ConfigurationError(
                "HONGBAO_JWT_JWKS_URL must start with https://, http:// or file://"
            )
        if isinstance(self.leeway, bool) or not isinstance(self.leeway, int) or self.leeway < 0:
            raise ConfigurationError("HONGBAO_JWT_LEEWAY must be a whole number of seconds >= 0")
        if not self.roles_claim:
            raise ConfigurationError("HONGBAO_JWT_ROLES_CLAIM must name a claim")
        if self.algorithms is not None:
            known = (*HMAC_ALGORITHMS, *ASYMMETRIC_ALGORITHMS)
            unknown = [a for a in self.algorithms if a not in known]
            if unknown or not self.algorithms:
                raise ConfigurationError(
                    f"HONGBAO_JWT_ALGORITHMS takes some of {', '.join(known)}, "
                    f"not {', '.join(unknown) or 'nothing'}"
                )

    def passphrase_keys(self) -> tuple[bytes, ...]:
        """The keys of packet passphrases' digests (hongbao.domain.rules), derived from the
        secret and then the previous secrets: digests made before a rotation still match
        while the previous secret is listed."""
        return tuple(
            hmac.new(secret, PASSPHRASE_KEY_LABEL, hashlib.sha256).digest()
            for secret in (self.secret, *self.previous_secrets)
        )

    @property
    def public_keys(self) -> bool:
        """True when RS256 / ES256 / EdDSA tokens have keys to be checked against."""
        return self.jwks_url is not None or self.public_key_file is not None

    @property
    def allowed_algorithms(self) -> frozenset[str]:
        """The algorithms a token may name; fixed here, never taken from a token."""
        if self.algorithms is not None:
            chosen = set(self.algorithms)
            if not self.public_keys:
                chosen -= set(ASYMMETRIC_ALGORITHMS)
            return frozenset(chosen)
        return frozenset((*HMAC_ALGORITHMS, *(ASYMMETRIC_ALGORITHMS if self.public_keys else ())))

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, data_dir: Path | None = None
    ) -> IdentityConfig:
        """The configuration in `env` (default: os.environ); the secret from the data folder
        (created there if new) when HONGBAO_SECRET is not set."""
        env = os.environ if env is None else env

        def text(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        leeway_text = text("HONGBAO_JWT_LEEWAY")
        try:
            leeway = int(leeway_text) if leeway_text is not None else DEFAULT_LEEWAY
        except ValueError:
            raise ConfigurationError(
                "HONGBAO_JWT_LEEWAY must be a whole number of seconds"
            ) from None
        key_file = text("HONGBAO_JWT_PUBLIC_KEY_FILE")
        algorithms = text("HONGBAO_JWT_ALGORITHMS")
        previous = text("HONGBAO_PREVIOUS_SECRETS") or ""
        return cls(
            secret=secret_from_env_or_dir(env.get("HONGBAO_SECRET"), data_dir),
            previous_secrets=tuple(p.strip().encode() for p in previous.split(",") if p.strip()),
            jwks_url=text("HONGBAO_JWT_JWKS_URL"),
            public_key_file=Path(key_file) if key_file else None,
            issuer=text("HONGBAO_JWT_ISSUER"),
            audience=text("HONGBAO_JWT_AUDIENCE"),
            leeway=leeway,
            roles_claim=text("HONGBAO_JWT_ROLES_CLAIM") or DEFAULT_ROLES_CLAIM,
            algorithms=(
                tuple(a.strip() for a in algorithms.split(",") if a.strip()) if algorithms else None
            ),
        )


def require_secret(secret: object) -> bytes:
    """`secret` if it is bytes of at least MIN_SECRET_BYTES; ConfigurationError otherwise."""
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise ConfigurationError(
            f"the secret must be at least {MIN_SECRET_BYTES} bytes (HONGBAO_SECRET, "
            "HONGBAO_PREVIOUS_SECRETS): `openssl rand -hex 32` makes one"
        )
    return secret


def load_or_create_secret(data_dir: Path) -> bytes:
    """The secret in ``data_dir/secret``, creating it (32 random bytes as hex, mode 0600).

    The returned bytes are the file's text, so its content can equally be passed in the
    environment. Creation is atomic: a private temp file is linked into place, so no reader
    ever sees a partial or world-readable secret, and concurrent creators agree on one.
    """
    path = Path(data_dir) / SECRET_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _create_secret(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        logger.warning("secret file %s had mode %o; restricting it to 0600", path, mode)
        path.chmod(0o600)
    value = path.read_bytes().strip()
    if len(value) < MIN_SECRET_BYTES:
        raise ConfigurationError(
            f"secret file {path} holds less than {MIN_SECRET_BYTES} bytes: delete it "
            "(a new one is made) or write a longer secret there"
        )
    return value


def secret_from_env_or_dir(env_value: str | None, data_dir: Path | None) -> bytes:
    """The secret from the environment value if set, else from `data_dir` (created if new)."""
    if env_value is not None and env_value.strip():
        return require_secret(env_value.strip().encode())
    if data_dir is None:
        raise ConfigurationError("no secret: set HONGBAO_SECRET or give a data directory")
    return load_or_create_secret(data_dir)


def _create_secret(path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # whatever the umask
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)  # atomic, and never replaces a concurrent creator's secret
    finally:
        tmp.unlink()
