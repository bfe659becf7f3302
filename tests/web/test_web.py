"""The web page in a real browser: Playwright driving Debian's Chromium (headless).

`hongbao serve --demo` runs as a subprocess (the embedded default, demo sign-in on).
No browser is downloaded: Chromium comes from the system (``apt-get install chromium``,
done by scripts/test); HONGBAO_TEST_CHROMIUM overrides its path. Outside CI a missing
Chromium or Playwright skips these tests; with CI=true it fails them.

Screenshots of the main screens go to test-artifacts/web/.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.serving import Serve
from tests.conftest import need

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("HONGBAO_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web"
PHONE: dict[str, Any] = {
    "viewport": {"width": 375, "height": 760},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
}
TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        need("the playwright package (pip install playwright)", exc)
    if not Path(CHROMIUM).exists():
        need(f"Chromium at {CHROMIUM} (apt-get install chromium)", FileNotFoundError(CHROMIUM))
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    with Serve(tmp_path_factory.mktemp("web") / "data", None, "--demo") as s:
        yield s


@pytest.fixture
def contexts(browser: Any) -> Iterator[list[Any]]:
    """Browser contexts made by a test (one per person), closed after it."""
    made: list[Any] = []
    yield made
    for context in made:
        context.close()


def phone(browser: Any, contexts: list[Any], locale: str = "zh-CN") -> Any:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.new_context(locale=locale, **PHONE)
    context.set_default_timeout(TIMEOUT_MS)
    contexts.append(context)
    return context.new_page()


def shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def no_horizontal_scroll(page: Any) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375, f"page is {width}px wide at a 375px viewport"


def sign_in(page: Any, name: str) -> None:
    page.get_by_test_id("name").fill(name)
    page.get_by_test_id("signin").click()
    page.get_by_test_id("who").filter(has_text=name).wait_for()


def claim_rows(page: Any) -> Any:
    return page.locator("[data-testid=claims] li[data-user]")


def send_packet(page: Any, amount: str, count: int, greeting: str, mode: str = "lucky") -> str:
    page.get_by_test_id("amount").fill(amount)
    page.get_by_test_id("count").fill(str(count))
    page.get_by_test_id(f"mode-{mode}").check()
    page.get_by_test_id("greeting").fill(greeting)
    page.get_by_test_id("send").click()
    page.wait_for_url(re.compile(r"/p/[0-9a-z]+$"))
    from playwright.sync_api import expect

    share = page.get_by_test_id("share-link")
    expect(share).to_have_value(re.compile(r"/p/[0-9a-z]+$"))
    link: str = share.input_value()
    return link


def test_send_three_grab_live_fourth_is_too_late(
    browser: Any, server: Serve, contexts: list[Any]
) -> None:
    from playwright.sync_api import expect

    alice = phone(browser, contexts)
    alice.goto(server.url + "/")
    expect(alice.get_by_test_id("name")).to_be_visible()
    shot(alice, "01-sign-in")
    no_horizontal_scroll(alice)
    sign_in(alice, "alice")
    expect(alice.get_by_test_id("balance")).to_have_text("¥100.00")
    alice.get_by_test_id("amount").fill("10.00")
    alice.get_by_test_id("greeting").fill("新年快乐，大吉大利！")
    shot(alice, "02-wallet-and-send")
    no_horizontal_scroll(alice)
    link = send_packet(alice, "10.00", 3, "新年快乐，大吉大利！")
    packet_id = link.rsplit("/", 1)[1]
    assert link == f"{server.url}/p/{packet_id}"
    expect(alice.get_by_test_id("summary")).to_contain_text("0/3")
    expect(alice.get_by_test_id("summary")).to_contain_text("¥0.00/¥10.00")
    expect(alice.get_by_test_id("live")).to_have_text("实时更新中")
    shot(alice, "03-sender-packet")

    got: dict[str, int] = {}
    grabbers = [("bob", "zh-CN"), ("carol", "en-US"), ("dave", "zh-CN")]
    pages = {}
    for i, (name, locale) in enumerate(grabbers, start=1):
        page = phone(browser, contexts, locale)
        pages[name] = page
        page.goto(link)
        sign_in(page, name)
        expect(page.get_by_test_id("packet-greeting")).to_have_text("新年快乐，大吉大利！")
        if i == 1:
            shot(page, "04-packet-closed")
        page.get_by_test_id("open").click()
        mine = page.get_by_test_id("my-amount")
        expect(mine).to_have_text(re.compile(r"^¥\d+\.\d\d$"))
        fen = int(mine.get_attribute("data-fen"))
        assert mine.inner_text() == f"¥{fen // 100}.{fen % 100:02d}"
        got[name] = fen
        # the sender's page, open all along, sees each claim arrive without a reload
        expect(claim_rows(alice)).to_have_count(i)
        expect(alice.locator(f"[data-testid=claims] li[data-user=demo-{name}]")).to_have_attribute(
            "data-fen", str(fen)
        )
        no_horizontal_scroll(page)

    assert sum(got.values()) == 1000
    assert all(fen >= 1 for fen in got.values())
    best = max(got, key=lambda n: got[n])
    expect(alice.get_by_test_id("summary")).to_contain_text("3/3")
    expect(alice.get_by_test_id("summary")).to_contain_text("¥10.00/¥10.00")
    expect(alice.get_by_test_id("best-luck")).to_have_count(1)
    expect(alice.locator("li.best")).to_have_attribute("data-user", f"demo-{best}")
    expect(alice.get_by_test_id("outcome")).to_have_text("红包已被领完")
    shot(alice, "05-sender-live-claims")
    for name, page in pages.items():  # every page shows the same, right amounts
        expect(page.get_by_test_id("my-amount")).to_have_attribute("data-fen", str(got[name]))
        expect(claim_rows(page)).to_have_count(3)
        for other, fen in got.items():
            row = page.locator(f"[data-testid=claims] li[data-user=demo-{other}]")
            expect(row).to_have_attribute("data-fen", str(fen))
            expect(row.locator(".claim-amount")).to_have_text(f"¥{fen // 100}.{fen % 100:02d}")
        expect(page.get_by_test_id("best-luck")).to_have_count(1)
    expect(pages["carol"].get_by_test_id("best-luck")).to_have_text("👑 Best luck")
    shot(pages["bob"], "06-opened-with-claims")

    # a fourth person: the packet is finished, so no button, and the reason in words
    erin = phone(browser, contexts, "en-US")
    erin.goto(link)
    sign_in(erin, "erin")
    expect(erin.get_by_test_id("outcome")).to_have_text("Too slow: every share has been taken.")
    expect(erin.get_by_test_id("open")).to_be_hidden()
    expect(erin.get_by_test_id("my-amount")).to_be_hidden()
    expect(claim_rows(erin)).to_have_count(3)
    (erin_token,) = server.tokens("erin")
    late = httpx.post(
        f"{server.url}/v1/packets/{packet_id}/grab",
        headers={"Authorization": f"Bearer {erin_token}"},
    )
    assert late.status_code == 410
    no_horizontal_scroll(erin)
    shot(erin, "07-too-late")
    erin.get_by_test_id("lang").click()  # and in Chinese
    expect(erin.get_by_test_id("outcome")).to_have_text("手慢了，红包派完了。")
    assert "{" not in erin.locator("main").inner_text()  # no raw JSON anywhere

    # the wallets: the sender paid 10 yuan, each grabber got their share (once persisted)
    alice.goto(server.url + "/")
    expect(alice.get_by_test_id("balance")).to_have_text("¥90.00")
    bob = pages["bob"]
    bob.goto(server.url + "/")
    fen = 10_000 + got["bob"]
    expect(bob.get_by_test_id("balance")).to_have_text(f"¥{fen // 100}.{fen % 100:02d}")


def test_errors_are_words_not_json(browser: Any, server: Serve, contexts: list[Any]) -> None:
    from playwright.sync_api import expect

    frank = phone(browser, contexts, "en-US")
    frank.goto(server.url + "/")
    # a name the demo sign-in does not take is refused on the page, as the server would
    name = frank.get_by_test_id("name")
    name.fill("a:b")
    assert not name.evaluate("e => e.checkValidity()")
    name.fill("x" * 33)
    assert name.input_value() == "x" * 32  # the field takes no more
    sign_in(frank, "frank")
    error = frank.get_by_test_id("error")
    # amounts are parsed as digits: no floats, at most two decimals
    frank.get_by_test_id("amount").fill("1.234")
    frank.get_by_test_id("send").click()
    expect(error).to_have_text(re.compile(r"^Enter an amount like 8\.88"))
    # more than the wallet holds: the server's 409, in words
    frank.get_by_test_id("amount").fill("100.01")
    frank.get_by_test_id("send").click()
    expect(error).to_have_text("Not enough money in your wallet for that.")
    frank.get_by_test_id("lang").click()
    frank.get_by_test_id("send").click()
    expect(error).to_have_text("零钱不足，发不了这么多。")
    shot(frank, "08-error-no-money")
    frank.get_by_test_id("lang").click()
    # an exact amount: 0.07 yuan is 7 fen, equal shares
    link = send_packet(frank, "0.07", 7, "seven", mode="equal")
    expect(frank.get_by_test_id("summary")).to_contain_text("¥0.00 of ¥0.07")

    # too many requests (429) is shown in words too
    gina = phone(browser, contexts, "en-US")
    gina.route(
        "**/grab",
        lambda route: route.fulfill(
            status=429,
            content_type="application/problem+json",
            headers={"Retry-After": "1"},
            body=json.dumps({"status": 429, "code": "too_many_requests", "title": "x"}),
        ),
    )
    gina.goto(link)
    sign_in(gina, "gina")
    gina.get_by_test_id("open").click()
    expect(gina.get_by_test_id("outcome")).to_have_text(
        "Too many requests; please wait a moment and try again."
    )
    # an unknown packet
    gina.goto(server.url + "/p/01zzzzzzzzzzzzzzzzzzzzzzzz")
    expect(gina.get_by_test_id("outcome")).to_have_text(
        "There is no such red packet; check the link."
    )
    # a token the server refuses (forged, expired): back to sign-in, with the reason
    (token,) = server.tokens("gina")
    forged = token[:-1] + ("A" if token[-1] != "A" else "B")
    gina.evaluate(
        "t => localStorage.setItem('hongbao.auth', JSON.stringify({token: t, user: 'gina'}))",
        forged,
    )
    gina.goto(server.url + "/")
    expect(gina.get_by_test_id("error")).to_have_text(
        "Your sign-in is no longer valid; please sign in again."
    )
    expect(gina.get_by_test_id("name")).to_be_visible()


def test_yuan_to_fen_is_exact(browser: Any, server: Serve, contexts: list[Any]) -> None:
    """The page converts typed yuan to fen by digits: 19.99 is 1999, not 1998.9999..."""
    page = phone(browser, contexts, "en-US")
    page.goto(server.url + "/")
    cases = {
        "19.99": 1999,
        "0.1": 10,
        "0.07": 7,
        "1.": 100,
        "007.50": 750,
        " ¥8.88 ": 888,
        "1234567.89": 123456789,
        "90071992547409.91": None,  # beyond exact integers: refused, not rounded
        "1.234": None,
        "-1": None,
        "1e3": None,
        "1,5": None,
        "": None,
        ".5": None,
    }
    parsed = page.evaluate("cases => cases.map(c => window.hongbaoMoney.parseYuan(c))", list(cases))
    assert dict(zip(cases, parsed, strict=True)) == cases
    shown = page.evaluate("[0, 7, 10, 1999, 123456789].map(f => window.hongbaoMoney.yuan(f))")
    assert shown == ["¥0.00", "¥0.07", "¥0.10", "¥19.99", "¥1234567.89"]


def test_polling_fallback_without_event_stream(
    browser: Any, server: Serve, contexts: list[Any]
) -> None:
    from playwright.sync_api import expect

    henry = phone(browser, contexts, "en-US")
    henry.route("**/events?*", lambda route: route.abort())
    henry.goto(server.url + "/")
    sign_in(henry, "henry")
    link = send_packet(henry, "2.00", 2, "poll")
    expect(henry.get_by_test_id("live")).to_have_text(
        "Live updates unavailable; refreshing every 2 s"
    )
    packet_id = link.rsplit("/", 1)[1]
    (token,) = server.tokens("ivan")
    r = httpx.post(
        f"{server.url}/v1/packets/{packet_id}/grab", headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 200, r.text
    expect(claim_rows(henry)).to_have_count(1)
    expect(henry.locator("[data-testid=claims] li[data-user=ivan]")).to_have_attribute(
        "data-fen", str(r.json()["amount"])
    )


def test_admin_dashboard(browser: Any, server: Serve, contexts: list[Any]) -> None:
    from playwright.sync_api import expect

    (user_token,) = server.tokens("judy")
    (admin_token,) = server.tokens("admin", admin=True)
    refused = httpx.get(
        f"{server.url}/admin/stats", headers={"Authorization": f"Bearer {user_token}"}
    )
    assert refused.status_code == 403
    stats = httpx.get(
        f"{server.url}/admin/stats", headers={"Authorization": f"Bearer {admin_token}"}
    ).json()
    assert stats["audit"]["ok"] is True
    assert stats["dead_letters"] == 0
    assert stats["live_packets"] >= 1

    page = phone(browser, contexts, "en-US")
    page.goto(server.url + "/admin")
    page.get_by_test_id("admin-token").fill(user_token)
    page.get_by_role("button", name="Use token").click()
    expect(page.get_by_test_id("error")).to_have_text("This token is not an admin token.")
    page.get_by_test_id("admin-token").fill(admin_token)
    page.get_by_role("button", name="Use token").click()
    expect(page.get_by_test_id("s-audit")).to_have_text("✔ OK")
    expect(page.get_by_test_id("s-backlog")).to_have_text(re.compile(r"^\d+$"))
    expect(page.get_by_test_id("s-dead")).to_have_text("0")
    expect(page.get_by_test_id("s-live")).to_have_text(re.compile(r"^[1-9]\d*$"))
    expect(page.get_by_test_id("s-rate")).to_have_text(re.compile(r"^\d+(\.\d+)?$"))
    no_horizontal_scroll(page)
    shot(page, "09-admin")


def test_event_stream_and_demo_endpoint(server: Serve) -> None:
    """The SSE endpoint takes ?ticket= (EventSource cannot set headers), a one-minute ticket
    for the packet; a token in the URL is refused with a note to use a ticket."""
    signed_in = httpx.post(f"{server.url}/demo/token", json={"name": "kate"})
    assert signed_in.status_code == 201, signed_in.text
    token = signed_in.json()["token"]
    sent = httpx.post(
        f"{server.url}/v1/packets",
        headers={"Authorization": f"Bearer {token}"},
        json={"total_amount": 10_000, "count": 1, "mode": "equal"},
    )
    assert sent.status_code == 201, sent.text
    packet_id = sent.json()["id"]
    url = f"{server.url}/v1/packets/{packet_id}/events"
    bearer = {"Authorization": f"Bearer {token}"}
    assert httpx.post(f"{url}/ticket").status_code == 401
    granted = httpx.post(f"{url}/ticket", headers=bearer)
    assert granted.status_code == 200, granted.text
    assert granted.json()["expires_in"] == 60
    ticket = granted.json()["ticket"]
    assert httpx.get(url).status_code == 401
    refused = httpx.get(url, params={"token": token})
    assert refused.status_code == 401 and "ticket" in refused.json()["detail"]
    assert httpx.get(url, params={"ticket": ticket + "x"}).status_code == 401
    missing = f"{server.url}/v1/packets/01zzzzzzzzzzzzzzzzzzzzzzzz/events"
    assert httpx.post(f"{missing}/ticket", headers=bearer).status_code == 404
    other = httpx.get(missing, params={"ticket": ticket})  # a ticket is for one packet
    assert other.status_code == 401 and "another packet" in other.json()["detail"]
    assert httpx.get(missing, headers=bearer).status_code == 404
    with httpx.stream("GET", url, params={"ticket": ticket}, timeout=10) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        started = time.monotonic()
        lines = stream.iter_lines()
        data, event = None, None
        for line in lines:
            if line.startswith("event: "):
                event = line[7:]
            if line.startswith("data: "):
                data = json.loads(line[6:])
                break
            assert time.monotonic() - started < 10
    assert data is not None
    # the event and its data are as /openapi.json says
    doc = httpx.get(f"{server.url}/openapi.json").json()
    events = doc["paths"]["/v1/packets/{packet_id}/events"]["get"]["responses"]["200"]
    schema = events["content"]["text/event-stream"]["schema"]
    _validate(doc, schema, {"event": event, "data": json.dumps(data)})
    _validate(doc, schema["properties"]["data"]["contentSchema"], data)
    sign_in = doc["paths"]["/demo/token"]["post"]["responses"]["201"]["content"]
    _validate(doc, sign_in["application/json"]["schema"], signed_in.json())
    assert data["packet"]["id"] == packet_id
    assert data["packet"]["remaining_count"] == 1
    assert data["claims"] == {
        "packet_id": packet_id,
        "claims": [],
        "best_luck": None,
        "claimed_count": 0,
        "claimed_amount": 0,
        "next_cursor": None,
    }
    # demo sign-in: a token, and 100 yuan once per name
    first = httpx.post(f"{server.url}/demo/token", json={"name": "leo"})
    again = httpx.post(f"{server.url}/demo/token", json={"name": "leo"})
    assert first.status_code == again.status_code == 201
    assert first.json()["balance"] == again.json()["balance"] == 10_000
    bad = httpx.post(f"{server.url}/demo/token", json={"name": "no spaces"})
    assert bad.status_code == 422
    assert bad.headers["content-type"] == "application/problem+json"


def test_demo_sign_in_only_in_demo_mode() -> None:
    """Without demo mode (a real deployment) POST /demo/token is not routed at all."""
    from hongbao.app import create_app
    from hongbao.settings import Settings

    settings = Settings(redis_url="redis://127.0.0.1:1/0", database_url="sqlite+aiosqlite://")
    secret = b"0123456789abcdef0123456789abcdef"
    paths = {
        getattr(r, "path", None) for r in create_app(settings, secret, run_workers=False).routes
    }
    assert "/demo/token" not in paths
    assert {"/", "/p/{packet_id}", "/admin", "/v1/packets/{packet_id}/events"} <= paths
    demo = create_app(settings, secret, run_workers=False, demo_mode=True)
    assert "/demo/token" in {getattr(r, "path", None) for r in demo.routes}


def _validate(doc: dict[str, Any], schema: dict[str, Any], value: Any) -> None:
    import jsonschema_rs

    root = {**schema, "components": doc["components"]}
    jsonschema_rs.Draft202012Validator(root, validate_formats=True).validate(value)


def test_an_expired_packet_says_its_money_went_back(
    browser: Any, server: Serve, contexts: list[Any]
) -> None:
    from playwright.sync_api import expect

    signed_in = httpx.post(f"{server.url}/demo/token", json={"name": "olga"})
    token = signed_in.json()["token"]
    sent = httpx.post(
        f"{server.url}/v1/packets",
        headers={"Authorization": f"Bearer {token}"},
        json={"total_amount": 300, "count": 3, "mode": "equal", "expires_in": 1},
    )
    assert sent.status_code == 201, sent.text
    page = phone(browser, contexts, "en-US")
    page.goto(f"{server.url}/p/{sent.json()['id']}")
    sign_in(page, "olga")
    outcome = page.get_by_test_id("outcome")
    expect(outcome).to_contain_text("¥3.00 returned to the sender", timeout=15_000)


def test_my_red_packets_received_and_sent_by_year(
    browser: Any, server: Serve, contexts: list[Any]
) -> None:
    from playwright.sync_api import expect

    tokens = {
        name: httpx.post(f"{server.url}/demo/token", json={"name": name}).json()["token"]
        for name in ("rita", "sam", "tom", "uma")
    }

    def auth(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {tokens[name]}"}

    packets = []
    for total, count, mode in ((600, 3, "lucky"), (900, 3, "lucky"), (200, 2, "equal")):
        r = httpx.post(
            f"{server.url}/v1/packets",
            headers=auth("rita"),
            json={"total_amount": total, "count": count, "mode": mode, "greeting": "新年好"},
        )
        assert r.status_code == 201, r.text
        packets.append(r.json()["id"])
    got: dict[str, dict[str, int]] = {"sam": {}, "tom": {}, "uma": {}}
    takers = (["sam", "tom", "uma"], ["sam", "tom", "uma"], ["sam", "tom"])
    for packet_id, grabbers in zip(packets, takers, strict=True):
        for name in grabbers:
            r = httpx.post(f"{server.url}/v1/packets/{packet_id}/grab", headers=auth(name))
            assert r.status_code == 200, r.text
            got[name][packet_id] = r.json()["amount"]
    lucky = [  # who got the best luck of each lucky packet (equal shares have none)
        httpx.get(f"{server.url}/v1/packets/{p}/claims", headers=auth("sam")).json()["best_luck"]
        for p in packets[:2]
    ]
    # the page of someone who got a best luck, so that its badge shows
    name = max(got, key=lambda n: lucky.count(f"demo-{n}"))
    best = lucky.count(f"demo-{name}")
    assert best >= 1

    def counted(user: str) -> int:
        r = httpx.get(f"{server.url}/v1/users/demo-{user}/received", headers=auth(user))
        return int(r.json()["totals"]["count"])

    deadline = time.monotonic() + 15
    while any(counted(n) < len(got[n]) for n in got) and time.monotonic() < deadline:
        time.sleep(0.1)  # the record shows a grab once the persister credited it

    page = phone(browser, contexts)
    page.goto(server.url + "/")
    sign_in(page, name)
    page.get_by_test_id("records-link").click()
    page.wait_for_url(re.compile(r"/me$"))
    fen = sum(got[name].values())
    expect(page.get_by_test_id("totals-amount")).to_have_attribute("data-fen", str(fen))
    expect(page.get_by_test_id("totals-amount")).to_have_text(f"¥{fen // 100}.{fen % 100:02d}")
    expect(page.get_by_test_id("totals-count")).to_have_text(f"收到红包 {len(got[name])} 个")
    expect(page.get_by_test_id("totals-extra")).to_have_text(f"手气最佳 {best} 次")
    rows = page.locator("[data-testid=history-list] li[data-packet]")
    expect(rows).to_have_count(len(got[name]))
    for packet_id, amount in got[name].items():
        row = page.locator(f"[data-testid=history-list] li[data-packet='{packet_id}']")
        expect(row).to_have_attribute("data-fen", str(amount))
        expect(row).to_contain_text("demo-rita 的红包")
    expect(page.get_by_test_id("record-best")).to_have_count(best)
    expect(rows.first).to_have_attribute("data-packet", list(got[name])[-1])  # newest first
    no_horizontal_scroll(page)
    shot(page, "10-my-red-packets")

    # the year before holds nothing; the words follow the language
    year = page.get_by_test_id("year").input_value()
    page.get_by_test_id("year").select_option(str(int(year) - 1))
    expect(page.get_by_test_id("totals-amount")).to_have_text("¥0.00")
    expect(page.locator("[data-testid=history-list] li.empty")).to_have_text("这一年还没有记录。")
    page.get_by_test_id("lang").click()
    expect(page.get_by_test_id("totals-count")).to_have_text("0 packet(s) received")
    expect(page.locator("[data-testid=history-list] li.empty")).to_have_text(
        "Nothing in this year yet."
    )
    # a record row opens its packet
    page.get_by_test_id("year").select_option(year)
    rows.first.locator("a").click()
    newest = list(got[name])[-1]
    page.wait_for_url(re.compile(rf"/p/{newest}$"))
    expect(page.get_by_test_id("my-amount")).to_have_attribute("data-fen", str(got[name][newest]))

    # the sender's side: what went out, and how each packet ended
    rita = phone(browser, contexts, "en-US")
    rita.goto(server.url + "/me")
    sign_in(rita, "rita")
    rita.get_by_test_id("tab-sent").click()
    expect(rita.get_by_test_id("tab-sent")).to_have_attribute("aria-selected", "true")
    expect(rita.get_by_test_id("totals-amount")).to_have_text("¥17.00")
    expect(rita.get_by_test_id("totals-count")).to_have_text("3 packet(s) sent")
    sent_rows = rita.locator("[data-testid=history-list] li[data-packet]")
    expect(sent_rows).to_have_count(3)
    expect(sent_rows.first).to_contain_text("Equal shares · 新年好")
    expect(sent_rows.first).to_contain_text("All 2 taken")
    expect(sent_rows.nth(1)).to_contain_text("Lucky")
    expect(sent_rows.nth(1)).to_have_attribute("data-fen", "900")
    no_horizontal_scroll(rita)
    shot(rita, "11-my-red-packets-sent")
    # another user's record is not shown to her
    r = httpx.get(f"{server.url}/v1/users/demo-sam/received", headers=auth("rita"))
    assert r.status_code == 403


# -- packet rules: an exclusive packet, the passphrase box, the countdown, cancelling ------

#: a local datetime-local value `seconds` from now, as the page's own clock says
LOCAL_SOON = """(seconds) => {
  const d = new Date(Date.now() + seconds * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())}` +
    `T${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}"""


def open_rules(page: Any) -> None:
    page.locator("details#rules summary").click()


def visit(b: Any, made: list[Any], link: str, name: str, locale: str = "zh-CN") -> Any:
    page = phone(b, made, locale)
    page.goto(link)
    sign_in(page, name)
    return page


def test_exclusive_packet_only_its_person_opens(
    browser: Any, server: Serve, contexts: list[Any]
) -> None:
    from playwright.sync_api import expect

    sender = phone(browser, contexts)
    sender.goto(server.url + "/")
    sign_in(sender, "ex-ann")
    open_rules(sender)
    sender.get_by_test_id("who-one").check()
    sender.get_by_test_id("one-user").fill("ex-bob")
    shot(sender, "10-send-exclusive")
    link = send_packet(sender, "6.66", 1, "只给你")
    expect(sender.get_by_test_id("rules-summary")).to_contain_text("demo-ex-bob")

    stranger = visit(browser, contexts, link, "ex-eve", "en-US")
    expect(stranger.get_by_test_id("for-you")).to_have_text("This red packet is for someone else")
    stranger.get_by_test_id("open").click()
    expect(stranger.get_by_test_id("outcome")).to_have_text("This red packet is for someone else.")
    expect(stranger.get_by_test_id("my-amount")).to_be_hidden()

    bob = visit(browser, contexts, link, "ex-bob")
    expect(bob.get_by_test_id("for-you")).to_have_text("给你的专属红包")
    shot(bob, "11-exclusive-for-you")
    bob.get_by_test_id("open").click()
    expect(bob.get_by_test_id("my-amount")).to_have_text("¥6.66")
    no_horizontal_scroll(bob)


def test_passphrase_box(browser: Any, server: Serve, contexts: list[Any]) -> None:
    from playwright.sync_api import expect

    sender = phone(browser, contexts)
    sender.goto(server.url + "/")
    sign_in(sender, "pp-ann")
    open_rules(sender)
    sender.get_by_test_id("passphrase").fill("芝麻开门")
    link = send_packet(sender, "3.00", 3, "口令红包", mode="equal")
    expect(sender.get_by_test_id("rules-summary")).to_contain_text("需要口令")

    bob = visit(browser, contexts, link, "pp-bob")
    box = bob.get_by_test_id("phrase")
    expect(box).to_be_visible()
    box.fill("芝麻")
    bob.get_by_test_id("open").click()
    expect(bob.get_by_test_id("outcome")).to_have_text("口令不对，请再试一次。")
    shot(bob, "12-wrong-passphrase")
    expect(bob.get_by_test_id("outcome")).to_be_hidden()  # a moment later: try again
    box.fill("芝麻开门")
    bob.get_by_test_id("open").click()
    expect(bob.get_by_test_id("my-amount")).to_have_text("¥1.00")
    expect(bob.get_by_test_id("phrase")).to_be_hidden()
    no_horizontal_scroll(bob)


def test_countdown_then_open(browser: Any, server: Serve, contexts: list[Any]) -> None:
    from playwright.sync_api import expect

    sender = phone(browser, contexts, "en-US")
    sender.goto(server.url + "/")
    sign_in(sender, "cd-ann")
    open_rules(sender)
    sender.get_by_test_id("starts-at").fill(sender.evaluate(LOCAL_SOON, 6))
    link = send_packet(sender, "2.00", 2, "At the stroke", mode="equal")

    bob = visit(browser, contexts, link, "cd-bob", "en-US")
    countdown = bob.get_by_test_id("countdown")
    expect(countdown).to_have_text(re.compile(r"^Opens in 00:0[1-6]$"))
    expect(bob.get_by_test_id("open")).to_be_disabled()
    shot(bob, "13-countdown")
    expect(countdown).to_be_hidden(timeout=10_000)
    expect(bob.get_by_test_id("open")).to_be_enabled()
    bob.get_by_test_id("open").click()
    expect(bob.get_by_test_id("my-amount")).to_have_text("¥1.00")


def test_sender_cancels(browser: Any, server: Serve, contexts: list[Any]) -> None:
    from playwright.sync_api import expect

    sender = phone(browser, contexts)
    sender.goto(server.url + "/")
    sign_in(sender, "cx-ann")
    link = send_packet(sender, "5.00", 5, "发错了", mode="equal")
    bob = visit(browser, contexts, link, "cx-bob")
    bob.get_by_test_id("open").click()
    expect(bob.get_by_test_id("my-amount")).to_have_text("¥1.00")
    sender.on("dialog", lambda dialog: dialog.accept())
    sender.get_by_test_id("cancel").click()
    expect(sender.get_by_test_id("outcome")).to_have_text("红包已撤回。 ¥4.00 已退回发红包的人。")
    expect(sender.get_by_test_id("cancel")).to_be_hidden()
    shot(sender, "14-cancelled")
    carol = visit(browser, contexts, link, "cx-carol")
    expect(carol.get_by_test_id("outcome")).to_have_text("红包已被撤回。 ¥4.00 已退回发红包的人。")
    expect(carol.get_by_test_id("open")).to_be_hidden()
    sender.goto(server.url + "/")
    expect(sender.get_by_test_id("balance")).to_have_text("¥99.00")
