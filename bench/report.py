"""Markdown for bench/results/latest.md, from the results dict that bench/run.py collects."""

from __future__ import annotations

from typing import Any

FLOOR = "blmove-lrem"


def _f(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def floors_by_concurrency(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {r["concurrency"]: r["median"] for r in rows if r["kind"] == FLOOR}


def fastest_peer(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    peers = [r for r in rows if r["group"] == "peer"]
    return max(peers, key=lambda r: r["median"]) if peers else None


def add_ratios(rows: list[dict[str, Any]]) -> None:
    floors = floors_by_concurrency(rows)
    best = fastest_peer(rows)
    for r in rows:
        r["vs_peer"] = r["median"] / best["median"] if best else None
        floor = floors.get(r.get("floor_concurrency", r["concurrency"]))
        r["vs_floor"] = r["median"] / floor if floor else None


def paired(a: dict[str, Any], b: dict[str, Any] | None) -> float | None:
    """Median over rounds of a/b within the same round: robust to load drifting between rounds."""
    if not b:
        return None
    ra, rb = a.get("by_round") or {}, b.get("by_round") or {}
    ratios = sorted(ra[k] / rb[k] for k in ra if rb.get(k))
    if not ratios:
        return None
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


def goal(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    best = fastest_peer(rows)
    floors = floors_by_concurrency(rows)
    floor_rows = {r["concurrency"]: r for r in rows if r["kind"] == FLOOR}
    out = []
    for r in rows:
        if r["group"] != "ours":
            continue
        floor = floors.get(r["concurrency"])
        out.append(
            {
                "paired_peer": paired(r, best),
                "paired_floor": paired(r, floor_rows.get(r["concurrency"])),
                "concurrency": r["concurrency"],
                "label": r["label"],
                "median": r["median"],
                "vs_peer": r["median"] / best["median"] if best else None,
                "vs_floor": r["median"] / floor if floor else None,
                "peer_ok": bool(best and r["median"] >= 2 * best["median"]),
                "floor_ok": bool(floor and r["median"] >= 0.9 * floor),
            }
        )
    return out


def markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    rows: list[dict[str, Any]] = data.get("throughput", [])
    out: list[str] = []
    w = out.append
    w("# taskcustody benchmarks")
    w("")
    w(
        f"Run {meta['date']} with `{meta['command']}` at commit `{meta['commit']}`: "
        f"{meta['cpus']} cores, Redis {meta['redis_version']} (a "
        "throwaway `redis-server` started by "
        f"the benchmark, nothing on disk), Python {meta['python']}. "
        f"Load average before/after: {meta['load_before']} / {meta['load_after']}."
        + (
            " **The machine was shared with other engineers' test runs: figures are noisy.**"
            if meta.get("loaded_note")
            else ""
        )
    )
    w("")
    if rows:
        best = fastest_peer(rows)
        w(
            f"## Throughput: {meta['tasks']:,} no-op tasks enqueued first, then drained "
            f"(median of {meta['rounds']} round(s))"
        )
        w("")
        w(
            "`x peer`: ratio to the fastest peer of this run"
            + (f" ({best['label']}, {best['median']:,.0f}/s)" if best else "")
            + "; `x floor`: ratio to the raw BLMOVE + LREM floor at the "
            "same concurrency (peers: the "
            "floor of their shape, in brackets). `RT/task`: socket reads the server processed per "
            "task (a pipeline, or a command whose reply is read later, "
            "still counts once per send); "
            "`cmd/task`: every command, including those run inside Lua scripts."
        )
        w("")
        w(
            "| workload | concurrency | tasks | median tasks/s | min | max | x peer | x floor "
            "| RT/task | cmd/task |"
        )
        w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        order = {"ours": 0, "diag": 1, "floor": 2, "peer": 3}
        for r in sorted(rows, key=lambda r: (order[r["group"]], r["label"], r["concurrency"])):
            c = r.get("counts") or {}
            label = f"**{r['label']}**" if r["group"] == "ours" else r["label"]
            vs_floor = _ratio(r.get("vs_floor"))
            if r["group"] == "peer" and r.get("floor_concurrency"):
                vs_floor += f" [{r['floor_concurrency']}]"
            w(
                f"| {label} | {r['concurrency']} | {r['tasks']:,} | {_f(r['median'])} | "
                f"{_f(r['min'])} | {_f(r['max'])} | {_ratio(r.get('vs_peer'))} | {vs_floor} | "
                f"{_f(c.get('round_trips'), 2)} | {_f(c.get('commands'), 2)} |"
            )
        w("")
        w(
            "Peer versions and configurations: "
            + "; ".join(
                f"{r['label']} {r.get('version', '?')} ({r.get('config', '')})"
                for r in rows
                if r["group"] == "peer"
            )
            + "."
        )
        w("")
        g = goal(rows)
        if g:
            w("### The goal: >= 2x the fastest peer, >= 0.9x the BLMOVE + LREM floor")
            w("")
            w(
                "Ratios of medians decide; the paired ratios (the median over rounds of the ratio "
                "within one round, where both ran minutes apart) show how much the load drifted."
            )
            w("")
            w(
                "| ours | concurrency | median tasks/s | x fastest peer | paired | >= 2x? "
                "| x floor | paired | >= 0.9x? |"
            )
            w("|---|---|---:|---:|---:|:---:|---:|---:|:---:|")
            for x in g:
                w(
                    f"| {x['label']} | {x['concurrency']} | {_f(x['median'])} | "
                    f"{_ratio(x['vs_peer'])} | "
                    f"{_ratio(x['paired_peer'])} | {'yes' if x['peer_ok'] else '**no**'} | "
                    f"{_ratio(x['vs_floor'])} | {_ratio(x['paired_floor'])} | "
                    f"{'yes' if x['floor_ok'] else '**no**'} |"
                )
            w("")
        w("## Commands per task, counted on the server")
        w("")
        w(
            "`CONFIG RESETSTAT` after enqueueing; `INFO all` when the last task completes (so no "
            "enqueueing, idle polling or shutdown is counted; worker start-up is). Round trips are "
            "`total_reads_processed`."
        )
        w("")
        w("| workload | concurrency | RT/task | cmd/task | scripts/task | commands per task |")
        w("|---|---|---:|---:|---:|---|")
        seen: set[tuple[str, str]] = set()
        for r in sorted(rows, key=lambda r: (order[r["group"]], r["label"], r["concurrency"])):
            c = r.get("counts")
            if not c or (r["label"], r["concurrency"]) in seen:
                continue
            seen.add((r["label"], r["concurrency"]))
            top = ", ".join(f"{k} {v:.2f}" for k, v in c["by_command"].items() if v >= 0.01)
            w(
                f"| {r['label']} | {r['concurrency']} | {c['round_trips']:.2f} | "
                f"{c['commands']:.2f} | {c['scripts']:.2f} | {top} |"
            )
        w("")
        ours = next((r for r in rows if r["group"] == "ours" and r.get("counts")), None)
        if ours:
            per = ours["counts"]["by_command"]
            w(
                "Our cycle, per task: "
                + ", ".join(f"`{k.upper()}` {v:.2f}" for k, v in per.items() if v >= 0.5)
                + ". "
                "Commands inside the release script are counted by Redis as commands too; the "
                "script is one request."
            )
            if per.get("time", 0) >= 0.5:
                w(
                    "`TIME` once per task: the processing record's timestamp comes from the "
                    "server's `RedisClock`, which asks Redis, and the worker waits for that reply "
                    "before it can send the record: one more round trip per task (see the "
                    "WallClock diagnostic row, which differs only in that)."
                )
            w("")
    rec = data.get("recovery")
    if rec and rec.get("rows"):
        w("## Recovery cost")
        w("")
        w(
            f"One sweep recovering a dead server's {rec['workers']} "
            "in-flight lists (one task each, "
            f"with processing records) while a live server's {rec['workers']} lists must be left "
            "alone. Ours reads the registry set; the baseline finds the lists with "
            f"`SCAN MATCH <prefix>:inflight:* COUNT {rec['scan_count']}`, then drains them with "
            f"the same steps. Median of {rec.get('reps', '?')} repetitions (min-max)."
        )
        w("")
        w(
            "| unrelated keys | ours, ms | SCAN-based, ms | SCAN / ours | ours RT / cmds "
            "| SCAN RT / cmds |"
        )
        w("|---:|---:|---:|---:|---:|---:|")
        for r in rec["rows"]:
            o, s = r["ours"], r["scan"]
            w(
                f"| {r['unrelated_keys']:,} | {o['median_ms']:.2f} ({o['min_ms']:.2f}-"
                f"{o['max_ms']:.2f}) | {s['median_ms']:.2f} ({s['min_ms']:.2f}-{s['max_ms']:.2f}) "
                f"| {s['median_ms'] / o['median_ms']:.1f}x | {o.get('round_trips', 0):.0f} / "
                f"{o['commands']:.0f} | {s.get('round_trips', 0):.0f} / {s['commands']:.0f} |"
            )
        w("")
    chk = data.get("checker")
    if chk:
        w("## Checker speed")
        w("")
        w("| what | figure |")
        w("|---|---|")
        mc = chk.get("model_check", {})
        if mc.get("status") == "ok":
            w(
                f"| model check (`taskcustody_model.check`, {mc['bounds']}) | "
                f"{mc['per_second']:,.0f} distinct states/s ({mc['states']:,} distinct, "
                f"{mc['generated']:,} generated, in {mc['seconds']:.2f} s; "
                f"{'no violation' if mc.get('ok') else 'VIOLATION'}) |"
            )
        else:
            w(f"| model check | {mc.get('status', 'pending')}: {mc.get('why', '')} |")
        st = chk.get("stateful", {})
        if st.get("status") == "ok":
            for backend, name in (("fakeredis", "fakeredis"), ("redis", "real Redis")):
                b = st[backend]
                w(
                    f"| stateful steps (conformance harness, random walks), {name} | "
                    f"{b['per_second']:,.0f} steps/s ({b['steps']:,} steps in {b['runs']} runs; "
                    f"{b['seconds']:.2f} s stepping, {b['wall_seconds']:.2f} s with set-up) |"
                )
        else:
            w(
                f"| stateful steps (fakeredis, real Redis) | {st.get('status', 'pending')}: "
                f"{st.get('why', '')} |"
            )
        w("")
    prof = data.get("profile")
    if prof:
        w(f"## Where the time goes in our cycle (1 worker, {prof['tasks']:,} tasks)")
        w("")
        w(
            "Step timings (perf_counter around each public step): "
            f"{prof['us_per_task']:.0f} us per "
            "task."
        )
        w("")
        w("| step | us/task | share |")
        w("|---|---:|---:|")
        for k, v in prof["steps_us"].items():
            w(f"| {k} | {v:.1f} | {v / prof['us_per_task'] * 100:.0f}% |")
        w("")
        for cp in (prof.get("cprofile"), prof.get("cprofile_prefetch")):
            if not cp:
                continue
            w(
                f"cProfile, prefetch {cp.get('prefetch', 1)} (own time, "
                f"{cp['profiled_us_per_task']:.0f} us/task under the profiler):"
            )
            w("")
            w("| kind | share of own time |")
            w("|---|---:|")
            for k, v in cp["by_kind_pct"].items():
                w(f"| {k} | {v:.0f}% |")
            w("")
            w("| function | own us/task | cumulative us/task |")
            w("|---|---:|---:|")
            for r in cp["top"]:
                fn = r["function"].replace("|", "\\|")
                w(f"| `{fn}` | {r['own_us']:.1f} | {r['cum_us']:.1f} |")
            w("")
    lat = data.get("latency")
    if lat and lat.get("rows"):
        out.extend(latency_lines(lat, level=2))
    notes = data.get("notes") or []
    if notes:
        w("## Notes")
        w("")
        for n in notes:
            w(f"- {n}")
        w("")
    return "\n".join(out)


def latency_lines(lat: dict[str, Any], level: int = 2) -> list[str]:
    """The latency table (bench/latency.py's results), for latency.md and for latest.md."""
    h = "#" * level
    out = [
        f"{h} Latency: enqueue to the handler's start, at {lat['load']:g} x capacity "
        f"(median of {lat['rounds']} round(s))",
        "",
        "Per configuration and round: its capacity, "
        + (
            f"the lower of a drain's rate ({lat['capacity_tasks']:,} no-op tasks enqueued first, "
            "as the throughput table) and a fed run's (as many sent back to back by the producer "
            "below to the running worker: what producer and worker sustain together on this "
            "machine)"
            if lat.get("capacity_mode", "drain") == "min"
            else f"a drain's rate ({lat['capacity_tasks']:,} no-op tasks enqueued first, as the "
            "throughput table)"
        )
        + ", then a "
        f"producer in a process of its own sends up to {lat['tasks']:,} no-op tasks at a constant "
        f"open-loop rate of {lat['load']:g} x that capacity (a fixed monotonic-clock schedule, at "
        f"most {lat['max_seconds']:g} s) to one worker process, warmed up first. Latency: the "
        "handler's first `time.time()` minus the producer's, taken just before its enqueue call. "
        "p50/p90/p99/max: the median over rounds of each round's nearest-rank quantile. `p99 "
        "sched.`: p99 from the time the schedule meant to send the task (it counts the "
        "producer's own lateness too, `late p99`). Rates: medians over rounds.",
        "",
        "| configuration | concurrency | capacity/s (drain, fed) | rate/s (achieved) | tasks "
        "| p50 ms | p90 ms | p99 ms | max ms | p99 sched. ms | late p99 ms | rounds |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in lat["rows"]:
        label = f"**{r['label']}**" if r["group"] == "ours" else r["label"]
        if not r.get("rounds_counted"):
            out.append(f"| {label} | {r['concurrency']} | - | - | - | - | - | - | - | - | - | 0 |")
            continue
        q, s, lag = r["latency_ms"], r["from_schedule_ms"], r["producer_lag_ms"]
        out.append(
            f"| {label} | {r['concurrency']} | {_f(r['capacity'])} ({_f(r.get('drain_capacity'))}, "
            f"{_f(r.get('fed_capacity'))}) | {_f(r['rate'])} "
            f"({_f(r['achieved_rate'])}) | {_f(r['tasks'])} | {q['p50']:.2f} | {q['p90']:.2f} | "
            f"{q['p99']:.2f} | {q['max']:.1f} | {s['p99']:.2f} | {lag['p99']:.2f} "
            f"| {r['rounds_counted']}/{len(r['runs'])} |"
        )
    out.append("")
    versions = sorted(
        {
            f"{r['system']} {r['version']}"
            for r in lat["rows"]
            if r.get("version") and r["group"] == "peer"
        }
    )
    out += [
        "Concurrency: one worker process everywhere and one handling thread, except the dramatiq "
        "row that repeats its throughput configuration (8 threads). Ours runs `Server(..., "
        "workers=1)` with `Settings()` or `Settings(prefetch=8)` (its capacity drain uses "
        "bench/drivers.py's settings, which differ only in the idle block timeout); dramatiq "
        "polls an empty queue with a backoff of 5 ms doubling up to its `worker_timeout` "
        "(100 ms, as in the throughput bench; its default is 1 s) and prefetches 2 messages per "
        "thread; the BLPOP floor is one redis-py `BLPOP` loop (no custody)."
        + (f" Versions: {'; '.join(versions)}." if versions else ""),
        "",
        "Producer, worker and redis-server share the machine's cores, so a drain (no producer "
        "running) can overstate what a worker sustains beside a producer: hence the fed run, "
        "and the lower of the two. An `achieved` rate below the `rate`, or a `p99 sched.` far "
        "above `p99`, says that the producer, not the worker, fell behind.",
        "",
    ]
    for f in lat.get("failures") or []:
        out.append(f"- not counted: {f}")
    if lat.get("failures"):
        out.append("")
    return out


def summary(data: dict[str, Any]) -> str:
    """The short form: one table, the goal, recovery, and where the figures are."""
    meta = data["meta"]
    rows: list[dict[str, Any]] = data.get("throughput", [])
    out: list[str] = []
    w = out.append
    w(
        f"Latest run: {meta['date']}, `{meta['command']}`, {meta['cpus']} cores shared with "
        f"Redis {meta['redis_version']} (load average {meta['load_before'].split()[0]} at the "
        f"start), {meta['tasks']:,} no-op tasks, median of {meta['rounds']} round(s). Full tables: "
        "[bench/results/latest.md](bench/results/latest.md)."
    )
    w("")
    w("![throughput and recovery cost](bench/results/latest.png)")
    w("")
    if rows:
        w(
            "| workload | concurrency | tasks/s (median) | x fastest peer | x BLMOVE+LREM floor "
            "| round trips/task | commands/task |"
        )
        w("|---|---|---:|---:|---:|---:|---:|")
        order = {"ours": 0, "diag": 1, "floor": 2, "peer": 3}
        for r in sorted(rows, key=lambda r: (order[r["group"]], -r["median"])):
            if r["group"] == "diag":
                continue
            c = r.get("counts") or {}
            label = f"**{r['label']}**" if r["group"] == "ours" else r["label"]
            w(
                f"| {label} | {r['concurrency']} | {_f(r['median'])} | "
                f"{_ratio(r.get('vs_peer'))} | {_ratio(r.get('vs_floor'))} | "
                f"{_f(c.get('round_trips'), 1)} | {_f(c.get('commands'), 1)} |"
            )
        w("")
    lat = data.get("latency")
    if lat and lat.get("rows"):
        parts = [
            f"{r['key']} {r['latency_ms']['p50']:.2f} / {r['latency_ms']['p99']:.2f} ms"
            for r in lat["rows"]
            if r.get("rounds_counted")
        ]
        w(
            f"Latency from enqueue to the handler's start at {lat['load']:g} x capacity, one "
            "worker process, p50 / p99 (dramatiq: 1 thread, dramatiq-8: 8 threads): "
            + "; ".join(parts)
            + ". Table: [bench/results/latest.md](bench/results/latest.md)."
        )
        w("")
    rec = data.get("recovery")
    if rec and rec.get("rows"):
        parts = [
            f"{r['unrelated_keys']:,} keys: {r['ours']['median_ms']:.1f} ms "
            f"(SCAN-based: {r['scan']['median_ms']:.1f} ms)"
            for r in rec["rows"]
        ]
        w("Recovering a dead server's in-flight lists: " + "; ".join(parts) + ".")
        w("")
    return "\n".join(out)
