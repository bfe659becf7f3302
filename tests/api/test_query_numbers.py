"""Whole-number query parameters: a value of many digits, leading zeros included, is a
422 naming the parameter (never a 500), and leading zeros before a number in range are
that number."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import ADMIN, bearer
from tests.api.test_api import deposit, problem
from tests.api.test_withdrawals import made

pytestmark = [pytest.mark.redis]

#: more digits than int() converts (4,300), every one of them a zero but the last
ZEROS = "0" * 5_000


async def test_thousands_of_leading_zeros_are_a_422_naming_the_parameter(
    client: httpx.AsyncClient,
) -> None:
    for value in (ZEROS + "1", ZEROS, ZEROS + "9" * 5_000):
        r = await client.get(f"/v1/wallets/alice/withdrawals?limit={value}", headers=ADMIN)
        problem(r, 422, "invalid_request", "limit")
        r = await client.get(f"/v1/withdrawals?older_than={value}", headers=ADMIN)
        problem(r, 422, "invalid_request", "older_than")


async def test_a_few_leading_zeros_read_as_the_number(client: httpx.AsyncClient) -> None:
    await deposit(client, "alice", 1000)
    for n in range(3):
        await made(client, "alice", 10 + n, f"w{n}")
    r = await client.get("/v1/wallets/alice/withdrawals?limit=002", headers=bearer("alice"))
    assert r.status_code == 200, r.text
    assert len(r.json()["items"]) == 2
    r = await client.get("/v1/withdrawals?older_than=0000", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert len(r.json()["items"]) == 3
