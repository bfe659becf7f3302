"""What `hongbao bench` measured: a Rich table, the target ratios, JSON, a plot, Markdown."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hongbao_bench.common import Outcome
from hongbao_bench.history_scenario import TARGET_P99_MS, history_target
from hongbao_bench.peers import P99_MS as PEERS_P99_MS
from hongbao_bench.peers import ratios as peers_ratios
from hongbao_bench.settle_scenario import settle_targets
from hongbao_bench.webhooks_scenario import webhook_targets


@dataclass(frozen=True)
class Target:
    name: str
    value: float | None
    goal: str
    met: bool | None
    unit: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": None if self.value is None else round(self.value, 2),
            "unit": self.unit,
            "goal": self.goal,
            "met": self.met,
        }


def _find(outcomes: Sequence[Outcome], name: str) -> Outcome | None:
    return next((o for o in outcomes if o.scenario == name and o.status != "skipped"), None)


def _rate(outcomes: Sequence[Outcome], name: str) -> float | None:
    found = _find(outcomes, name)
    return found.grabs_per_second if found is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _check(
    value: float | None, at_least: float | None = None, at_most: float | None = None
) -> bool | None:
    if value is None:
        return None
    if at_least is not None:
        return value >= at_least
    return value <= (at_most if at_most is not None else value)


def targets(outcomes: Sequence[Outcome]) -> list[Target]:
    """The issue's targets, computed from this run."""
    hb = _rate(outcomes, "hongbao")
    x_seed = _ratio(hb, _rate(outcomes, "seed-baseline"))
    x_rb = _ratio(hb, _rate(outcomes, "redis-benchmark"))
    found = _find(outcomes, "hongbao")
    cpu = found.figures.get("redis_cpu_pct") if found is not None else None
    http = _find(outcomes, "hongbao-http")
    of_hello = _ratio(_rate(outcomes, "hongbao-http"), _rate(outcomes, "hello-world"))
    p99 = http.result.p99_ms if http is not None and http.result is not None else None
    mem = _find(outcomes, "memory")
    per_share = mem.figures.get("bytes_per_share") if mem is not None else None
    per_claim = mem.figures.get("bytes_per_claim") if mem is not None else None
    return [
        Target("hongbao / seed-baseline", x_seed, ">= 12x", _check(x_seed, 12), "x"),
        Target("hongbao / redis-benchmark (unpipelined)", x_rb, ">= 2x", _check(x_rb, 2), "x"),
        Target("Redis CPU during hongbao", cpu, ">= 80%", _check(cpu, 80), "%"),
        Target(
            "hongbao-http / hello-world",
            None if of_hello is None else of_hello * 100,
            ">= 70%",
            _check(None if of_hello is None else of_hello * 100, 70),
            "%",
        ),
        Target("hongbao-http p99 (64 connections)", p99, "<= 50 ms", _check(p99, at_most=50), "ms"),
        Target(
            "Redis bytes per unclaimed share",
            per_share,
            "<= 16 B",
            _check(per_share, at_most=16),
            "B",
        ),
        Target("Redis bytes per claim", per_claim, "<= 96 B", _check(per_claim, at_most=96), "B"),
        *history_targets(outcomes),
        *[Target(t.name, t.value, t.goal, t.met, t.unit) for t in settle_targets(outcomes)],
        *cluster_targets(outcomes),
        *peers_targets(outcomes),
        *[Target(n, v, goal, met, "x") for n, v, goal, met in webhook_targets(outcomes)],
    ]


def history_targets(outcomes: Sequence[Outcome]) -> list[Target]:
    """A page of the record or of wallet entries on PostgreSQL: the slowest endpoint's p99."""
    p99, endpoint = history_target(outcomes)
    if p99 is None:
        return []
    goal = f"< {TARGET_P99_MS:.0f} ms"
    name = f"history page p99 on PostgreSQL ({endpoint}, the slowest)"
    return [Target(name, p99, goal, p99 < TARGET_P99_MS, "ms")]


def _widest_cluster_run(outcomes: Sequence[Outcome]) -> Outcome | None:
    runs = [
        o
        for o in outcomes
        if o.group == "hongbao-cluster"
        and o.status != "skipped"
        and "primaries" in o.figures
        and not o.scenario.endswith("-single")
    ]
    return max(runs, key=lambda o: int(o.figures["primaries"]), default=None)


