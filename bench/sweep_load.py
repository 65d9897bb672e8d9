"""Sweep load on Redis as the fleet grows, with and without the sweep lease, and how
long a dead server's tasks take to get back to the queue.

    python -m bench.sweep_load                 # 10, 100, 1,000 servers of 16 workers
    python -m bench.sweep_load --sizes 10,100  # a subset

Writes bench/results/sweep_load.{md,json} (never latest.*). Runs against a throwaway redis-server
of its own (127.0.0.1, a free port, no persistence, killed with the benchmark).

What is simulated, and what is real:
* The fleet is simulated: N server registrations (`servers` zset, `incarnations` hash) and 16
  registered in-flight lists per server are written straight into Redis; no server process or
  worker thread runs. Each simulated server is a real `taskcustody.Server` object with its
  incarnation set, and the sweep work is the library's own code (`Server.periodic_sweep`, what the
  background loop calls once per sweep interval): every command it sends reaches the real Redis.
* Time is simulated: a ManualClock moves from one sweep interval to the next; nothing waits.
  Heartbeats are not sent (live servers are registered with a deadline far ahead, as if they
  heartbeated): they cost one script per server per heartbeat interval, linear in the fleet with
  or without the lease, and are not sweep load.
* Load fleet: *busy*, every simulated worker holds one task with its processing record (a fleet
  at full load; the processing sweep visits every record, so this is the sweep's heaviest case).
* Without the lease every server sweeps every interval, and every one of those sweeps does the
  same work (same registry, same records). Above `--sample` servers, only `--sample` of them are
  run per interval and the interval's figures are scaled by N / sample (said so in the output).
* Recovery fleet: *idle* live servers (registered, lists registered and empty) and one server
  holding 16 tasks (one per list) that dies just after a heartbeat (and, as lease holder, just
  after renewing): the worst case for its registration. Servers' background loops are spread
  evenly over one sweep period. The lease key gets a one-hour PX in Redis so that the bench's own
  running time never lapses it; its lapse is simulated at the default lease TTL in simulated time
  (the key is deleted then, as Redis's timer would). Without the lease, ticks before the dead
  server's registration deadline are not run (a sweep prunes only servers whose deadline has
  passed and drains only lists whose owner is not registered: they cannot recover it; the bench
  checks that the first sweep it runs is the one that recovers the tasks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis

if __package__ in (None, ""):  # `python bench/sweep_load.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import BENCH_DIR, RedisServer, parse_sizes, rerender
from taskcustody import ManualClock, QueueKeys, Server, Settings, connect
from taskcustody.core.envelope import new_task
from taskcustody.core.keys import ListOwner

RESULTS = BENCH_DIR / "results"
WORKERS = 16
QUEUE = "sweepq"
T0 = 1_000_000.0
FAR = T0 + 10**9  # "keeps heartbeating": a registration deadline the run never reaches
HOUR = 3600.0
HARNESS_COMMANDS = {"info", "config|resetstat", "config", "flushall"}


def noop(payload: Any) -> None:
    return None


# -- the simulated fleet -------------------------------------------------------------------------


def register_simulated_lists(pipe: Any, keys: QueueKeys, list_keys: list[str], now: float) -> None:
    """Register in-flight lists the way a claim and a take do: the registry is a sorted set, list
    key -> time of its last registration."""
    pipe.zadd(keys.inflight_registry, dict.fromkeys(list_keys, now))


def server_id(i: int) -> str:
    return f"s{i:04d}"


def simulate_fleet(
    client: redis.Redis,
    keys: QueueKeys,
    n: int,
    *,
    busy: bool,
    settings: Settings,
    clock: ManualClock,
) -> list[Server]:
    """N registered servers of WORKERS registered lists each; with `busy`, one task with its
    processing record in every list."""
    client.flushall()
    servers = []
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        sid, incarnation = server_id(i), i + 1
        pipe.zadd(keys.servers, {sid: FAR})
        pipe.hset(keys.incarnations, sid, incarnation)
        lists = [keys.inflight(ListOwner(sid, incarnation, f"w{w}")) for w in range(WORKERS)]
        register_simulated_lists(pipe, keys, lists, clock.now())
        if busy:
            for w, list_key in enumerate(lists):
                task = new_task({"n": w}, clock.now(), task_id=f"{sid}-{w}")
                pipe.lpush(list_key, task.raw)
                pipe.hset(keys.processing, task.id, f"{list_key} {clock.now()!r}")
        server = Server(client, keys, sid, noop, workers=WORKERS, settings=settings, clock=clock)
        server.incarnation = incarnation  # as if it had claimed its id
        servers.append(server)
        if i % 100 == 99:
            pipe.execute()
    pipe.execute()
    return servers


def fleet_settings(lease: bool) -> Settings:
    """Default settings; the lease's PX is an hour so that real time never lapses it (its lapse
    is simulated, see the module's docstring)."""
    return Settings(sweep_lease=lease, sweep_lease_ttl=HOUR if lease else None)


