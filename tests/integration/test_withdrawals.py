"""Withdrawals racing sends on one wallet, on each database; and `hongbao audit` clean with
withdrawals in every state while `serve` runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from hongbao.audit import audit
from hongbao.domain.withdrawals import Withdrawal, WithdrawalStatus
from hongbao.errors import InsufficientBalance, WithdrawalAlreadyCompleted
from hongbao.service import Hongbao
from tests.api.serving import CLIENT_LIMITS, Serve, run_cli

pytestmark = [pytest.mark.redis, pytest.mark.integration]


async def test_withdrawals_racing_sends_never_overdraw(service: Hongbao) -> None:
    await service.deposit("alice", 10_000)
    withdrawals = [
        service.withdrawals.request("alice", 100, f"w{i}", actor="payments") for i in range(200)
    ]
    sends = [service.send("alice", 100, 1, idempotency_key=f"s{i}") for i in range(50)]
    got = await asyncio.gather(*withdrawals, *sends, return_exceptions=True)
    refused = [g for g in got if isinstance(g, BaseException)]
    assert all(isinstance(e, InsufficientBalance) for e in refused), refused[:3]
    assert len(got) - len(refused) == 100  # 10,000 fen in 100-fen steps, and not one more
    assert (await service.wallet("alice")).balance == 0
    made = [g[0] for g in got[:200] if isinstance(g, tuple)]
    assert len({w.id for w in made}) == len(made)
    assert (await audit(service, settle=0)).violations == []

    # retries of the ones that went through debit nothing more, even on an empty wallet
    again = await asyncio.gather(
        *(service.withdrawals.request("alice", 100, f"w{i}") for i in range(200)),
        return_exceptions=True,
    )
    assert sorted(g[0].id for g in again if isinstance(g, tuple)) == sorted(w.id for w in made)

    # each is reported twice at once: half fail (money back, once), half complete
    async def settle(w: Withdrawal, n: int) -> None:
        if n % 2:
            await asyncio.gather(service.withdrawals.fail(w.id), service.withdrawals.fail(w.id))
        else:
            await asyncio.gather(
                service.withdrawals.complete(w.id), service.withdrawals.complete(w.id)
            )

    await asyncio.gather(*(settle(w, n) for n, w in enumerate(made)))
    failed = sum(n % 2 for n in range(len(made)))
    assert (await service.wallet("alice")).balance == 100 * failed
    page = await service.withdrawals.of_user("alice", status=WithdrawalStatus.FAILED, limit=500)
    assert len(page.items) == failed
    with pytest.raises(WithdrawalAlreadyCompleted):
        await service.withdrawals.fail(made[0].id)
    assert (await audit(service, settle=0)).violations == []


def test_hongbao_audit_is_clean_with_withdrawals_in_every_state(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Serve(data) as srv:
        admin, alice = (*srv.tokens("admin", admin=True), *srv.tokens("alice"))
        minted = run_cli("token", "payments", "--service", "--data-dir", str(data), env=srv.env)
        as_admin = {"Authorization": f"Bearer {admin}"}
        as_payments = {"Authorization": f"Bearer {minted.stdout.strip()}"}
        with httpx.Client(base_url=srv.url, limits=CLIENT_LIMITS, timeout=10) as http:
            r = http.post("/v1/wallets/alice/deposits", json={"amount": 1000}, headers=as_admin)
            assert r.status_code == 201, r.text
            ids = []
            for n, amount in enumerate((100, 200, 300)):
                r = http.post(
                    "/v1/wallets/alice/withdrawals",
                    json={"amount": amount},
                    headers={"Authorization": f"Bearer {alice}", "Idempotency-Key": f"w{n}"},
                )
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            # the payment system reports with its service token
            r = http.post(f"/v1/withdrawals/{ids[1]}/complete", headers=as_payments)
            assert r.status_code == 200, r.text
            r = http.post(
                f"/v1/withdrawals/{ids[2]}/fail", json={"note": "bounced"}, headers=as_payments
            )
            assert r.status_code == 200, r.text
            r = http.get("/v1/wallets/alice", headers=as_admin)
            assert r.json()["balance"] == 1000 - 100 - 200
        clean = run_cli("audit", "--data-dir", str(data))
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "audit: clean" in clean.stdout
