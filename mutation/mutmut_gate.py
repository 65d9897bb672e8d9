"""mutmut over the core modules, and a gate that reads every verdict.

mutmut runs in a throwaway copy of the tree, from an empty `mutants/` (its verdicts are cached
there, so a reused directory would report stale results), with the `[tool.mutmut]` settings of
pyproject.toml and HYPOTHESIS_PROFILE=mutation. `mutmut run` exits 0 even when mutants survive,
so the gate reads `mutants/**/*.meta` (exit_code_by_key) itself and fails on:

- a surviving (or untested) mutant in a critical function of the protocol (CRITICAL below) that is
  not a reviewed equivalent (mutation/equivalents.py);
- a critical function that got no mutants at all (a decorator or another shape mutmut skips
  silently), or that no longer exists;
- any mutant left unchecked (no verdict, interrupted, suspicious, segfault);
- a score over the core modules below 90 %: (killed + timeouts) / (all - reviewed equivalents).

An equivalent mutant is recorded with its function, the original line and the exact mutated line:
an edit to either line makes the record stop matching, and the mutant counts as a survivor again
until someone reviews it afresh.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCORE_FLOOR = 90.0
# Wall-clock seconds one test may run under a mutant (tests/conftest.py fails it after that):
# mutmut's own limit is CPU time, which a test blocked on a reply never uses.
TEST_TIMEOUT = 60.0

# The protocol's critical functions: take, record, release, reconcile, drain, the sweeps, startup.
CRITICAL: dict[str, tuple[str, ...]] = {
    "taskcustody.core.worker": (
        "Worker.register",
        "Worker.reconcile",
        "Worker.take",
        "Worker.record",
        "Worker.release",
        "Worker.run_once",
        "Worker._release_raw",
        "Worker._send_release",
        "Worker._redirected",
        "Worker.release_and_take",
        "Worker._release_and_take_raw",
    ),
    "taskcustody.core.custody": (
        "Custody._take_args",
        "Custody.verdict",
        "Custody.release_args",
        "Custody.released",
    ),
    "taskcustody.core.recovery": (
        "prune_inactive_servers",
        "drain_inflight",
        "live_owners",
        "registered_lists",
        "recover_inflight",
        "sweep",
        "parse_record",
        "requeue_stuck_processing_tasks",
    ),
    "taskcustody.core.prefetch": (
        "PrefetchingWorker.take_all",
        "PrefetchingWorker.handle",
        "PrefetchingWorker.release_all",
        "PrefetchingWorker.run_once",
    ),
    "taskcustody.core.server": (
        "Server.claim",
        "Server.startup_drain",
        "Server.sweep",
        "Server.requeue_stuck_processing_tasks",
        "Server.start",
    ),
}

STATUS = {
    1: "killed",
    3: "killed",
    37: "killed",  # 37: caught by the type checker
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
}


@dataclass
class Verdict:
    key: str
    module: str
    function: str  # "Class.method" or "function"
    status: str  # killed | timeout | survived | no tests | skipped | unchecked
    exit_code: int | None
    original: str = ""
    mutated: str = ""
    equivalent: str = ""  # the reviewed reason, when it matches

    @property
    def critical(self) -> bool:
        return self.function in CRITICAL.get(self.module, ())


def parse_key(key: str) -> tuple[str, str]:
    """`taskcustody.core.worker.xǁWorkerǁtake__mutmut_3`
    -> ("taskcustody.core.worker", "Worker.take")."""
    name = key.rsplit("__mutmut_", 1)[0]
    module, _, mangled = name.rpartition(".")
    if mangled.startswith("xǁ"):
        _, cls, method = mangled.split("ǁ", 2)
        return module, f"{cls}.{method}"
    return module, mangled.removeprefix("x_")


def mangled_name(key: str) -> tuple[str, str]:
    """The mutant's function name in the mutated file, and its original's."""
    name, number = key.rsplit("__mutmut_", 1)
    mangled = name.rpartition(".")[2]
    return f"{mangled}__mutmut_{number}", f"{mangled}__mutmut_orig"


def _functions(tree: ast.Module, source: list[str]) -> dict[str, list[str]]:
    """Each mutant function's lines, its own name in the def line replaced by a placeholder (so
    that a mutated default argument shows up, and the names themselves do not)."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name:
            end = node.end_lineno or node.lineno
            lines = source[node.lineno - 1 : end]
            lines[0] = lines[0].replace(node.name, "<function>", 1)
            out[node.name] = lines
    return out


