"""Bearer tokens: JWTs minted with PyJWT and `cryptography` directly, as a host app would,
checked by hongbao's identity layer (no Redis: revocations have their own tests)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st
from jwt.api_jws import PyJWS

from hongbao.errors import AuthError, Forbidden, InvalidRequest
from hongbao.identity.config import IdentityConfig
from hongbao.identity.gate import Identity, bearer_token
from hongbao.identity.jwks import parse_jwks
from hongbao.identity.mint import key_id, mint_tokens
from hongbao.identity.principal import Principal
from hongbao.identity.redact import RedactCredentials, redact
from hongbao.identity.verify import OLD_FORMAT, _hmac_key, _RegexSegments
from tests.tokens import ADMIN, SERVICE, hs256, mint, public_jwk

SECRET = b"identity-unit-tests-secret-0123456789abcdef"
OLD_SECRET = b"identity-unit-tests-old-secret-0123456789ab"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


KEYS = {
    "RS256": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ES256": ec.generate_private_key(ec.SECP256R1()),
    "EdDSA": ed25519.Ed25519PrivateKey.generate(),
}


@pytest.fixture
def jwks_file(tmp_path: Path) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [public_jwk(k, f"k-{a}") for a, k in KEYS.items()]}))
    return path


@pytest.fixture
async def identity(jwks_file: Path) -> Identity:
    config = IdentityConfig(
        SECRET,
        previous_secrets=(OLD_SECRET,),
        jwks_url=jwks_file.as_uri(),
        issuer="https://id.example/",
        audience="hongbao",
    )
    ident = Identity(config)
    assert ident.jwks is not None and await ident.jwks.refresh()
    return ident


def asym(alg: str, user: str = "alice", **kw: Any) -> str:
    claims = {"iss": "https://id.example/", "aud": "hongbao", **kw}
    return mint(user, KEYS[alg], algorithm=alg, kid=f"k-{alg}", **claims)


async def auth(identity: Identity, token: str, on_behalf_of: str | None = None) -> Principal:
    return await identity.authenticate(f"Bearer {token}", on_behalf_of)


async def refused(identity: Identity, token: str, why: str) -> None:
    with pytest.raises(AuthError, match=why):
        await auth(identity, token)


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
async def test_asymmetric_tokens_from_the_jwks(identity: Identity, alg: str) -> None:
    principal = await auth(identity, asym(alg, roles=[ADMIN]))
    assert principal.user_id == "alice" and principal.admin and not principal.service
    assert principal.actor is None


async def test_hs256_with_the_secret_and_the_previous_ones(identity: Identity) -> None:
    assert (await auth(identity, hs256("bob", SECRET))).user_id == "bob"
    assert (await auth(identity, hs256("bob", SECRET, kid=key_id(SECRET)))).user_id == "bob"
    # signed before a rotation: the previous secret, with or without its kid
    assert (await auth(identity, hs256("carol", OLD_SECRET))).user_id == "carol"
    old = hs256("carol", OLD_SECRET, kid=key_id(OLD_SECRET))
    assert (await auth(identity, old)).user_id == "carol"
    await refused(identity, hs256("bob", SECRET, kid="nope"), "unknown signing key")


async def test_hongbao_tokens_are_plain_hs256_jwts(identity: Identity) -> None:
    (token,) = mint_tokens(SECRET, ["dora"], service=True, ttl=120)
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "HS256", "kid": key_id(SECRET), "typ": "JWT"}
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["sub"] == "dora" and claims["roles"] == [SERVICE]
    assert claims["exp"] - claims["iat"] == 120
    assert (await auth(identity, token)).service


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("wrong issuer", "wrong issuer"),
        ("wrong audience", "wrong audience"),
        ("expired", "token expired"),
        ("not yet valid", "not yet valid"),
        ("issued in the future", "not yet valid"),
        ("no exp", "lacks the exp claim"),
        ("unknown kid", "unknown signing key"),
        ("bad sub", "sub is not a user id"),
        ("bad roles", "roles claim must be a list"),
    ],
)
async def test_refusals_say_why(identity: Identity, case: str, why: str) -> None:
    now = int(time.time())
    token = {
        "wrong issuer": lambda: asym("RS256", iss="https://evil.example/"),
        "wrong audience": lambda: asym("ES256", aud="someone-else"),
        "expired": lambda: asym("EdDSA", now=now - 7200, ttl=3600),
        "not yet valid": lambda: asym("RS256", nbf=now + 600),
        "issued in the future": lambda: asym("RS256", now=now + 600),
        "no exp": lambda: jwt.encode({"sub": "a"}, SECRET, algorithm="HS256"),
        "unknown kid": lambda: mint("a", KEYS["RS256"], algorithm="RS256", kid="k-gone"),
        "bad sub": lambda: hs256("has space", SECRET),
        "bad roles": lambda: jwt.encode(
            {"sub": "a", "exp": now + 60, "roles": 7}, SECRET, algorithm="HS256"
        ),
    }[case]()
    await refused(identity, token, why)


async def test_leeway_forgives_a_little_clock_skew(identity: Identity) -> None:
    now = int(time.time())
    assert await auth(identity, asym("RS256", nbf=now + 10))
    assert await auth(identity, asym("RS256", now=now - 3600 - 10, ttl=3600))


async def test_alg_none_is_refused(identity: Identity) -> None:
    header = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    payload = b64(json.dumps({"sub": "root", "exp": int(time.time()) + 60}).encode())
    await refused(identity, f"{header}.{payload}.", "algorithm 'none' is not accepted")


async def test_hs256_signed_with_the_public_key_is_refused(
    identity: Identity, tmp_path: Path
) -> None:
    """The classic confusion: the RSA public key (PEM or JWK text) as an HMAC secret."""
    public = KEYS["RS256"].public_key()
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for kid in ("k-RS256", None):
        head = {"alg": "HS256", "typ": "JWT", **({"kid": kid} if kid else {})}
        signing = f"{b64(json.dumps(head).encode())}.{b64(json.dumps(_claims()).encode())}"
        for secret in (pem, json.dumps(public_jwk(KEYS["RS256"], "k-RS256")).encode()):
            sig = b64(hmac.new(secret, signing.encode(), hashlib.sha256).digest())
            with pytest.raises(AuthError):
                await auth(identity, f"{signing}.{sig}")
    # and with a PEM public key configured instead of a JWKS
    key_file = tmp_path / "key.pem"
    key_file.write_bytes(pem)
    pem_identity = Identity(IdentityConfig(SECRET, public_key_file=key_file))
    assert (await auth(pem_identity, mint("a", KEYS["RS256"], algorithm="RS256"))).user_id == "a"
    head = {"alg": "HS256", "typ": "JWT"}
    signing = f"{b64(json.dumps(head).encode())}.{b64(json.dumps(_claims()).encode())}"
    sig = b64(hmac.new(pem, signing.encode(), hashlib.sha256).digest())
    with pytest.raises(AuthError, match="invalid token signature"):
        await auth(pem_identity, f"{signing}.{sig}")


def _claims() -> dict[str, Any]:
    now = int(time.time())
    return {"sub": "root", "iat": now, "exp": now + 60, "roles": [ADMIN]}


async def test_an_algorithm_the_key_does_not_allow_is_refused(identity: Identity) -> None:
    # an ES256 signature presented as the RSA key's: the key decides, not the token
    token = mint("a", KEYS["ES256"], algorithm="ES256", kid="k-RS256")
    await refused(identity, token, "not the one of its key")
    # asymmetric algorithms are not accepted at all without public keys configured
    hs_only = Identity(IdentityConfig(SECRET))
    await refused(hs_only, asym("RS256"), "'RS256' is not accepted")


async def test_tampered_payload_is_refused(identity: Identity) -> None:
    for token in (hs256("mallory", SECRET), asym("RS256", "mallory")):
        head, payload, sig = token.split(".")
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        claims["roles"] = [ADMIN]
        await refused(identity, f"{head}.{b64(json.dumps(claims).encode())}.{sig}", "signature")


async def test_old_v1_tokens_get_the_upgrade_note(identity: Identity) -> None:
    await refused(identity, "v1.eyJzdWIiOiJhIn0.c2ln", "JWTs now")
    assert "README" in OLD_FORMAT


@pytest.mark.parametrize("bad", ["", "x", "a.b", "not.a.token", "%%%.###.!!!", "e30.e30.e30"])
async def test_malformed_tokens(identity: Identity, bad: str) -> None:
    with pytest.raises(AuthError):
        await identity.authenticate(f"Bearer {bad}" if bad else None)


async def test_admin_tokens_live_at_most_a_day(identity: Identity) -> None:
    assert (await auth(identity, hs256("root", SECRET, admin=True, ttl=86_400))).admin
    await refused(identity, hs256("root", SECRET, admin=True, ttl=86_401), "at most 86400")
    # without iat, the time left counts
    exp = int(time.time()) + 90_000
    no_iat = jwt.encode({"sub": "root", "exp": exp, "roles": [ADMIN]}, SECRET, algorithm="HS256")
    await refused(identity, no_iat, "at most 86400")
    # a user token may live longer
    assert await auth(identity, hs256("u", SECRET, ttl=30 * 86_400))


async def test_roles_from_a_configured_claim_and_from_scope(jwks_file: Path) -> None:
    ident = Identity(IdentityConfig(SECRET, roles_claim="groups"))
    assert (await auth(ident, mint("a", SECRET, groups=[ADMIN]))).admin
    assert not (await auth(ident, mint("b", SECRET, roles=[ADMIN]))).admin
    scoped = await auth(ident, mint("c", SECRET, scope=f"openid {SERVICE}"))
    assert scoped.service and not scoped.admin


async def test_on_behalf_of(identity: Identity) -> None:
    service = hs256("shop-backend", SECRET, service=True)
    acting = await auth(identity, service, "alice")
    assert acting.user_id == "alice" and acting.actor == "shop-backend"
    assert not acting.admin and not acting.service
    for token in (hs256("alice", SECRET), hs256("root", SECRET, admin=True)):
        with pytest.raises(Forbidden, match="service tokens"):
            await auth(identity, token, "bob")
    with pytest.raises(InvalidRequest, match="X-On-Behalf-Of"):
        await auth(identity, service, "no spaces please")


async def test_verified_tokens_are_cached_until_they_expire(identity: Identity) -> None:
    token = hs256("alice", SECRET, ttl=60)
    first = await auth(identity, token)
    assert identity._cache[f"Bearer {token}"] == first
    assert await auth(identity, token) is first
    small = Identity(IdentityConfig(SECRET), cache_size=2)
    for user in ("a", "b", "c"):
        await auth(small, hs256(user, SECRET))
    assert [p.user_id for p in small._cache.values()] == ["b", "c"]
    # an entry past its expiry is checked again (and refused)
    stale = hs256("old", SECRET, now=time.time() - 100, ttl=60)
    small._cache[f"Bearer {stale}"] = Principal("old", False, False, None, 0, 1)
    await refused(small, stale, "expired")


def test_bearer_token() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    for bad in (None, "", "Basic abc", "Bearer", "Bearer  "):
        with pytest.raises(AuthError):
            bearer_token(bad)


async def test_tickets_are_for_one_packet_and_not_bearer_tokens(identity: Identity) -> None:
    alice = await auth(identity, hs256("alice", SECRET))
    ticket = identity.ticket(alice, "p1")
    assert identity.check_ticket(ticket, "p1").user_id == "alice"
    with pytest.raises(AuthError, match="another packet"):
        identity.check_ticket(ticket, "p2")
    with pytest.raises(AuthError):
        await auth(identity, ticket)  # a ticket is no bearer token
    with pytest.raises(AuthError, match="invalid ticket"):
        identity.check_ticket(hs256("alice", SECRET, pkt="p1"), "p1")  # nor the reverse
    expired = identity.tickets.mint(alice, "p1", now=time.time() - 120)
    with pytest.raises(AuthError, match="ticket expired"):
        identity.check_ticket(expired, "p1")


def test_access_log_never_shows_a_token_or_ticket() -> None:
    assert redact("GET /v1/packets/x/events?token=abc.def.ghi HTTP/1.1") == (
        "GET /v1/packets/x/events?token=[redacted] HTTP/1.1"
    )
    assert (
        redact("/e?a=1&ticket=t.t.t&b=2&Token=x") == "/e?a=1&ticket=[redacted]&b=2&Token=[redacted]"
    )
    assert redact("/v1/packets?mytoken=keep") == "/v1/packets?mytoken=keep"
    # uvicorn's access log line, through the filter of a logger
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/v1/packets/p/events?ticket=secret.part.sig", "1.1", 200),
        None,
    )
    assert RedactCredentials().filter(record)
    assert "secret" not in record.getMessage() and "ticket=[redacted]" in record.getMessage()


async def test_a_provider_that_is_down_is_not_asked_again_and_again(tmp_path: Path) -> None:
    from hongbao.identity.jwks import JwksKeys

    keys = JwksKeys((tmp_path / "missing.json").as_uri(), min_refresh=60, max_age=3600)
    assert keys.stale
    assert not await keys.refresh()  # the file is not there: kept trying later
    assert not keys.stale and keys.keys == {}
    assert not await keys.refresh_for("k1")
    assert not await keys.refresh_for("k1")  # within min_refresh: not fetched at all


async def test_a_token_header_of_another_json_type_is_refused(identity: Identity) -> None:
    """alg and kid pick a key from sets and dicts: a list or an object (unhashable) is a
    malformed token, refused like any other, not an error of the server."""
    now = int(time.time())
    payload = b64(json.dumps({"sub": "a", "iat": now, "exp": now + 60}).encode())
    for header, why in [
        ({"alg": ["HS256"]}, "alg is not a string"),
        ({"alg": {"HS256": True}}, "alg is not a string"),
        ({"alg": "RS256", "kid": ["k-RS256"]}, "kid is not a string"),
        ({"alg": "HS256", "kid": {"k": 1}}, "kid is not a string"),
    ]:
        signing = f"{b64(json.dumps(header).encode())}.{payload}"
        sig = b64(hmac.new(SECRET, signing.encode(), hashlib.sha256).digest())
        await refused(identity, f"{signing}.{sig}", why)


def _publish(path: Path, keys: dict[str, Any]) -> None:
    """Rewrite the JWKS file with the public halves of `keys` (by kid)."""
    path.write_text(json.dumps({"keys": [public_jwk(k, kid) for kid, k in keys.items()]}))


def _provider_token(user: str, key: Any, alg: str, kid: str) -> str:
    return mint(user, key, algorithm=alg, kid=kid, iss="https://id.example/", aud="hongbao")


async def test_a_fetch_for_a_new_kid_that_withdraws_a_key_forgets_its_tokens(
    identity: Identity, jwks_file: Path
) -> None:
    old = asym("RS256")
    assert (await auth(identity, old)).user_id == "alice"  # verified, and cached
    # the provider rotates: k-RS256 withdrawn, k-new signs
    new_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _publish(jwks_file, {"k-new": new_key, "k-ES256": KEYS["ES256"]})
    fresh = _provider_token("bob", new_key, "RS256", "k-new")
    assert (await auth(identity, fresh)).user_id == "bob"  # its kid fetched the new set
    await refused(identity, old, "unknown signing key")


async def test_a_key_replaced_under_its_kid_forgets_its_tokens(
    identity: Identity, jwks_file: Path
) -> None:
    old = asym("ES256")
    kept = asym("EdDSA")
    assert await auth(identity, old) and await auth(identity, kept)
    assert identity.jwks is not None
    # the same set fetched again: the verified tokens stay verified
    assert await identity.jwks.refresh()
    assert f"Bearer {old}" in identity._cache and f"Bearer {kept}" in identity._cache
    # another key under k-ES256, fetched by any refresh (here the hourly one's call)
    replacement = ec.generate_private_key(ec.SECP256R1())
    _publish(jwks_file, {**{f"k-{a}": k for a, k in KEYS.items()}, "k-ES256": replacement})
    assert await identity.jwks.refresh()
    await refused(identity, old, "invalid token signature")
    assert (await auth(identity, kept)).user_id == "alice"
    signed = _provider_token("carol", replacement, "ES256", "k-ES256")
    assert (await auth(identity, signed)).user_id == "carol"


def test_malformed_jwks_members_are_left_out_one_by_one() -> None:
    good = public_jwk(KEYS["RS256"], "good")
    members: list[Any] = [
        {**public_jwk(KEYS["ES256"], "x"), "alg": ["ES256"]},  # unhashable: PyJWT's TypeError
        {**public_jwk(KEYS["ES256"], "y"), "alg": {"ES256": True}},
        {**public_jwk(KEYS["EdDSA"], "z"), "kid": ["z"]},
        {**public_jwk(KEYS["EdDSA"], "w"), "use": ["sig"]},
        {"kty": "RSA", "n": 5, "e": "AQAB", "kid": "n"},
        {"kty": ["RSA"], "kid": "t"},
        "not an object",
        good,
    ]
    assert list(parse_jwks(json.dumps({"keys": members}).encode())) == ["good"]
    documents = [b"[]", b"{", b'{"keys": {}}', b'{"keys": []}', b'{"keys": [[]]}']
    documents.append(json.dumps({"keys": members[:-1]}).encode())
    for document in documents:
        with pytest.raises(ValueError):
            parse_jwks(document)


def test_an_hs256_key_is_prepared_once_and_others_still_checked() -> None:
    key = _hmac_key(SECRET)
    algorithm = key.Algorithm
    assert algorithm.prepare_key(key.key) is algorithm.prepare_key(key.key)
    # any other key goes through PyJWT's own checks: a public key is no HMAC secret
    pem = (
        KEYS["RS256"]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(jwt.InvalidKeyError):
        algorithm.prepare_key(pem)
    token = hs256("a", SECRET)
    assert jwt.decode(token, key, algorithms=["HS256"])["sub"] == "a"
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(hs256("a", OLD_SECRET), key, algorithms=["HS256"])


def _segment_outcome(decode: Any, segment: bytes) -> bytes | str:
    try:
        decoded: bytes = decode(segment, "payload")
    except jwt.DecodeError as exc:
        return f"DecodeError: {exc}"
    return decoded


#: base64url's alphabet (letters whose low bits make a last character non-canonical among
#: them), its padding, and what it must refuse: standard base64's own two characters, a
#: dot, a space, a non-ASCII byte
_SEGMENT_BYTES = st.lists(st.sampled_from(list(b"ABQRgwz_-09=+/. \xff")), max_size=12).map(bytes)


@settings(max_examples=1_000)
@given(segment=_SEGMENT_BYTES | st.binary(max_size=24).map(lambda raw: b64(raw).encode()))
def test_segments_are_checked_as_pyjwt_checks_them(segment: bytes) -> None:
    assert _segment_outcome(_RegexSegments._decode_base64url_segment, segment) == (
        _segment_outcome(PyJWS._decode_base64url_segment, segment)
    )


def test_segments_pyjwt_refuses_are_refused() -> None:
    for bad in (b"!!!!", b"QQ===", b"Q", b"QQ=", b"QR", b"Q Q", b"QQ+/"):
        with pytest.raises(jwt.DecodeError):
            _RegexSegments._decode_base64url_segment(bad, "payload")
    assert _RegexSegments._decode_base64url_segment(b"QQ", "payload") == b"A"
    assert _RegexSegments._decode_base64url_segment(b"QQ==", "payload") == b"A"