def cluster_targets(outcomes: Sequence[Outcome]) -> list[Target]:
    """Per-primary throughput on P primaries against one plain server (goal: >= 80%).

    Per Redis CPU-second is the figure that holds on a small machine, where the client
    processes and primaries share the cores; grabs/s per primary needs a core per primary
    and per client process to be meaningful.
    """
    widest = _widest_cluster_run(outcomes)
    if widest is None:
        return []
    n = widest.figures["primaries"]
    per_cpu = widest.figures.get("grabs_per_primary_cpu_s_of_single_pct")
    rate = widest.figures.get("grabs_per_s_per_primary_of_single_pct")
    return [
        Target(
            f"cluster, {n} primaries: grabs per primary CPU-s / single node",
            per_cpu,
            ">= 80%",
            _check(per_cpu, 80),
            "%",
        ),
        Target(
            f"cluster, {n} primaries: grabs/s per primary / single node",
            rate,
            ">= 80%",
            _check(rate, 80),
            "%",
        ),
    ]


def peers_targets(outcomes: Sequence[Outcome]) -> list[Target]:
    """hongbao over HTTP against the best peer of the same shape, and its p99."""
    found = [
        Target(f"peers {shape}: {server} / best peer", ratio, f">= {goal:.2f}x", ratio >= goal, "x")
        for shape, server, ratio, goal in peers_ratios(outcomes)
    ]
    for o in outcomes:
        if o.group == "peers" and str(o.figures.get("server", "")).startswith("hongbao"):
            p99 = float(o.figures["p99_ms"])
            goal = f"<= {PEERS_P99_MS:.0f} ms"
            found.append(Target(f"{o.scenario} p99", p99, goal, p99 <= PEERS_P99_MS, "ms"))
    return found