# -- load ----------------------------------------------------------------------------------------


def _cpu(info: dict[str, Any]) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _commands(info: dict[str, Any]) -> int:
    return sum(
        int(v["calls"])
        for k, v in info.items()
        if k.startswith("cmdstat_") and k[len("cmdstat_") :] not in HARNESS_COMMANDS
    )


def measure_load(
    client: redis.Redis, n: int, *, lease: bool, intervals: int, sample: int
) -> dict[str, Any]:
    keys = QueueKeys(QUEUE)
    clock = ManualClock(T0)
    servers = simulate_fleet(
        client, keys, n, busy=True, settings=fleet_settings(lease), clock=clock
    )
    # With the lease every server still tries it each interval (one script each); without it,
    # every server sweeps, which is what we may sample.
    runners = servers if lease or n <= sample else servers[:: n // sample][:sample]
    scale = 1.0 if lease else n / len(runners)
    if not lease and n > sample:
        intervals = 1  # each of those sweeps does the same work: one interval says it all
    client.config_resetstat()
    before = client.info("all")
    wall = time.perf_counter()
    sweeps = 0
    for _ in range(intervals):
        for server in runners:
            sweeps += server.periodic_sweep() is not None
        clock.advance(servers[0].settings.sweep_interval)
    wall = time.perf_counter() - wall
    after = client.info("all")
    # Nothing recovered: every simulated server is live, every task stays where it is.
    assert int(client.llen(keys.queue)) == 0, "a sweep requeued a live server's task"
    commands = _commands(after) * scale / intervals
    top_level = (
        (int(after["total_commands_processed"]) - int(before["total_commands_processed"]) - 1)
        * scale
        / intervals
    )  # minus the INFO that read `before`
    cpu = (_cpu(after) - _cpu(before)) * scale / intervals
    scripts = (
        sum(int(after.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("eval", "evalsha"))
        * scale
        / intervals
    )
    period = servers[0].settings.sweep_period
    return {
        "servers": n,
        "workers_per_server": WORKERS,
        "lease": lease,
        "intervals_run": intervals,
        "servers_run_per_interval": len(runners),
        "scaled_by": scale,
        "sweeps_per_interval": sweeps * scale / intervals,
        "commands_per_interval": commands,
        "top_level_commands_per_interval": top_level,
        "scripts_per_interval": scripts,
        "cpu_ms_per_interval": cpu * 1000,
        "commands_per_s": commands / period,
        "cpu_share_of_a_core": cpu / period,
        "wall_s": wall,
    }


# -- recovery ------------------------------------------------------------------------------------


def phases(n: int, period: float, seed: int = 1) -> list[float]:
    """When each server's background loop first sweeps, within one period: server 0 at once (so
    that with the lease it is the first holder), the others at seeded random moments (servers
    start whenever they start)."""
    rng = random.Random(seed)
    return [0.0] + [rng.uniform(0, period) for _ in range(n - 1)]


def measure_recovery(client: redis.Redis, n: int, *, lease: bool, dead: int) -> dict[str, Any]:
    """Server `dead` dies holding 16 tasks (one per list), right after one of its loop's sweep
    ticks in the second period (just heartbeated; as the lease holder, just renewed)."""
    keys = QueueKeys(QUEUE)
    clock = ManualClock(T0)
    settings = fleet_settings(lease)
    model_lease_ttl = Settings().lease_ttl  # the default lease TTL, lapsed in simulated time
    servers = simulate_fleet(client, keys, n, busy=False, settings=settings, clock=clock)
    period = settings.sweep_period
    dead_holds_lease = lease and dead == 0
    victim = servers[dead]
    victim_lists = [
        keys.inflight(ListOwner(victim.server_id, dead + 1, f"w{w}")) for w in range(WORKERS)
    ]
    pipe = client.pipeline(transaction=False)
    for w, list_key in enumerate(victim_lists):
        task = new_task({"n": w}, clock.now(), task_id=f"victim-{w}")
        pipe.lpush(list_key, task.raw)
        pipe.hset(keys.processing, task.id, f"{list_key} {clock.now()!r}")
    pipe.execute()

    heap = [(T0 + phase, i) for i, phase in enumerate(phases(n, period))]
    heapq.heapify(heap)
    renewed_at: float | None = None
    death: float | None = None
    sweeps_run = skipped = 0
    recovered_at: float | None = None
    first_sweep_after_death_recovered: bool | None = None
    while heap:
        at, i = heapq.heappop(heap)
        if at > clock.now():
            clock.advance(at - clock.now())
        if death is not None and i == dead:
            continue  # dead servers do not tick
        if lease and renewed_at is not None and at >= renewed_at + model_lease_ttl:
            client.delete(keys.sweep_lease)  # Redis's PX timer, in simulated time
            renewed_at = None
        heapq.heappush(heap, (at + period, i))
        dies_now = death is None and i == dead and at >= T0 + period
        if not lease and (death is None or at < death + settings.server_ttl):
            skipped += 1  # cannot recover the victim (see the docstring)
        else:
            report = servers[i].periodic_sweep()
            if report is not None:
                sweeps_run += 1
                if lease:
                    renewed_at = at
            if death is not None and report is not None:
                back = int(client.llen(keys.queue))
                if first_sweep_after_death_recovered is None and not lease:
                    first_sweep_after_death_recovered = back == WORKERS
                if back == WORKERS and all(client.llen(k) == 0 for k in victim_lists):
                    recovered_at = at
                    break
        if dies_now:
            # Dies right after this tick: its last heartbeat was now, so it stays registered
            # for server_ttl; as the holder it renewed the lease just now.
            death = at
            client.zadd(keys.servers, {victim.server_id: at + settings.server_ttl})
            if dead_holds_lease:
                holder = client.get(keys.sweep_lease)
                assert holder == f"{victim.server_id}:{dead + 1}".encode(), holder
        if death is not None and at > death + 20 * period:
            break
    if recovered_at is None or death is None:
        raise RuntimeError(f"n={n} lease={lease}: the dead server's tasks never came back")
    if first_sweep_after_death_recovered is False:
        raise RuntimeError("a skipped tick could have recovered the tasks: the skip is wrong")
    seconds = recovered_at - death
    holder_extra = model_lease_ttl if lease and dead_holds_lease else 0.0
    return {
        "servers": n,
        "lease": lease,
        "dead_held_lease": dead_holds_lease,
        "dead": dead,
        "seconds": seconds,
        "sweep_intervals": seconds / settings.sweep_interval,
        "bound_seconds": max(settings.server_ttl, holder_extra) + period,
        "sweeps_run": sweeps_run,
        "ticks_skipped": skipped,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [r["seconds"] for r in runs]
    first = runs[0]
    return {
        "servers": first["servers"],
        "lease": first["lease"],
        "dead_held_lease": first["dead_held_lease"],
        "bound_seconds": first["bound_seconds"],
        "min_s": min(seconds),
        "median_s": statistics.median(seconds),
        "max_s": max(seconds),
        "runs": runs,
    }


# -- report --------------------------------------------------------------------------------------


def growth(rows: Iterable[dict[str, Any]], field: str) -> str:
    """Ratio of `field` between consecutive sizes (per 10x more servers, with the default
    sizes)."""
    out: list[str] = []
    prev: dict[str, Any] | None = None
    for row in rows:
        if prev is not None and prev[field] > 0:
            out.append(
                f"{prev['servers']:,} -> {row['servers']:,}: {row[field] / prev[field]:.1f}x"
            )
        prev = row
    return ", ".join(out)


def render(result: dict[str, Any]) -> str:
    lines = [
        "# Sweep load and recovery vs fleet size",
        "",
        f"Run: {result['when']}, `{result['command']}`, Redis {result['redis_version']}, "
        f"{result['host']}. Default settings: heartbeat "
        f"{result['settings']['heartbeat_interval']:g} s, server TTL "
        f"{result['settings']['server_ttl']:g} s, sweep interval "
        f"{result['settings']['sweep_interval']:g} s, lease TTL "
        f"{result['settings']['lease_ttl']:g} s.",
        "",
        "**Simulated**: registrations and in-flight lists are written into Redis directly (16 "
        "lists per server), no worker runs, and time is a manual clock; the sweeps are the "
        "library's own code (`Server.periodic_sweep`) against a real redis-server. Load fleet: "
        "every worker holds one task with its processing record. Heartbeats (1 script per server "
        "per 5 s, linear either way) are not counted. See bench/sweep_load.py's docstring.",
        "",
        "Commands are Redis's own count (`INFO commandstats`, which agrees with "
        "`total_commands_processed`), including the commands the scripts run; CPU is the "
        "redis-server's `used_cpu_user + used_cpu_sys` over the measured sweeps. Per interval "
        "= per 10 s of a live fleet, so commands/s and share of a core are per-interval / 10 s.",
        "",
        "## Sweep load per sweep interval",
        "",
        "| servers | lists | lease | sweeps | commands | of which scripts (EVAL) "
        "| commands/s | Redis CPU ms | share of a core | measured |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in result["load"]:
        measured = (
            f"{row['intervals_run']} interval(s), all servers"
            if row["scaled_by"] == 1
            else f"{row['servers_run_per_interval']} of {row['servers']} servers' sweeps, "
            f"x{row['scaled_by']:g}"
        )
        lines.append(
            f"| {row['servers']:,} | {row['servers'] * WORKERS:,} | "
            f"{'on' if row['lease'] else 'off'} | {row['sweeps_per_interval']:,.0f} | "
            f"{row['commands_per_interval']:,.0f} | {row['scripts_per_interval']:,.0f} | "
            f"{row['commands_per_s']:,.0f} | {row['cpu_ms_per_interval']:,.1f} | "
            f"{row['cpu_share_of_a_core']:.2%} | {measured} |"
        )
    lines += ["", "Growth per 10x servers:", ""]
    for lease in (True, False):
        rows = [r for r in result["load"] if r["lease"] == lease]
        lines.append(
            f"- lease {'on' if lease else 'off'}: commands "
            f"{growth(rows, 'commands_per_interval')}; Redis CPU "
            f"{growth(rows, 'cpu_ms_per_interval')}"
        )
    lines += [
        "",
        "A share of a core over 100% means that one (single-threaded) Redis could not keep up: "
        "the sweeps would queue behind each other and everything else. Scaled rows ran a "
        "sample of the servers' sweeps (each does the same work: same registry, same records) "
        "and multiplied; with the lease, every server ran every interval. CPU below ~10 ms is "
        "mostly noise on this shared 2-core machine.",
    ]
    lines += [
        "",
        "## Recovery: a server's death to its 16 tasks back in the queue (simulated time)",
        "",
        "| servers | lease | dead server held the lease | runs (victims) | seconds: min / median"
        " / max | in sweep intervals (max) | bound (s) |",
        "|---:|---|---|---:|---|---:|---:|",
    ]
    interval = result["settings"]["sweep_interval"]
    for row in result["recovery"]:
        lines.append(
            f"| {row['servers']:,} | {'on' if row['lease'] else 'off'} | "
            f"{'yes' if row['dead_held_lease'] else 'no'} | {len(row['runs'])} | "
            f"{row['min_s']:.2f} / {row['median_s']:.2f} / {row['max_s']:.2f} | "
            f"{row['max_s'] / interval:.2f} | {row['bound_seconds']:g} |"
        )
    lines += [
        "",
        "Each run kills a different server (so a different phase against the others' sweep "
        "ticks) right after its own tick, i.e. just after its last heartbeat: it then stays "
        "registered a full server TTL, the worst case for that part. The phases are seeded, "
        "so victims 1-5 have the same phases at every size: with the lease, recovery depends "
        "only on the victim's phase against the holder's, not on the fleet's size; without it, "
        "on the gap to the next server's tick, which shrinks as the fleet grows.",
        "",
        "Bound: server TTL (the dead server stays registered until its deadline) + one sweep "
        "period; when it held the lease, max(server TTL, lease TTL) + one sweep period (the "
        "lease lapses, then the next server to tick takes it and sweeps at once).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.sweep_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", default="10,100,1000", help="servers, comma-separated")
    ap.add_argument("--intervals", type=int, default=3, help="sweep intervals measured")
    ap.add_argument(
        "--sample",
        type=int,
        default=10,
        help="without the lease, sweeps run per interval above this many servers",
    )
    ap.add_argument(
        "--victims",
        type=int,
        default=5,
        help="recovery: how many different servers (phases) die, one per run",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="only rewrite the .md next to JSON from it (no measurement)",
    )
    args = ap.parse_args(argv)
    if args.render is not None:
        return rerender(args.render, render)
    sizes = parse_sizes(ap, args.sizes)
    if any(s < 2 for s in sizes):
        ap.error("--sizes: at least 2 servers (one dies, one recovers)")
    if args.intervals < 1 or args.sample < 1 or args.victims < 1:
        ap.error("--intervals, --sample and --victims must be >= 1")
    started = time.monotonic()
    load: list[dict[str, Any]] = []
    recovery: list[dict[str, Any]] = []
    with RedisServer(debug_command=False) as srv:
        client = connect(srv.url, Settings(block_timeout=60))
        for n in sizes:
            for lease in (True, False):
                row = measure_load(
                    client, n, lease=lease, intervals=args.intervals, sample=args.sample
                )
                load.append(row)
                print(
                    f"load  n={n:>5} lease={'on ' if lease else 'off'}: "
                    f"{row['commands_per_interval']:>12,.0f} commands/interval, "
                    f"{row['cpu_ms_per_interval']:>9,.1f} ms CPU/interval "
                    f"({row['wall_s']:.1f} s)",
                    flush=True,
                )
            victims = list(range(1, min(n, args.victims + 1)))
            for lease, dead in ((True, victims), (True, [0]), (False, victims)):
                case = summarise([measure_recovery(client, n, lease=lease, dead=d) for d in dead])
                recovery.append(case)
                print(
                    f"recovery n={n:>5} lease={'on ' if lease else 'off'} "
                    f"dead held lease={'yes' if case['dead_held_lease'] else 'no '}: "
                    f"{case['min_s']:.2f} .. {case['max_s']:.2f} s over "
                    f"{len(case['runs'])} victim(s)",
                    flush=True,
                )
        client.close()
        version = srv.version
    defaults = Settings()
    result = {
        "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.sweep_load"
        + (f" {' '.join(argv)}" if argv else "".join(f" {a}" for a in sys.argv[1:])),
        "redis_version": version,
        "host": f"{platform.machine()}, Python {platform.python_version()}",
        "elapsed_s": time.monotonic() - started,
        "settings": {
            "heartbeat_interval": defaults.heartbeat_interval,
            "server_ttl": defaults.server_ttl,
            "sweep_interval": defaults.sweep_interval,
            "lease_ttl": defaults.lease_ttl,
        },
        "workers_per_server": WORKERS,
        "load": load,
        "recovery": recovery,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep_load.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "sweep_load.md").write_text(render(result))
    print(f"wrote {args.out / 'sweep_load.md'} and .json in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
