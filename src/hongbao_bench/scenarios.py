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
* ``hongbao-cluster``: on a ``redis+cluster://`` URL, the engine's grab path with hot
  packets on the first 1, 2 ... P primaries, one client process per primary
  (`hongbao_bench.cluster_scenario`), and the same on one plain server for comparison.
* ``webhooks``: a storm's claim.settled events delivered to a local receiver: events/s
  and the lag from commit to arrival (`hongbao_bench.webhooks_scenario`).
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
from hongbao_bench.seed_scenarios import designs, redis_benchmark, seed_baseline
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
    "hongbao-cluster": cluster_scenario,
    "webhooks": webhooks_scenario,
}
#: groups of scenarios, in the order they run
SCENARIOS = tuple(RUNNERS)
