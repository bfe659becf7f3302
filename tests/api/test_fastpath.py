"""The grab fast path answers exactly as the routed endpoint, and leaves other requests alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from hongbao.api.fastpath import _grab_target
from tests.api.conftest import BASE, bearer
from tests.api.test_api import deposit, send


@pytest.fixture
async def routed(app: Starlette) -> Any:
    """A client of the router alone: no middleware, so grabs take the Starlette route."""
    transport = httpx.ASGITransport(app=app.router)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
        yield c


def _same(fast: httpx.Response, slow: httpx.Response) -> None:
    assert fast.status_code == slow.status_code
    assert fast.headers.multi_items() == slow.headers.multi_items()  # all, in order
    assert fast.json() == slow.json()


async def grabs_answer_alike(
    client: httpx.AsyncClient,
    other: httpx.AsyncClient,
    same: Callable[[httpx.Response, httpx.Response], None],
) -> None:
    """The same grabs sent through `client` and `other`, each pair checked by `same`:
    a repeat, refusals, and exhaustion (the packet's last share taken through `other`)."""
    await deposit(client, "alice", 1_000)
    packet = await send(client, "alice", total_amount=300, count=2)
    grab = f"/v1/packets/{packet['id']}/grab"

    first = await client.post(grab, headers=bearer("u1"))
    assert first.status_code == 200 and first.json()["first"] is True
    # the same user again, through each path: the same share, first = false
    u1, u2, u3 = bearer("u1"), bearer("u2"), bearer("u3")
    same(await client.post(grab, headers=u1), await other.post(grab, headers=u1))
    # refusals: no token, a forged one, an unknown packet, a malformed id
    same(await client.post(grab), await other.post(grab))
    forged = {"Authorization": "Bearer v1.e30.AAAA"}
    same(await client.post(grab, headers=forged), await other.post(grab, headers=forged))
    for pid in ("0" * 26, "not-an-id"):
        path = f"/v1/packets/{pid}/grab"
        same(await client.post(path, headers=u2), await other.post(path, headers=u2))
    # the last share through `other`, then exhaustion through both
    assert (await other.post(grab, headers=u2)).status_code == 200
    same(await client.post(grab, headers=u3), await other.post(grab, headers=u3))


async def test_fast_and_routed_grabs_answer_alike(
    client: httpx.AsyncClient, routed: httpx.AsyncClient
) -> None:
    await grabs_answer_alike(client, routed, _same)


async def test_other_requests_on_grab_like_paths_reach_the_router(
    client: httpx.AsyncClient,
) -> None:
    packet_path = "/v1/packets/" + "0" * 26
    r = await client.get(packet_path + "/grab", headers=bearer("u1"))
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    for path in ("/v1/packets//grab", f"{packet_path}/x/grab"):
        r = await client.post(path, headers=bearer("u1"))
        assert r.status_code == 404 and r.json()["code"] == "not_found"


@pytest.mark.parametrize(
    ("method", "path", "root_path", "target"),
    [
        ("POST", "/v1/packets/abc/grab", "", "abc"),
        ("GET", "/v1/packets/abc/grab", "", None),
        ("POST", "/v1/packets//grab", "", None),
        ("POST", "/v1/packets/a/b/grab", "", None),
        ("POST", "/v1/packets/abc/grab/", "", None),
        ("POST", "/v1/packets/abc/grab", "/api", None),  # mounted: the router strips it
    ],
)
def test_grab_target(method: str, path: str, root_path: str, target: str | None) -> None:
    scope = {"type": "http", "method": method, "path": path, "root_path": root_path}
    assert _grab_target(scope) == target
