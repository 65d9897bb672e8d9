"""Draw bench/results/latest.png from latest.json. Standalone: runs under whichever Python has
matplotlib (the benchmark's own bench/.venvs/chart if the main environment lacks it).

    python bench/chart.py RESULTS.json OUT.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"ours": "#1f77b4", "diag": "#aec7e8", "floor": "#7f7f7f", "peer": "#ff7f0e"}


def main(src: str, dst: str) -> None:
    with open(src) as fh:
        data = json.load(fh)
    rows = data.get("throughput", [])
    recovery = data.get("recovery", {}).get("rows", [])
    latency = data.get("latency", {}).get("rows", [])
    fig, axes = plt.subplots(1, 3, figsize=(21, 6.5), gridspec_kw={"width_ratios": [2.2, 1.1, 1]})
    ax = axes[0]
    if rows:
        rows = sorted(rows, key=lambda r: r["median"])
        labels = [f"{r['label']} [{r['concurrency']}]" for r in rows]
        medians = [r["median"] for r in rows]
        lo = [r["median"] - r["min"] for r in rows]
        hi = [r["max"] - r["median"] for r in rows]
        ax.barh(labels, medians, xerr=[lo, hi], color=[COLORS[r["group"]] for r in rows], capsize=3)
        for y, r in enumerate(rows):
            ax.text(r["max"], y, f"  {r['median']:,.0f}", va="center", fontsize=8)
        ax.set_xlabel("tasks/s (median; whiskers: min and max over rounds)")
        ax.tick_params(axis="y", labelsize=8)
        meta = data.get("meta", {})
        ax.set_title(
            f"Throughput, {meta.get('tasks', '?'):,} no-op tasks, "
            f"{meta.get('rounds', '?')} round(s), {meta.get('cpus', '?')} cores"
            f"{' (quick)' if meta.get('quick') else ''}"
            f"{', machine loaded by other work' if meta.get('loaded_note') else ''}",
            fontsize=10,
        )
        peers = [r["median"] for r in rows if r["group"] == "peer"]
        if peers:
            ax.axvline(2 * max(peers), color=COLORS["peer"], linestyle="--", linewidth=1)
            ax.text(
                2 * max(peers),
                len(rows) - 0.4,
                " 2x fastest peer",
                color=COLORS["peer"],
                fontsize=8,
                va="top",
            )
        names = {
            "ours": "taskcustody (full cycle)",
            "diag": "taskcustody, diagnostic variant",
            "floor": "raw redis-py floor",
            "peer": "peer",
        }
        present = [g for g in names if any(r["group"] == g for r in rows)]
        handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[g]) for g in present]
        ax.legend(handles, [names[g] for g in present], loc="lower right", fontsize=8)
    ax = axes[1]
    if latency:
        # enqueue to the handler's start at half of each configuration's capacity: p50 and p99
        order = sorted(latency, key=lambda r: r["latency_ms"]["p99"], reverse=True)
        ys = range(len(order))
        p50 = [r["latency_ms"]["p50"] for r in order]
        p99 = [r["latency_ms"]["p99"] for r in order]
        ax.barh(
            [y + 0.2 for y in ys],
            p99,
            height=0.4,
            label="p99",
            color=[COLORS[r["group"]] for r in order],
        )
        ax.barh(
            [y - 0.2 for y in ys],
            p50,
            height=0.4,
            label="p50",
            color=[COLORS[r["group"]] for r in order],
            alpha=0.45,
        )
        for y, a, b in zip(ys, p50, p99, strict=True):
            ax.text(b, y + 0.2, f" {b:.2f}", va="center", fontsize=7)
            ax.text(a, y - 0.2, f" {a:.2f}", va="center", fontsize=7)
        ax.set_yticks(list(ys))
        ax.set_yticklabels(
            [f"{r['label']}\n[{r['concurrency']}] @ {r['rate']:,.0f}/s" for r in order], fontsize=7
        )
        ax.set_xscale("log")
        ax.set_xlabel("ms from enqueue to the handler's start (p50 light, p99 dark)")
        ax.set_title("Latency at half load", fontsize=10)
    ax = axes[2]
    if recovery:
        xs = [max(r["unrelated_keys"], 1) for r in recovery]
        for name, label, color in (
            ("ours", "taskcustody (registry set)", COLORS["ours"]),
            ("scan", "SCAN-based recovery", COLORS["peer"]),
        ):
            ys = [r[name]["median_ms"] for r in recovery]
            ax.plot(xs, ys, marker="o", label=label, color=color)
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(
                    f"{y:.1f} ms", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8
                )
        ax.set_xscale("symlog", linthresh=1000)
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{r['unrelated_keys']:,}" for r in recovery], fontsize=8)
        ax.set_xlabel("unrelated keys in the database")
        ax.set_ylabel("ms to recover a dead server's in-flight lists (median)")
        ax.set_title("Recovery cost", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
