"""Identity over HTTP: JWTs from a host app's identity provider (a JWKS served by a real
local HTTP server), services acting for users, revocation. Tokens are minted with PyJWT
and `cryptography` directly."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from starlette.applications import Starlette

from hongbao.app import create_app
from hongbao.errors import AuthError
from hongbao.identity.config import IdentityConfig
from hongbao.identity.gate import Identity
from hongbao.identity.revocation import POLL_INTERVAL
from hongbao.keys import REVOKED_KEY, REVOKED_VERSION_KEY
from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import entries
from hongbao.settings import Settings
from hongbao.storage import RedisStore
from tests.api.conftest import SECRET, eventually
from tests.api.test_api import problem
from tests.tokens import ADMIN, hs256, mint, public_jwk

ISSUER = "https://id.example/"
AUDIENCE = "hongbao"
sqlite_only = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)


class JwksServer:
    """An identity provider's JWKS endpoint on a free loopback port, in a thread."""

    def __init__(self) -> None:
        self.document = b'{"keys": []}'
        self.fetches = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.fetches += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(server.document)))
                self.end_headers()
                self.wfile.write(server.document)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def publish(self, keys: dict[str, Any]) -> None:
        self.document = json.dumps(
            {"keys": [public_jwk(k, kid) for kid, k in keys.items()]}
        ).encode()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Provider:
    """The host app's identity provider: signing keys by kid, published by a JwksServer."""

    def __init__(self, server: JwksServer) -> None:
        self.server = server
        self.keys: dict[str, Any] = {
            "rsa-1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "ec-1": ec.generate_private_key(ec.SECP256R1()),
            "ed-1": ed25519.Ed25519PrivateKey.generate(),
        }
        server.publish(self.keys)

    def token(self, user: str, kid: str = "rsa-1", **claims: Any) -> str:
        alg = {"rsa": "RS256", "ec": "ES256", "ed": "EdDSA"}[kid.split("-")[0]]
        claims = {"iss": ISSUER, "aud": AUDIENCE, **claims}
        return mint(user, self.keys[kid], algorithm=alg, kid=kid, **claims)


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    server = JwksServer()
    try:
        yield server
    finally:
        with contextlib.suppress(OSError):
            server.stop()


@pytest.fixture
def provider(jwks_server: JwksServer) -> Provider:
    return Provider(jwks_server)


@pytest.fixture
def identity_config(jwks_server: JwksServer, provider: Provider) -> IdentityConfig:
    return IdentityConfig(SECRET, jwks_url=jwks_server.url, issuer=ISSUER, audience=AUDIENCE)


