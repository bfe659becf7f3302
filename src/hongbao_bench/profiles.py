"""How big each scenario of `hongbao bench` is: the tiny, quick and full profiles, and
``--size N`` (N grabs in the hongbao scenario, the other scenarios scaled alike)."""

from __future__ import annotations

from dataclasses import dataclass, replace

#: shares of the memory scenario's packet (its targets are per share and per claim)
MEMORY_SHARES = 10_000


@dataclass(frozen=True)
class Profile:
    """How big each scenario is."""

    name: str
    seed_shares: int
    seed_threads: int
    rb_requests: int
    hb_packets: int
    hb_shares: int  # per packet
    hb_tasks: int
    nocoalesce_shares: int  # per packet
    http_seconds: float
    http_connections: int
    design_shares: int
    design_grabbers: int
    design_concurrency: int
    memory_shares: int = MEMORY_SHARES
    spread_packets: int = 1_000
    spread_shares: int = 80  # per packet
    #: the peers scenario: alternating rounds, and seconds of wrk per server and round
    #: (short enough that an API node does not run through run_peers.py's 300,000 shares
    #: for hongbao: 8 s at 37,500 grabs/s)
    peers_rounds: int = 3
    peers_seconds: int = 8
    #: settle: claims each drain row grabs (over 20 packets) before its persisters start
    settle_claims: int = 100_000
    #: settle: seconds of each HTTP storm
    settle_storm_seconds: float = 60.0
    #: webhooks: claims of the storm (over 10 packets), one claim.settled event each: a
    #: storm of several persister transactions (up to 10,000 claims each on SQLite), so
    #: that keeping pace is measured, not the last transaction's tail
    webhook_events: int = 100_000

    @property
    def cluster_grabs(self) -> int:
        """Grabs per targeted primary in each hongbao-cluster run."""
        return max(200, self.hb_packets * self.hb_shares // 8)


#: The quick profile's engine storm (8 x 40,000 grabs) lasts over a second, so that a
#: stall as short as an AOF rewrite set off by the earlier scenarios' writes is a small
#: part of it and does not decide its Redis CPU reading.
PROFILES: dict[str, Profile] = {
    "tiny": Profile(
        name="tiny",
        seed_shares=2_000,
        seed_threads=20,
        rb_requests=5_000,
        hb_packets=4,
        hb_shares=1_000,
        hb_tasks=500,
        nocoalesce_shares=500,
        http_seconds=1.0,
        http_connections=64,
        peers_rounds=1,
        peers_seconds=2,
        design_shares=20,
        design_grabbers=40,
        design_concurrency=10,
        memory_shares=1_000,
        spread_packets=40,
        spread_shares=10,
        settle_claims=2_000,
        settle_storm_seconds=1.0,
        webhook_events=2_000,
    ),
    "quick": Profile(
        name="quick",
        seed_shares=40_000,
        seed_threads=20,
        rb_requests=60_000,
        hb_packets=8,
        hb_shares=40_000,
        hb_tasks=2_000,
        nocoalesce_shares=4_000,
        http_seconds=3.0,
        http_connections=64,
        peers_rounds=1,
        peers_seconds=5,
        design_shares=100,
        design_grabbers=200,
        design_concurrency=20,
        settle_claims=20_000,
        settle_storm_seconds=10.0,
        webhook_events=5_000,
    ),
    "full": Profile(
        name="full",
        seed_shares=200_000,
        seed_threads=20,
        rb_requests=300_000,
        hb_packets=8,
        hb_shares=50_000,
        hb_tasks=2_000,
        nocoalesce_shares=12_500,
        http_seconds=12.0,
        http_connections=64,
        design_shares=1_000,
        design_grabbers=2_000,
        design_concurrency=20,
    ),
}


def profile_for(size: str | None, quick: bool) -> Profile:
    """``tiny`` / ``quick`` / ``full``, or a number: the `hongbao` scenario's grabs."""
    if size is None:
        return PROFILES["quick" if quick else "full"]
    if size in PROFILES:
        return PROFILES[size]
    try:
        grabs = int(size)
    except ValueError:
        raise ValueError(f"--size must be tiny, quick, full or a number, not {size!r}") from None
    if grabs < 100:
        raise ValueError("--size must be at least 100 grabs")
    base = PROFILES["quick" if quick else "full"]
    per = max(1, grabs // base.hb_packets)
    scale = grabs / (base.hb_packets * base.hb_shares)
    return replace(
        base,
        name=str(grabs),
        hb_shares=per,
        seed_shares=max(100, int(base.seed_shares * scale)),
        rb_requests=max(1_000, int(base.rb_requests * scale)),
        nocoalesce_shares=max(10, int(base.nocoalesce_shares * scale)),
        spread_packets=max(20, min(base.spread_packets, int(base.spread_packets * scale))),
        spread_shares=max(1, min(base.spread_shares, int(base.spread_shares * scale))),
        settle_claims=max(1_000, int(base.settle_claims * scale)),
        webhook_events=max(1_000, int(base.webhook_events * scale)),
    )
