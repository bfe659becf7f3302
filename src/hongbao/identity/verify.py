"""Bearer tokens: JWTs checked by PyJWT against keys and algorithms fixed by configuration.

The token's header only says which configured key to try (``kid``) and which of the
configured algorithms it claims (``alg``); PyJWT then checks the signature with that key
for that one algorithm, and the claims: ``exp`` required, ``nbf`` and ``iat`` honoured
with the configured leeway. ``iss`` and ``aud``, when configured, are required of the
tokens signed with the host app's public keys (its identity provider's); an HS256 token
is signed with hongbao's own secret, whose holder is trusted whatever it names. HS256
tokens are only ever checked against those secrets, so an HS256 token signed with a
public key as its secret fails like any other forgery. Every refusal is an `AuthError` whose
reason says what was wrong.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from typing import Any

import jwt
import orjson
from jwt.algorithms import HMACAlgorithm
from jwt.api_jws import PyJWS

from hongbao.domain.ids import valid_user_id
from hongbao.errors import AuthError
from hongbao.identity.config import IdentityConfig
from hongbao.identity.jwks import JwksKeys, VerifyKey, pem_key
from hongbao.identity.mint import key_id
from hongbao.identity.principal import ADMIN_ROLE, MAX_ADMIN_TTL, SERVICE_ROLE, Principal

MAX_TOKEN_LENGTH = 8192
OLD_FORMAT = "hongbao tokens are JWTs now: mint a new one, see the README's upgrade note"


class UnknownKeyId(AuthError):
    """A token whose kid no configured key has (a JWKS may then be fetched again)."""

    def __init__(self, kid: str | None) -> None:
        super().__init__(
            "the token names an unknown signing key (kid)"
            if kid is not None
            else "the token names no key id (kid) and several keys are configured"
        )
        self.kid = kid


class TokenVerifier:
    """Checks one token at a time (no cache: `hongbao.identity.gate` keeps one)."""

    def __init__(self, config: IdentityConfig, jwks: JwksKeys | None = None) -> None:
        self.config = config
        self.jwks = jwks
        self.allowed = config.allowed_algorithms
        self.pem = pem_key(config.public_key_file) if config.public_key_file else None
        secrets = (config.secret, *config.previous_secrets)
        #: HS256 keys by kid, and all of them in order (current first) for tokens without one
        self.hmac_keys = {key_id(s): _hmac_key(s) for s in reversed(secrets)}
        self.hmac_all = [self.hmac_keys[key_id(s)] for s in secrets]
        #: PyJWT's arguments for HS256 tokens, and for the public keys' tokens
        self.hmac_checks: dict[str, Any] = {
            "leeway": config.leeway,
            "options": {"require": ["exp", "sub"], "verify_aud": False, "verify_iss": False},
        }
        required = ["exp", "sub"]
        required += ["iss"] if config.issuer is not None else []
        required += ["aud"] if config.audience is not None else []
        self.public_checks: dict[str, Any] = {
            "leeway": config.leeway,
            "issuer": config.issuer,
            "audience": config.audience,
            "options": {"require": required, "verify_aud": config.audience is not None},
        }

    def verify(self, token: str, now: float | None = None) -> Principal:
        """The principal of `token`, acting for itself; AuthError (`UnknownKeyId` for a kid
        no key has) when it is refused."""
        if len(token) > MAX_TOKEN_LENGTH:
            raise AuthError(f"the token is longer than {MAX_TOKEN_LENGTH} characters")
        if token.startswith("v1."):
            raise AuthError(OLD_FORMAT)
        algorithm, kid = _header(token)
        if algorithm not in self.allowed:
            allowed = ", ".join(sorted(self.allowed))
            raise AuthError(f"the token's algorithm {algorithm!r} is not accepted ({allowed})")
        if algorithm == "HS256":
            if kid is None:
                candidates = self.hmac_all
            elif kid in self.hmac_keys:
                candidates = [self.hmac_keys[kid]]
            else:  # never a public key's kid: HS256 is only ever checked with a secret
                raise AuthError("the token names an unknown signing key (kid)")
        else:
            key = self._public_key(kid)
            if key.algorithm != algorithm:
                raise AuthError(
                    f"the token's algorithm {algorithm} is not the one of its key ({key.algorithm})"
                )
            candidates = [key.key]
        claims = self._decode(token, algorithm, candidates)
        return self._principal(claims, time.time() if now is None else now)

    def _public_key(self, kid: str | None) -> VerifyKey:
        if self.pem is not None:
            return self.pem
        key = self.jwks.get(kid) if self.jwks is not None else None
        if key is None:
            raise UnknownKeyId(kid)
        return key

    def _decode(self, token: str, algorithm: str, keys: list[Any]) -> dict[str, Any]:
        checks = self.hmac_checks if algorithm == "HS256" else self.public_checks
        for n, key in enumerate(keys, start=1):
            try:
                claims: dict[str, Any] = _JWT.decode(token, key, algorithms=[algorithm], **checks)
                return claims
            except jwt.InvalidSignatureError:
                if n == len(keys):
                    raise AuthError("invalid token signature") from None
            except jwt.PyJWTError as exc:
                raise AuthError(_reason(exc)) from None
        raise AuthError("no key to check the token with")  # keys is never empty

    def _principal(self, claims: dict[str, Any], now: float) -> Principal:
        sub = claims["sub"]
        if not valid_user_id(sub):
            raise AuthError(
                "the token's sub is not a user id (1-64 of letters, digits and _ . : @ -)"
            )
        exp = int(claims["exp"])
        iat_claim = claims.get("iat")
        iat = int(iat_claim) if iat_claim is not None else None
        roles = self._roles(claims)
        admin = ADMIN_ROLE in roles
        if admin and exp - (iat if iat is not None else now) > MAX_ADMIN_TTL:
            raise AuthError(f"an admin token may live at most {MAX_ADMIN_TTL} seconds (24 h)")
        return Principal(sub, admin, SERVICE_ROLE in roles, None, iat, exp)

    def _roles(self, claims: dict[str, Any]) -> set[str]:
        """The roles claim (a list, or space-separated text) and the ``scope`` claim."""
        name = self.config.roles_claim
        value = claims.get(name)
        roles: set[str] = set()
        if isinstance(value, str):
            roles.update(value.split())
        elif isinstance(value, list) and all(isinstance(r, str) for r in value):
            roles.update(value)
        elif value is not None:
            raise AuthError(f"the token's {name} claim must be a list of role names")
        scope = claims.get("scope")
        if isinstance(scope, str):
            roles.update(scope.split())
        return roles


class _PreparedHmac(HMACAlgorithm):
    """HS256 for one secret, its key prepared once. PyJWT prepares the key again on every
    decode (it sniffs PEM, SSH and DER forms and tries to parse the secret as JSON: about
    a quarter of a first verification), and for the same secret the result is the same."""

    def __init__(self, secret: bytes) -> None:
        super().__init__(HMACAlgorithm.SHA256)
        self.secret = secret
        self.prepared = super().prepare_key(secret)

    def prepare_key(self, key: str | bytes) -> bytes:
        if key == self.secret:
            return self.prepared
        return super().prepare_key(key)


#: a base64url segment without its padding: the alphabet only
_BASE64URL = re.compile(rb"[A-Za-z0-9_-]*")


class _RegexSegments(PyJWS):
    """PyJWS with its check of each segment's base64url alphabet done by one regex.

    PyJWT (2.14 and later, the lower bound in pyproject.toml, where PyJWS checks segments
    in this method and PyJWT verifies through its own `_jws`) tests each character of a
    segment in a Python generator, about a quarter of a first verification. This method
    accepts and refuses exactly the segments PyJWT's does, with the same error
    (tests/unit/test_identity.py compares the two on generated segments)."""

    @staticmethod
    def _decode_base64url_segment(segment: bytes, name: str) -> bytes:
        stripped = segment.rstrip(b"=")
        padding = len(segment) - len(stripped)
        if (
            padding > 2
            or (padding and len(segment) % 4)
            or len(stripped) % 4 == 1
            or not _BASE64URL.fullmatch(stripped)
        ):
            raise jwt.DecodeError(f"Invalid {name} padding")
        try:
            decoded = base64.urlsafe_b64decode(stripped + b"=" * (-len(stripped) % 4))
        except binascii.Error as err:
            raise jwt.DecodeError(f"Invalid {name} padding") from err
        if base64.urlsafe_b64encode(decoded).rstrip(b"=") != stripped:
            raise jwt.DecodeError(f"Invalid {name} padding")  # not the canonical encoding
        return decoded


class _Jwt(jwt.PyJWT):
    """PyJWT, its signatures checked by `_RegexSegments`."""

    def __init__(self) -> None:
        super().__init__()
        self._jws = _RegexSegments(options=self._get_sig_options())


_JWT = _Jwt()


def _hmac_key(secret: bytes) -> jwt.PyJWK:
    """An HS256 key bound to that one algorithm, prepared once (`_PreparedHmac`)."""
    encoded = jwt.utils.base64url_encode(secret).decode("ascii")
    key = jwt.PyJWK({"kty": "oct", "k": encoded}, algorithm="HS256")
    key.Algorithm = _PreparedHmac(key.key)  # what PyJWT verifies a PyJWK's tokens with
    return key


def _header(token: str) -> tuple[str | None, str | None]:
    """The (alg, kid) a token's header claims: only to pick a configured key, which
    PyJWT then checks the whole token with. Both are looked up in sets and dicts, so a
    value of another JSON type (a list, an object: unhashable) is refused here."""
    head, dot, _ = token.partition(".")
    try:
        if not dot:
            raise ValueError("no dot")
        header = orjson.loads(binascii.a2b_base64(_standard_b64(head)))
    except (ValueError, binascii.Error):
        raise AuthError("malformed token: not a JWT") from None
    if not isinstance(header, dict):
        raise AuthError("malformed token: not a JWT")
    algorithm = header.get("alg")
    if algorithm is not None and not isinstance(algorithm, str):
        raise AuthError("malformed token: its alg is not a string")
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise AuthError("malformed token: its kid is not a string")
    return algorithm, kid


def _standard_b64(part: str) -> str:
    """base64url text as standard base64, padded (a2b_base64 is the fast decoder)."""
    if not part.isascii():
        raise ValueError("not base64url")
    return part.replace("-", "+").replace("_", "/") + "=" * (-len(part) % 4)


def _reason(exc: jwt.PyJWTError) -> str:
    """What a PyJWT refusal means, in a sentence a client's developer can act on."""
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "token expired"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "token not yet valid (its nbf or iat is in the future)"
    if isinstance(exc, jwt.InvalidIssuerError):
        return "wrong issuer (iss)"
    if isinstance(exc, jwt.InvalidAudienceError):
        return "wrong audience (aud)"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"the token lacks the {exc.claim} claim"
    if isinstance(exc, jwt.InvalidAlgorithmError):
        return "the token's algorithm is not accepted"
    if isinstance(exc, jwt.DecodeError):
        return "malformed token"
    return f"invalid token: {exc}"