@pytest.fixture
async def app(
    settings: Settings, store: RedisStore, ledger: SqlLedger, identity_config: IdentityConfig
) -> AsyncIterator[Starlette]:
    application = create_app(settings, identity_config, run_workers=True)
    async with application.router.lifespan_context(application):
        yield application


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def auth(token: str, on_behalf_of: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if on_behalf_of is not None:
        headers["X-On-Behalf-Of"] = on_behalf_of
    return headers


ADMIN_TOKEN = hs256("root", SECRET, admin=True)


# -- tokens from the identity provider ------------------------------------------------------


@sqlite_only
@pytest.mark.parametrize("kid", ["rsa-1", "ec-1", "ed-1"])
async def test_the_providers_tokens_are_accepted(
    client: httpx.AsyncClient, provider: Provider, kid: str
) -> None:
    r = await client.get("/v1/wallets/alice", headers=auth(provider.token("alice", kid)))
    assert r.status_code == 200, r.text
    r = await client.get("/v1/wallets/bob", headers=auth(provider.token("alice", kid)))
    problem(r, 403, "forbidden")
    admin = provider.token("ops", kid, roles=[ADMIN])
    assert (await client.get("/v1/wallets/bob", headers=auth(admin))).status_code == 200
    assert (await client.get("/admin/stats", headers=auth(admin))).status_code == 200


@sqlite_only
async def test_refusals_are_401_problems_that_say_why(
    client: httpx.AsyncClient, provider: Provider
) -> None:
    now = int(time.time())
    public_pem = (
        provider.keys["rsa-1"]
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    body = b64(json.dumps({"sub": "root", "exp": now + 60, "roles": [ADMIN]}).encode())

    def hs256_with_public_key(header: dict[str, str]) -> str:
        head = b64(json.dumps({"typ": "JWT", **header}).encode())
        mac = hmac.new(public_pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}.{b64(mac)}"

    none_head = b64(json.dumps({"alg": "none"}).encode())
    good = provider.token("mallory")
    h, p, s = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))
    tampered = f"{h}.{b64(json.dumps({**claims, 'roles': [ADMIN]}).encode())}.{s}"
    cases = {
        "wrong issuer (iss)": provider.token("a", iss="https://other.example/"),
        "wrong audience (aud)": provider.token("a", aud="not-hongbao"),
        "token expired": provider.token("a", now=now - 7200),
        "token not yet valid": provider.token("a", nbf=now + 3600),
        "unknown signing key": mint("a", provider.keys["rsa-1"], algorithm="RS256", kid="rsa-9"),
        "algorithm 'none' is not accepted": f"{none_head}.{body}.",
        "the token names an unknown signing key": hs256_with_public_key(
            {"alg": "HS256", "kid": "rsa-1"}
        ),
        "invalid token signature ": hs256_with_public_key({"alg": "HS256"}),
        "invalid token signature": tampered,
        "JWTs now": "v1.eyJzdWIiOiJhIn0.c2ln",
    }
    for why, token in cases.items():
        r = await client.get("/v1/wallets/a", headers=auth(token))
        body_ = problem(r, 401, "unauthorized")
        assert why.strip() in body_["detail"], (why, body_)
        assert r.headers["www-authenticate"].startswith("Bearer")


@sqlite_only
async def test_jwks_rotation_and_provider_outage(
    client: httpx.AsyncClient, provider: Provider, jwks_server: JwksServer
) -> None:
    old = provider.token("alice", "rsa-1")
    assert (await client.get("/v1/wallets/alice", headers=auth(old))).status_code == 200
    fetched = jwks_server.fetches
    # the provider rotates: a new key signs, the old one is still published
    provider.keys["rsa-2"] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks_server.publish(provider.keys)
    new = provider.token("alice", "rsa-2")
    assert (await client.get("/v1/wallets/alice", headers=auth(new))).status_code == 200
    assert jwks_server.fetches == fetched + 1  # the unknown kid fetched the set once
    assert (await client.get("/v1/wallets/alice", headers=auth(old))).status_code == 200
    # made-up kids do not make hongbao hammer the provider (one fetch a minute at most)
    for n in range(5):
        made_up = mint("a", provider.keys["rsa-1"], algorithm="RS256", kid=f"made-up-{n}")
        assert (await client.get("/v1/wallets/a", headers=auth(made_up))).status_code == 401
    assert jwks_server.fetches == fetched + 1
    # the provider goes down: fresh tokens under both keys still verify from the cache
    jwks_server.stop()
    for kid in ("rsa-1", "rsa-2", "ec-1"):
        fresh = provider.token("bob", kid, jti=kid)
        assert (await client.get("/v1/wallets/bob", headers=auth(fresh))).status_code == 200
    assert (
        await client.get("/v1/wallets/bob", headers=auth(hs256("bob", SECRET)))
    ).status_code == 200


# -- services acting for users --------------------------------------------------------------