def changed_lines(mutants_dir: Path, verdicts: list[Verdict]) -> None:
    """Fill in each verdict's original and mutated line, from the mutated source file."""
    by_module: dict[str, list[Verdict]] = {}
    for v in verdicts:
        by_module.setdefault(v.module, []).append(v)
    for module, vs in by_module.items():
        path = mutants_dir / "src" / Path(*module.split(".")).with_suffix(".py")
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        functions = _functions(ast.parse(text), text.splitlines())
        for v in vs:
            name, orig = mangled_name(v.key)
            a, b = functions.get(orig, []), functions.get(name, [])
            diff = list(difflib.ndiff(a, b))
            v.original = "\n".join(x[2:].rstrip() for x in diff if x.startswith("- "))
            v.mutated = "\n".join(x[2:].rstrip() for x in diff if x.startswith("+ "))


def read_verdicts(mutants_dir: Path) -> list[Verdict]:
    verdicts = []
    for meta in sorted(mutants_dir.glob("**/*.meta")):
        data = json.loads(meta.read_text(encoding="utf-8"))
        for key, code in data.get("exit_code_by_key", {}).items():
            module, function = parse_key(key)
            status = "unchecked" if code is None else STATUS.get(code, "unchecked")
            verdicts.append(Verdict(key, module, function, status, code))
    return verdicts


def load_equivalents() -> list[dict[str, str]]:
    from mutation.equivalents import EQUIVALENTS

    return list(EQUIVALENTS)


def apply_equivalents(verdicts: list[Verdict], reviewed: list[dict[str, str]]) -> list[str]:
    """Mark survivors whose (function, original line, mutated line) was reviewed. Returns the
    reviews that matched no survivor (stale: the line changed, or the mutant is killed now)."""
    index = {(r["function"], r["original"].strip(), r["mutated"].strip()): r for r in reviewed}
    used = set()
    for v in verdicts:
        if v.status not in ("survived", "no tests"):
            continue
        k = (f"{v.module}.{v.function}", v.original.strip(), v.mutated.strip())
        if k in index:
            v.equivalent = index[k]["reason"]
            used.add(k)
    return [f"{k[0]}: {k[2]!r}" for k in index if k not in used]


def check_shapes(verdicts: list[Verdict], src: Path) -> list[str]:
    """Every critical function exists, has no decorator mutmut skips, and got mutants."""
    problems = []
    seen = Counter((v.module, v.function) for v in verdicts)
    for module, functions in CRITICAL.items():
        path = src / Path(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defs[node.name] = node
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        defs[f"{node.name}.{item.name}"] = item
        for function in functions:
            node = defs.get(function)
            if node is None:
                problems.append(f"{module}.{function}: no such function (update CRITICAL)")
                continue
            names = [ast.unparse(d) for d in node.decorator_list]
            if any(n not in ("staticmethod", "classmethod") for n in names) or len(names) > 1:
                problems.append(
                    f"{module}.{function}: decorated ({', '.join(names)}): mutmut skips it silently"
                )
            elif not seen[(module, function)]:
                problems.append(f"{module}.{function}: mutmut made no mutants of it")
    return problems


def skipped_shapes(src: Path) -> list[str]:
    """Functions of the mutated modules that mutmut skips silently (decorated, not critical):
    listed so that nothing is skipped without anyone seeing it."""
    out = []
    for path in sorted(src.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names = [ast.unparse(d) for d in item.decorator_list]
                        if names and names not in (["staticmethod"], ["classmethod"]):
                            out.append(f"{path.stem}.{node.name}.{item.name} (@{names[0]})")
    return out


def run_mutmut(copy: Path, jobs: int) -> float:
    shutil.rmtree(copy / "mutants", ignore_errors=True)
    env = dict(
        os.environ,
        HYPOTHESIS_PROFILE="mutation",
        PYTHONDONTWRITEBYTECODE="1",
        TASKCUSTODY_TEST_TIMEOUT=str(TEST_TIMEOUT),
    )
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    with open(copy / "mutmut-run.log", "w", encoding="utf-8") as log:
        subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)],
            cwd=copy,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    return time.monotonic() - started


def summarize(verdicts: list[Verdict]) -> dict[str, float]:
    counts = Counter(v.status for v in verdicts)
    equivalent = sum(1 for v in verdicts if v.equivalent)
    total = len(verdicts)
    caught = counts["killed"] + counts["timeout"]
    denominator = total - equivalent
    return {
        "total": total,
        "killed": counts["killed"],
        "timeout": counts["timeout"],
        "survived": counts["survived"]
        - sum(1 for v in verdicts if v.equivalent and v.status == "survived"),
        "no tests": counts["no tests"]
        - sum(1 for v in verdicts if v.equivalent and v.status == "no tests"),
        "skipped": counts["skipped"],
        "unchecked": counts["unchecked"],
        "equivalent": equivalent,
        "score": 100.0 * caught / denominator if denominator else 0.0,
    }