def failed_ours(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Our scenarios that failed or broke (the command exits non-zero if any)."""
    return [o for o in outcomes if o.ours and o.status in ("failed", "error")]


# --------------------------------------------------------------------------- table


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _headline(o: Outcome) -> str:
    bits = []
    f = o.figures
    if "per_primary" in f:
        bits.append(_cluster_headline(f))
    elif "redis_cpu_pct" in f:
        bits.append(f"redis cpu {f['redis_cpu_pct']}%")
    if "persister_us_per_claim" in f:
        bits.append(_settle_headline(f))
    if "python_cpu_pct" in f:
        bits.append(f"python cpu {f['python_cpu_pct']}%")
    if "python_us_per_grab" in f:
        bits.append(
            f"cpu per grab: python {f['python_us_per_grab']}us, redis {f['redis_us_per_grab']}us"
        )
    if "server_us_per_request" in f:
        bits.append(
            f"server cpu {f['server_cpu_pct']}%, {f['server_us_per_request']}us per request"
        )
    if "other_cpu_pct" in f:
        bits.append(f"other processes {f['other_cpu_pct']}%")
    if f.get("rounds_grabs_per_second"):
        rates = " / ".join(_num(r) for r in f["rounds_grabs_per_second"])
        shown = "median shown"
        if "rounds_shown" in f:  # a row of a ratio pair: the round of the median ratio
            shown = f"round {f['rounds_shown']} shown: the median ratio's"
        bits.append(f"rounds {rates} grabs/s ({shown})")
    if len(f.get("slices_rps", ())) > 1:
        bits.append(f"slices {' / '.join(_num(r) for r in f['slices_rps'])} req/s")
    if "hello_rps" in f:
        bits.append(f"p99 {f['p99_ms']} ms, its trivial endpoint {_num(f['hello_rps'])} req/s")
    if f.get("cpu_us_a_request"):
        bits.append(_processes_headline(f["cpu_us_a_request"]))
    if "grabs_per_call" in f:
        bits.append(f"{f['grabs_per_call']} grabs/call")
    if "packets_per_call" in f:
        bits.append(f"{f['packets_per_call']} packets/call")
    if "of_hello_world_pct" in f:
        bits.append(f"{f['of_hello_world_pct']}% of hello")
    if f.get("rounds_of_hello_world_pct"):
        ratios = " / ".join(f"{r}%" for r in f["rounds_of_hello_world_pct"])
        bits.append(f"rounds {ratios} of hello")
    if "bytes_per_share" in f:
        bits.append(
            f"{f['bytes_per_share']} B/share ({f['shares_encoding']}), "
            f"{f['bytes_per_claim']} B/claim ({f['claims_encoding']})"
        )
    if o.note:
        bits.append(o.note)
    return "; ".join(bits)


def _processes_headline(cpu: dict[str, Any]) -> str:
    """A peers row's CPU a request, process by process: user + system µs of each role that
    used any, then the machine's busy and idle µs."""
    roles = [
        f"{role} {user}+{system}"
        for role, (user, system) in ((k, v) for k, v in cpu.items() if isinstance(v, list))
        if user or system
    ]
    text = "cpu us per request (user+sys): " + ", ".join(roles)
    if "machine_busy" in cpu:
        text += f"; machine busy {cpu['machine_busy']}, idle {cpu['machine_idle']}"
    return text


def _settle_headline(f: dict[str, Any]) -> str:
    """A settle row: the CPU per claim of each side, and a storm's backlog."""
    text = f"cpu per claim: persister {f['persister_us_per_claim']}us"
    if f.get("db_us_per_claim") is not None:
        text += f", database {f['db_us_per_claim']}us ({f['db_cpu_scope']})"
    if f.get("serve_tree_us_per_claim") is not None:
        text += f", serve's process tree {f['serve_tree_us_per_claim']}us"
    text += f", redis {f['redis_us_per_claim']}us"
    if "max_backlog_claims" in f:
        text += (
            f"; largest backlog {f['max_backlog_claims']:,} claims "
            f"({f['max_backlog_seconds']} s of grabs), caught up {f['catch_up_seconds']} s "
            f"after the storm; lag max {f['lag_max_ms']} ms; grab p99 {f['grab_p99_ms']} ms"
        )
    return text


def _cluster_headline(f: dict[str, Any]) -> str:
    """A hongbao-cluster row: per-primary rates, each primary's CPU, the comparisons."""
    per = f["per_primary"]
    cpus = "/".join(f"{p['redis_cpu_pct']}" for p in per)
    k = f["primaries"]
    servers = "one plain server" if f.get("single") else f"{k} primar{'y' if k == 1 else 'ies'}"
    text = (
        f"{servers}, {k} client process{'' if k == 1 else 'es'}: per primary "
        f"{_num(f['grabs_per_s_per_primary'])} grabs/s, "
        f"{_num(f['grabs_per_primary_cpu_s'])} grabs per Redis CPU-s; "
        f"redis cpu {cpus}%"
    )
    if f.get("machine_cpu_pct") is not None:
        text += f"; machine cpu {f['machine_cpu_pct']}%"
    for label, name in (("single", "single node"), ("1p", "1 primary")):
        per_cpu = f.get(f"grabs_per_primary_cpu_s_of_{label}_pct")
        rate = f.get(f"grabs_per_s_per_primary_of_{label}_pct")
        if per_cpu is not None:
            text += f"; of {name}: {per_cpu}% per CPU-s, {rate}% grabs/s"
    return text


def rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    """One row of text cells per outcome (shared by the Rich and Markdown tables)."""
    out = []
    for o in outcomes:
        r = o.result
        out.append(
            [
                o.scenario,
                o.status,
                _num(o.grabs_per_second),
                _num(r.p50_ms if r else o.figures.get("p50_ms"), 2),
                _num(r.p99_ms if r else o.figures.get("p99_ms"), 2),
                _num(r.grabs_attempted) if r else "-",
                _num(r.retries_or_conflicts) if r else "-",
                _num(r.turned_away_while_left) if r else "-",
                f"{r.over_issue}/{r.duplicates}" if r else "-",
                _headline(o),
            ]
        )
    return out


HEADERS = [
    "scenario",
    "status",
    "grabs/s",
    "p50 ms",
    "p99 ms",
    "grabs",
    "retries/conflicts",
    "turned away while left",
    "over-issue/double",
    "notes",
]


def table(outcomes: Sequence[Outcome]) -> Table:
    t = Table(title="hongbao bench", show_lines=False, header_style="bold")
    for i, h in enumerate(HEADERS):
        t.add_column(h, justify="right" if 2 <= i <= 8 else "left", overflow="fold")
    for o, cells in zip(outcomes, rows(outcomes), strict=True):
        style = None
        if o.status in ("failed", "error"):
            style = "bold red" if o.ours else "red"
        elif o.status == "skipped":
            style = "dim"
        t.add_row(*cells, style=style)
    return t


def targets_table(found: Sequence[Target]) -> Table:
    t = Table(title="targets", header_style="bold")
    for h in ("target", "measured", "goal", "met"):
        t.add_column(h)
    for tg in found:
        met = "-" if tg.met is None else ("yes" if tg.met else "NO")
        style = None if tg.met is None else ("green" if tg.met else "red")
        value = "-" if tg.value is None else f"{tg.value:,.2f}{tg.unit}"
        t.add_row(tg.name, value, tg.goal, met, style=style)
    return t


def show(console: Console, outcomes: Sequence[Outcome], meta: dict[str, Any]) -> None:
    console.print(table(outcomes))
    console.print(targets_table(targets(outcomes)))
    console.print(f"peak RSS of this process: {meta.get('peak_rss_mb', 0):.0f} MB", style="dim")
    bad = failed_ours(outcomes)
    if bad:
        names = ", ".join(o.scenario for o in bad)
        console.print(f"[bold red]FAILED:[/] {names}", markup=True)
    broken = [o.scenario for o in outcomes if not o.ours and o.status in ("failed", "error")]
    if broken:
        console.print(
            f"[red]failing (comparisons and seed designs, not fatal):[/] {', '.join(broken)}",
            markup=True,
        )


# --------------------------------------------------------------------------- files


def machine() -> dict[str, Any]:
    import os

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def document(outcomes: Sequence[Outcome], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        **meta,
        "machine": machine(),
        "scenarios": [o.to_dict() for o in outcomes],
        "targets": [t.to_dict() for t in targets(outcomes)],
        "failed": [o.scenario for o in failed_ours(outcomes)],
    }


def write_json(path: Path, outcomes: Sequence[Outcome], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document(outcomes, meta), indent=2) + "\n", encoding="utf-8")