@sqlite_only
async def test_on_behalf_of_only_for_service_tokens(client: httpx.AsyncClient) -> None:
    for token in (hs256("alice", SECRET), ADMIN_TOKEN):
        for method, path in (("GET", "/v1/wallets/bob"), ("POST", "/v1/packets/x/grab")):
            r = await client.request(method, path, headers=auth(token, "bob"))
            body = problem(r, 403, "forbidden")
            assert "X-On-Behalf-Of" in body["detail"]
    service = hs256("shop", SECRET, service=True)
    problem(
        await client.get("/v1/wallets/bob", headers=auth(service, "not valid")),
        422,
        "invalid_request",
        "X-On-Behalf-Of",
    )
    r = await client.get("/v1/wallets/bob", headers=auth(service, "bob"))
    assert r.status_code == 200 and r.json()["user_id"] == "bob"
    # acting for bob gives bob's rights only: no deposits, no other wallets
    r = await client.post(
        "/v1/wallets/bob/deposits", json={"amount": 5}, headers=auth(service, "bob")
    )
    problem(r, 403, "forbidden")
    problem(await client.get("/v1/wallets/carol", headers=auth(service, "bob")), 403, "forbidden")


async def test_the_ledger_records_who_acted(
    client: httpx.AsyncClient, ledger: SqlLedger, store: RedisStore
) -> None:
    """A deposit by an admin, a send and a grab by a service (the grab settled by the
    persister): each ledger entry names its actor; users acting alone leave it empty."""
    service = hs256("shop-backend", SECRET, service=True)
    r = await client.post(
        "/v1/wallets/alice/deposits", json={"amount": 1000}, headers=auth(ADMIN_TOKEN)
    )
    assert r.status_code == 201, r.text
    body = {"total_amount": 300, "count": 3, "mode": "equal"}
    r = await client.post("/v1/packets", json=body, headers=auth(service, "alice"))
    assert r.status_code == 201, r.text
    assert r.json()["sender_id"] == "alice"
    pid = r.json()["id"]
    r = await client.post(f"/v1/packets/{pid}/grab", headers=auth(service, "bob"))
    assert r.status_code == 200 and r.json()["user_id"] == "bob", r.text
    r = await client.post(f"/v1/packets/{pid}/grab", headers=auth(hs256("carol", SECRET)))
    assert r.status_code == 200 and r.json()["user_id"] == "carol", r.text

    async def rows() -> list[tuple[str, str, str | None]]:
        async with ledger.engine.connect() as conn:
            result = await conn.execute(
                sa.select(entries.c.kind, entries.c.user_id, entries.c.actor).order_by(entries.c.id)
            )
            return [tuple(row) for row in result]  # type: ignore[misc]

    expected = [
        ("deposit", "alice", "root"),
        ("send", "alice", "shop-backend"),
        ("claim", "bob", "shop-backend"),
        ("claim", "carol", None),
    ]

    async def settled() -> list[tuple[str, str, str | None]]:
        got = await rows()
        return sorted(got, key=lambda r: (r[0] != "deposit", r[0] != "send", r[1]))

    assert await eventually(settled, expected) == expected


# -- revocation -----------------------------------------------------------------------------