def report(copy: Path, verdicts: list[Verdict], seconds: float, verbose: bool) -> bool:
    mutants_dir = copy / "mutants"
    changed_lines(mutants_dir, [v for v in verdicts if v.status != "killed"])
    stale_reviews = apply_equivalents(verdicts, load_equivalents())
    shapes = check_shapes(verdicts, copy / "src") if verdicts else ["mutmut produced no verdicts"]
    stats = summarize(verdicts)
    critical = [
        v
        for v in verdicts
        if v.critical and v.status in ("survived", "no tests", "skipped") and not v.equivalent
    ]
    unchecked = [v for v in verdicts if v.status == "unchecked"]

    print(
        f"mutmut: {stats['total']} mutants in {seconds / 60:.1f} min: "
        f"{stats['killed']} killed, {stats['timeout']} timeouts, {stats['survived']} survived, "
        f"{stats['no tests']} no tests, {stats['equivalent']} reviewed equivalent, "
        f"{stats['skipped']} skipped, {stats['unchecked']} unchecked; "
        f"score {stats['score']:.1f} % (floor {SCORE_FLOOR:g} %)"
    )
    per_module: dict[str, Counter[str]] = {}
    for v in verdicts:
        per_module.setdefault(v.module, Counter())["equivalent" if v.equivalent else v.status] += 1
    print(
        f"  {'module':28} {'total':>5} {'killed':>6} {'timeout':>7} {'surv.':>5} "
        f"{'no tests':>8} {'equiv.':>6}"
    )
    for module, c in sorted(per_module.items()):
        print(
            f"  {module:28} {sum(c.values()):5} {c['killed']:6} {c['timeout']:7} "
            f"{c['survived']:5} {c['no tests']:8} {c['equivalent']:6}"
        )
    eq = [v for v in verdicts if v.equivalent]
    if eq:
        print("  reviewed equivalents:")
        for v in eq:
            print(f"    {v.module}.{v.function}: {v.mutated.strip()!r}  -- {v.equivalent}")
    for s in skipped_shapes(copy / "src" / "taskcustody"):
        if verbose:
            print(f"  note: mutmut skips {s} (decorated)")
    ok = True
    if shapes:
        ok = False
        for s in shapes:
            print(f"  FAIL shape: {s}")
    if critical:
        ok = False
        print(f"  FAIL: {len(critical)} surviving mutant(s) in critical functions:")
        for v in critical:
            print(
                f"    {v.key} [{v.status}]\n      - {v.original.strip()}\n"
                f"      + {v.mutated.strip()}"
            )
    if unchecked:
        ok = False
        print(
            f"  FAIL: {len(unchecked)} mutant(s) left unchecked: {[v.key for v in unchecked][:10]}"
        )
    if stats["score"] < SCORE_FLOOR:
        ok = False
        print(f"  FAIL: score {stats['score']:.1f} % is below {SCORE_FLOOR:g} %")
    if stale_reviews:
        print(
            f"  note: {len(stale_reviews)} equivalence review(s) matched no survivor (the line "
            f"changed or the mutant is killed now): {stale_reviews}"
        )
    if verbose:
        others = [
            v
            for v in verdicts
            if v.status in ("survived", "no tests") and not v.critical and not v.equivalent
        ]
        print(f"  other survivors ({len(others)}):")
        for v in others:
            print(f"    {v.key} [{v.status}]: {v.mutated.strip()}")
    (copy / "mutmut-verdicts.json").write_text(
        json.dumps(
            {
                "stats": stats,
                "seconds": seconds,
                "verdicts": [v.__dict__ | {"critical": v.critical} for v in verdicts],
            },
            indent=1,
        ),
        encoding="utf-8",
    )
    print(f"mutmut gate: {'PASS' if ok else 'FAIL'}")
    return ok


def mutmut_gate(
    workdir: Path, jobs: int, verbose: bool, snapshot: Path | None = None, reuse: Path | None = None
) -> bool:
    """Copy the tree (or `snapshot`), run mutmut there from an empty mutants/, read the verdicts.
    `reuse`: read the verdicts of an earlier run in that copy instead (for reviewing)."""
    from mutation.gate import make_copy

    if reuse is not None:
        copy, seconds = reuse, 0.0
    else:
        copy = workdir / "tree"
        shutil.rmtree(copy, ignore_errors=True)
        if snapshot is not None:
            shutil.copytree(snapshot, copy, symlinks=True)
        else:
            make_copy(copy)
        # mutmut needs neither the top-level links nor the gate itself in its copy.
        for link in ("taskcustody", "taskcustody_model"):
            if (copy / link).is_symlink():
                (copy / link).unlink()
        print(f"== mutmut: running in {copy} with --max-children {jobs}", flush=True)
        seconds = run_mutmut(copy, jobs)
    verdicts = read_verdicts(copy / "mutants")
    return report(copy, verdicts, seconds, verbose)