def write_plot(path: Path, outcomes: Sequence[Outcome]) -> None:
    """Throughput and p99 per scenario, two horizontal bar charts (log scales)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [o for o in outcomes if o.grabs_per_second and o.result is not None]
    if not shown:
        fig = plt.figure(figsize=(6, 2))
        fig.text(0.5, 0.5, "no throughput figures in this run", ha="center")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
        plt.close(fig)
        return
    names = [o.scenario for o in shown]
    colors = [
        "tab:red"
        if o.status in ("failed", "error")
        else ("tab:green" if o.scenario.startswith("hongbao") else "tab:gray")
        for o in shown
    ]
    height = max(3.0, 0.38 * len(shown) + 1.2)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, height), sharey=True)
    y = list(range(len(shown)))
    rates = [o.grabs_per_second or 0.0 for o in shown]
    p99 = [o.result.p99_ms if o.result else 0.0 for o in shown]
    left.barh(y, rates, color=colors)
    left.set_xscale("log")
    left.set_xlim(right=max(rates) * 4)
    left.set_xlabel("grabs (requests) per second, log scale")
    left.set_yticks(y, names)
    left.invert_yaxis()
    for i, v in enumerate(rates):
        left.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    right.barh(y, [max(v, 0.01) for v in p99], color=colors)
    right.set_xscale("log")
    right.set_xlim(right=max(max(p99), 0.01) * 4)
    right.set_xlabel("p99 latency, ms, log scale")
    for i, v in enumerate(p99):
        right.text(max(v, 0.01), i, f" {v:,.1f}", va="center", fontsize=8)
    fig.suptitle("hongbao bench: throughput and p99 per scenario (green: hongbao, red: failed)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _load(values: Any) -> str:
    return "/".join(f"{v:.2f}" for v in values) if values else "?"


def markdown(outcomes: Sequence[Outcome], meta: dict[str, Any]) -> str:
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = [
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join("---:" if 2 <= i <= 8 else "---" for i in range(len(HEADERS))) + "|",
    ]
    lines += ["| " + " | ".join(esc(c) for c in cells) + " |" for cells in rows(outcomes)]
    lines += ["", "| target | measured | goal | met |", "|---|---:|---|---|"]
    for t in targets(outcomes):
        value = "-" if t.value is None else f"{t.value:,.2f}{t.unit}"
        met = "-" if t.met is None else ("yes" if t.met else "**no**")
        lines.append(f"| {t.name} | {value} | {t.goal} | {met} |")
    lines += [
        "",
        f"Peak RSS of the bench process: {meta.get('peak_rss_mb', 0):.0f} MB. "
        f"Profile `{meta.get('profile')}`"
        + (f", median of {meta['rounds']} interleaved rounds" if meta.get("rounds", 1) > 1 else "")
        + f", {meta.get('finished_at', '')}, "
        f"{machine()['cpus']} CPUs, Python {machine()['python']}; load average "
        f"{_load(meta.get('load_average_before'))} before, "
        f"{_load(meta.get('load_average_after'))} after (other work on the machine "
        "lowers every rate; the CPU microseconds per grab depend on it much less).",
        "",
        "Command:",
        "",
        "```",
        str(meta.get("command", "hongbao bench")),
        "```",
    ]
    return "\n".join(lines) + "\n"