@sqlite_only
async def test_revoked_tokens_are_refused_everywhere(
    client: httpx.AsyncClient,
    store: RedisStore,
    identity_config: IdentityConfig,
    provider: Provider,
    caplog: pytest.LogCaptureFixture,
) -> None:
    alice = hs256("alice", SECRET)
    from_provider = provider.token("alice", "ec-1")
    no_iat = jwt.encode({"sub": "alice", "exp": int(time.time()) + 600}, SECRET, algorithm="HS256")
    for token in (alice, from_provider, no_iat):
        assert (await client.get("/v1/wallets/alice", headers=auth(token))).status_code == 200
    # another API process, with its own copy of the revocations
    other = Identity(identity_config)
    await other.start(store)
    try:
        assert (await other.authenticate(f"Bearer {alice}")).user_id == "alice"
        problem(
            await client.post(
                "/v1/admin/users/alice/revoke-tokens", headers=auth(hs256("alice", SECRET))
            ),
            403,
            "forbidden",
        )
        r = await client.post("/v1/admin/users/alice/revoke-tokens", headers=auth(ADMIN_TOKEN))
        assert r.status_code == 200 and r.json()["user_id"] == "alice", r.text
        for token in (alice, from_provider, no_iat):  # at once in the revoking process
            body = problem(
                await client.get("/v1/wallets/alice", headers=auth(token)), 401, "unauthorized"
            )
            assert "revoked" in body["detail"]

        # within a poll or two in the other process
        async def refused() -> bool:
            try:
                await other.authenticate(f"Bearer {alice}")
            except Exception:
                return True
            return False

        assert await eventually(refused, True, within=5)
        # a token issued after the revocation works; other users are untouched
        fresh = hs256("alice", SECRET, now=time.time() + 1)
        assert (await client.get("/v1/wallets/alice", headers=auth(fresh))).status_code == 200
        bob = hs256("bob", SECRET)
        assert (await client.get("/v1/wallets/bob", headers=auth(bob))).status_code == 200
        # a process started later (a restart) reads the revocations from Redis
        restarted = Identity(identity_config)
        await restarted.start(store)
        with pytest.raises(Exception, match="revoked"):
            await restarted.authenticate(f"Bearer {alice}")
        await restarted.aclose()
        # Redis loses them: nothing revoked any more, and a warning says so
        await store.client.delete(REVOKED_KEY, REVOKED_VERSION_KEY)
        with caplog.at_level(logging.WARNING, logger="hongbao.identity"):
            assert await eventually(refused, False, within=5) is False
        assert any("gone from Redis" in r.getMessage() for r in caplog.records)
    finally:
        await other.aclose()


@sqlite_only
async def test_grabs_check_revocations_without_a_redis_call(
    client: httpx.AsyncClient, app: Starlette
) -> None:
    identity: Identity = app.state.api.identity
    token = hs256("gus", SECRET)
    await identity.authenticate(f"Bearer {token}")
    identity.revocations.revoked = {"gus": int(time.time())}  # the local copy decides
    with pytest.raises(Exception, match="revoked"):
        await identity.authenticate(f"Bearer {token}")
    r = await client.post("/v1/packets/01zzzzzzzzzzzzzzzzzzzzzzzz/grab", headers=auth(token))
    problem(r, 401, "unauthorized")
    await asyncio.sleep(0)


async def test_the_poller_outlives_a_bad_jwks_and_still_brings_revocations(
    store: RedisStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A JWKS document that fails to parse in a way the fetch did not foresee (a member
    whose alg is a list: PyJWT raises TypeError) costs one fetch, not the poller: the
    revocations of other processes still arrive."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "jwks.json"
    good = json.dumps({"keys": [public_jwk(key, "k1")]})
    path.write_text(good)
    identity = Identity(IdentityConfig(SECRET, jwks_url=path.as_uri()))
    await identity.start(store)
    try:
        assert identity.jwks is not None and identity._poller is not None
        identity.jwks.max_age = identity.jwks.min_refresh = 0.0  # a fetch every turn
        path.write_text(json.dumps({"keys": [{**public_jwk(key, "k1"), "alg": ["RS256"]}]}))
        with caplog.at_level(logging.WARNING, logger="hongbao.identity"):
            await asyncio.sleep(3 * POLL_INTERVAL)
        assert any("could not be fetched" in r.getMessage() for r in caplog.records)
        assert not identity._poller.done()
        path.write_text(good)
        token = hs256("alice", SECRET)
        assert (await identity.authenticate(f"Bearer {token}")).user_id == "alice"
        # another process revokes alice's tokens: this one hears of it by its poller
        await store.revoke_tokens("alice", int(time.time()))

        async def refused() -> bool:
            try:
                await identity.authenticate(f"Bearer {token}")
            except AuthError:
                return True
            return False

        assert await eventually(refused, True, within=5)
        assert not identity._poller.done()
    finally:
        await identity.aclose()
