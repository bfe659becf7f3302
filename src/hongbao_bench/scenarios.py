"""The scenarios of `hongbao bench`: each one runs, audits its own money and returns
`Outcome` rows. This module is the registry: it imports the scenario modules, which
never import it.

Scenario names (``--scenarios``), in the order they run:

* ``seed-baseline``, ``redis-benchmark``: seed 002's client and its script under
  ``redis-benchmark`` (`hongbao_bench.seed_scenarios`);
* ``hongbao``, ``hongbao-nocoalesce``, ``hongbao-spread``, ``ack-modes``,
  ``hongbao-rules``: the engine's grab path (`hongbao_bench.engine_scenario`);
* ``hongbao-http``: ``hongbao serve --workers 2`` loaded by ``wrk`` (64 connections), and
  the hello-world ceiling of the same uvicorn setup, in alternating slices of the same run
  (`hongbao_bench.http_scenario`);
* ``designs``: seed 003's six designs on PostgreSQL and MariaDB
  (`hongbao_bench.seed_scenarios`);
* ``memory``: Redis bytes per unclaimed share and per claim for a 10,000-share packet
  (`hongbao_bench.memory`);
* ``micro``: what each performance seam of the grab path saves against the plain way
  (`hongbao_bench.micro`);
* ``history``: pages of the red-packet record and of a wallet's entries over a ledger of
  1,000,000 claims on PostgreSQL, and smaller ones on MariaDB and SQLite
  (`hongbao_bench.history_scenario`);
* ``settle``: claims/s one persister settles from full streams on PostgreSQL, MariaDB and
  SQLite (and two on PostgreSQL), and the grab-to-credit lag and backlog while `hongbao
  serve` is loaded over HTTP, on the embedded default and on PostgreSQL + Redis
  (`hongbao_bench.settle_scenario`);
* ``hongbao-cluster``: on a ``redis+cluster://`` URL, the engine's grab path with hot
  packets on the first 1, 2 ... P primaries, one client process per primary
  (`hongbao_bench.cluster_scenario`), and the same on one plain server for comparison;
* ``webhooks``: a storm's claim.settled events delivered to a local receiver: events/s
  and the lag from commit to arrival (`hongbao_bench.webhooks_scenario`);
* ``peers``: ``hongbao serve`` over HTTP beside the Go and Node.js services of
  ``../shared/peers`` (or ``$HONGBAO_PEERS_DIR``), in alternating rounds, spread and hot
  shapes (`hongbao_bench.peers`); skipped, with the reason, where they are not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from hongbao_bench.cluster_scenario import cluster_scenario
from hongbao_bench.common import BenchContext, Outcome
from hongbao_bench.engine_scenario import (
    ack_modes,
    hongbao,
    hongbao_nocoalesce,
    hongbao_rules,
    hongbao_spread,
)
from hongbao_bench.history_scenario import history_scenario
from hongbao_bench.http_scenario import hongbao_http
from hongbao_bench.memory import memory_scenario
from hongbao_bench.micro import micro
from hongbao_bench.peers import peers
from hongbao_bench.seed_scenarios import designs, redis_benchmark, seed_baseline
from hongbao_bench.settle_scenario import settle_scenario
from hongbao_bench.webhooks_scenario import webhooks_scenario

Runner = Callable[[BenchContext], Awaitable[list[Outcome]]]

#: scenario group -> what runs it, in the order they run
RUNNERS: dict[str, Runner] = {
    "seed-baseline": seed_baseline,
    "redis-benchmark": redis_benchmark,
    "hongbao": hongbao,
    "hongbao-nocoalesce": hongbao_nocoalesce,
    "hongbao-spread": hongbao_spread,
    "ack-modes": ack_modes,
    "hongbao-rules": hongbao_rules,
    "hongbao-http": hongbao_http,
    "designs": designs,
    "memory": memory_scenario,
    "micro": micro,
    "history": history_scenario,
    "settle": settle_scenario,
    "hongbao-cluster": cluster_scenario,
    "webhooks": webhooks_scenario,
    "peers": peers,
}
#: groups of scenarios, in the order they run
SCENARIOS = tuple(RUNNERS)
#: what runs without --scenarios: peers builds and starts Go and Node.js servers, so it
#: runs only when named
BY_DEFAULT = tuple(s for s in SCENARIOS if s != "peers")
