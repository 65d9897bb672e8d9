"""The mutation gate: `python -m mutation.gate [--named-only | --mutmut-only]`.

Named mutants (mutation/named.py): each is applied to a throwaway copy of the tree, and the whole
test suite runs there (HYPOTHESIS_PROFILE=mutation). The gate fails when the suite is red on the
unmutated copy, when an anchor is stale (not found exactly once), when a mutant survives, or when a
reviewed-equivalent mutant is killed or its review is stale.

mutmut (mutation/mutmut_gate.py): the core modules, from an empty mutants/ in another copy; the
gate reads every verdict (see that module).

Nothing here writes to the working tree: other people run their tests on it meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mutation.named import MUTANTS, NamedMutant

ROOT = Path(__file__).resolve().parent.parent

# What a copy needs to run the suite (and mutmut): the sources, the model, the tests, the config.
COPIED = ("src", "model", "tests", "mutation", "pyproject.toml", "conftest.py")
IGNORED = shutil.ignore_patterns(
    "__pycache__",
    "*.pyc",
    ".hypothesis",
    ".pytest_cache",
    "mutants",
    "*.egg-info",
    ".mypy_cache",
    ".ruff_cache",
)


# -- copies of the tree -----------------------------------------------------------------------


def make_copy(dest: Path, root: Path = ROOT) -> Path:
    """Copy what the suite needs into `dest`. Links `taskcustody` and `taskcustody_model` at the
    copy's top level as well, so that child processes started by tests with PYTHONPATH=<root>
    (the end-to-end test) import the copy's (mutated) code, not the installed one."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=IGNORED, symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    for link, target in (
        ("taskcustody", "src/taskcustody"),
        ("taskcustody_model", "model/taskcustody_model"),
    ):
        if (dest / target).is_dir() and not (dest / link).exists():
            (dest / link).symlink_to(target, target_is_directory=True)
    return dest


def copy_env(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(copy / "src"), str(copy / "model"), str(copy)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["HYPOTHESIS_PROFILE"] = "mutation"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_from(copy: Path) -> None:
    """The installed package is an editable install of the working tree: make sure the copy's
    code, not the tree's, is what a run in the copy imports."""
    probe = (
        "import taskcustody, taskcustody_model; "
        "print(list(taskcustody.__path__)[0]); print(list(taskcustody_model.__path__)[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=copy,
        env=copy_env(copy),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for path in out:
        if not Path(path).resolve().is_relative_to(copy.resolve()):
            raise SystemExit(f"gate: a run in {copy} imports {path}, not the copy's code")


# -- applying named mutants -------------------------------------------------------------------


class Stale(Exception):
    """An anchor or a pinned line no longer occurs exactly once."""


def apply_edits(mutant: NamedMutant, read: Callable[[str], str]) -> dict[str, str]:
    """The mutated text of every file the mutant touches. Raises Stale."""
    texts: dict[str, str] = {}
    for edit in mutant.edits:
        text = texts.get(edit.path)
        if text is None:
            text = read(edit.path)
        count = text.count(edit.anchor)
        if count != 1:
            raise Stale(
                f"{mutant.name}: anchor found {count} times in {edit.path} "
                f"(must be exactly once):\n{edit.anchor}"
            )
        texts[edit.path] = text.replace(edit.anchor, edit.replacement)
    if mutant.equivalence is not None:
        for path, line in mutant.equivalence.pinned:
            count = read(path).count(line)
            if count != 1:
                raise Stale(
                    f"{mutant.name}: the equivalence review rests on a line found "
                    f"{count} times in {path}; re-review it:\n{line}"
                )
    return texts


def check_syntax(path: str, text: str) -> None:
    """A mutant must be a program that runs: a syntax error would be a fake kill. A Python file
    must compile; a Lua file (a script of lua/, or a fragment of lua/lib/) must load on its own.
    `check_scripts` then loads the scripts as Redis is sent them."""
    if not path.endswith(".lua"):
        compile(text, path, "exec")
        return
    _load_lua(path, text)


def _load_lua(name: str, text: str) -> None:
    try:
        import lupa
    except ImportError:  # pragma: no cover - lupa is in the verify extra
        return
    loaded = lupa.LuaRuntime().eval("load")(text)
    fn, err = loaded if isinstance(loaded, tuple) else (loaded, None)
    if fn is None:
        raise SyntaxError(f"Lua {name} does not compile: {err}")


def scripts_module(lua_file: Path) -> Path:
    """The scripts.py that loads `lua_file`: next to the `lua` directory that holds it."""
    for parent in lua_file.parents:
        if parent.name == "lua":
            return parent.with_name("scripts.py")
    raise ValueError(f"{lua_file} is not under a lua/ directory")


def check_scripts(module: Path) -> None:
    """Every script that `module` (a scripts.py, in a copy of the tree) loads must compile as it
    is sent: composed with its fragments (a fragment that compiles on its own may not in place,
    e.g. one ending with a `return`), without its comments. Raises SyntaxError. The module is
    loaded from its file, under a name of its own, so the copy's Lua is what it reads."""
    import importlib.util

    name = f"_mutation_gate_scripts_{abs(hash(str(module)))}"
    spec = importlib.util.spec_from_file_location(name, module)
    if spec is None or spec.loader is None:
        raise SyntaxError(f"cannot load {module}")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # (a dataclass looks its module up while it is defined)
    try:
        spec.loader.exec_module(loaded)
    except (OSError, ValueError) as exc:
        raise SyntaxError(f"{module} cannot load its Lua: {exc}") from exc
    finally:
        del sys.modules[name]
    lua_scripts = getattr(loaded, "LUA", None)
    if not isinstance(lua_scripts, dict):
        raise SyntaxError(f"{module}: no LUA table of its Lua scripts")
    for script, source in lua_scripts.items():
        _load_lua(f"script {script}", source)


# -- running the suite ------------------------------------------------------------------------

#: What the named-mutant runs leave out unless --full-suite: the searches for the broken designs
#: (they check the machine against the demonstrations, verify/broken.py) and the tests of how
#: results are presented. See `named_gate`.
PRESENTATION_TESTS = (
    "tests/stateful/test_finds_broken_designs.py",
    "tests/test_verify_pytest_plugin.py",
    "tests/test_verify_report_page.py",
    "tests/test_verify_junit.py",
    "tests/test_verify_budget.py",
    "tests/test_narrate.py",
    "tests/test_docs_guide.py",
    "tests/test_bench_audit.py",
)

LIMITS = "test-limits.json"  # per-test limits for the mutant runs, next to their copies

#: The tests that caught each named mutant in the run that recorded them (`--record-killers`):
#: a mutant's run starts with them (`--mutation-first`), so with -x it ends at its killer instead
#: of after every test before it. Only an order: a recorded test that no longer catches its
#: mutant runs, passes, and the rest of the suite follows as without the file; a survivor still
#: runs the whole suite. So a stale file can make the gate slower, never change a verdict
#: (tests/test_mutation_gate_killers.py).
KILLERS = "mutation/killers.json"


def load_killers(root: Path) -> dict[str, list[str]]:
    path = root / KILLERS
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {str(name): [str(test) for test in tests] for name, tests in data.items()}


def record_killers(root: Path, results: Sequence[NamedResult]) -> None:
    """Write the first test that caught each killed mutant into `root`/KILLERS (the others'
    entries are kept)."""
    killers = load_killers(root)
    for r in results:
        if r.verdict == "killed" and r.caught_by:
            killers[r.mutant.name] = [r.caught_by[0]["test"]]
    (root / KILLERS).write_text(
        json.dumps(dict(sorted(killers.items())), indent=1) + "\n", encoding="utf-8"
    )


#: The per-test limits of the last recorded unmutated run (`--record-killers`), for a run that
#: skips the unmutated run (`--confirm-kills`).
RECORDED_LIMITS = "mutation/test-limits.json"


def load_recorded_limits(root: Path) -> dict[str, float]:
    path = root / RECORDED_LIMITS
    if not path.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text(encoding="utf-8")).items()}


def confirm_kills(
    base: Path,
    results: Sequence[NamedResult],
    test_timeout: float,
    suite_timeout: float,
    pytest_args: Sequence[str],
    jobs: int,
) -> bool:
    """Run, on the unmutated copy `base`, every test that was a mutant's first failure: each must
    pass there, or that kill proves nothing (the test fails without the mutant too). With
    `--confirm-kills` this replaces the run of the whole suite on the unmutated copy: a kill
    counts only once its test is confirmed, and a survivor needs no baseline (it passed the
    whole suite with the mutant in)."""
    tests = sorted(
        {r.caught_by[0]["test"] for r in results if r.verdict == "killed" and r.caught_by}
    )
    if not tests:
        return True
    run = run_suite(
        base,
        test_timeout,
        suite_timeout,
        [*pytest_args, *tests],
        workers=jobs if len(tests) > 1 else 0,
    )
    failed = sorted({f["test"] for f in run.failures})
    if run.returncode != 0 or run.hung:
        print(
            f"named mutants: FAIL: tests that killed mutants fail on the unmutated copy too "
            f"(exit {run.returncode}): {failed[:10]}; log: {run.log}"
        )
        print(_tail(run.log))
        return False
    print(
        f"   confirmed: the {len(tests)} tests that caught the mutants pass on the unmutated "
        f"copy ({run.seconds:.1f} s)",
        flush=True,
    )
    return True


def killers_moved(results: Sequence[NamedResult], killers: dict[str, list[str]]) -> list[str]:
    """The killed mutants whose first failure is not a recorded killer: the file is stale there
    (the run was slower than it needed to be; the verdict stands)."""
    return [
        r.mutant.name
        for r in results
        if r.verdict == "killed"
        and r.caught_by
        and r.caught_by[0]["test"] not in killers.get(r.mutant.name, [])
    ]


@dataclass
class SuiteRun:
    returncode: int
    failures: list[dict[str, str]]
    seconds: float
    log: Path
    hung: bool = False
    durations: dict[str, float] = field(default_factory=dict)

    @property
    def test_failures(self) -> list[dict[str, str]]:
        return [f for f in self.failures if f["when"] != "collect"]


def run_suite(
    copy: Path,
    test_timeout: float,
    suite_timeout: float,
    pytest_args: Sequence[str] = (),
    first_failure: bool = False,
    workers: int = 0,
    first: Sequence[str] = (),
) -> SuiteRun:
    """One pytest run in `copy`; `workers` > 1: on that many pytest-xdist workers (the failures
    and durations are the controller's, which sees every worker's reports)."""
    report = copy / ".mutation-report.json"
    log = copy / ".mutation-pytest.log"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "mutation.pytest_plugin",
        "-p",
        "no:cacheprovider",
        "--hypothesis-profile=mutation",
        f"--mutation-report={report}",
        f"--mutation-test-timeout={test_timeout:g}",
        "-q",
        "--no-header",
        "-rN",
        *([f"--mutation-limits={copy.parent / LIMITS}"] if (copy.parent / LIMITS).exists() else []),
        # The anchor check reads the source text: under a mutant it fails by construction, a
        # fake kill that would hide whether the real tests catch the mutant.
        "--ignore=tests/test_named_mutant_anchors.py",
        *(["-x"] if first_failure else []),
        *(f"--mutation-first={test}" for test in first),
        *(["-n", str(workers)] if workers > 1 else []),
        *pytest_args,
    ]
    started = time.monotonic()
    hung = False
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=copy,
            env=copy_env(copy),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=suite_timeout)
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(proc.pid, 9)
            rc = proc.wait()
    seconds = time.monotonic() - started
    failures: list[dict[str, str]] = []
    durations: dict[str, float] = {}
    if report.exists():
        data = json.loads(report.read_text(encoding="utf-8"))
        failures, durations = data["failures"], data.get("durations", {})
    return SuiteRun(rc, failures, seconds, log, hung, durations)


# -- the named-mutant gate --------------------------------------------------------------------


@dataclass
class NamedResult:
    mutant: NamedMutant
    verdict: str  # killed | SURVIVED | equivalent | STALE | ERROR | KILLED-BUT-REVIEWED
    ok: bool
    caught_by: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    detail: str = ""


def clone(snapshot: Path, dest: Path) -> Path:
    shutil.copytree(snapshot, dest, symlinks=True)
    return dest


def run_named(
    snapshot: Path,
    workdir: Path,
    mutant: NamedMutant,
    test_timeout: float,
    suite_timeout: float,
    pytest_args: Sequence[str],
    all_killers: bool = False,
    first: Sequence[str] = (),
) -> NamedResult:
    try:
        texts = apply_edits(mutant, lambda p: (snapshot / p).read_text(encoding="utf-8"))
        for path, text in texts.items():
            check_syntax(path, text)
    except Stale as exc:
        return NamedResult(mutant, "STALE", False, detail=str(exc))
    except SyntaxError as exc:
        return NamedResult(mutant, "ERROR", False, detail=f"the rewrite does not compile: {exc}")
    copy = clone(snapshot, workdir / mutant.name)
    for path, text in texts.items():
        (copy / path).write_text(text, encoding="utf-8")
    try:
        for module in sorted({scripts_module(copy / p) for p in texts if p.endswith(".lua")}):
            check_scripts(module)
    except SyntaxError as exc:
        return NamedResult(mutant, "ERROR", False, detail=f"the rewrite does not compile: {exc}")
    run = run_suite(
        copy, test_timeout, suite_timeout, pytest_args, first_failure=not all_killers, first=first
    )
    killers = run.test_failures
    if run.hung:
        verdict, ok = "killed", mutant.equivalence is None
        detail = f"the suite hung past {suite_timeout:g} s"
    elif run.returncode == 0:
        if mutant.equivalence is not None:
            verdict, ok, detail = "equivalent", True, mutant.equivalence.reason
        else:
            verdict, ok, detail = "SURVIVED", False, "the whole suite passed with this mutant"
    elif killers and run.returncode == 1:
        verdict, ok, detail = "killed", True, ""
        if mutant.equivalence is not None:
            verdict, ok = "KILLED-BUT-REVIEWED", False
            detail = "reviewed as equivalent, but the suite kills it: re-review"
    else:
        verdict, ok = "ERROR", False
        detail = (
            f"pytest exit {run.returncode} without a failing test (collection or usage "
            f"error?): see {run.log}"
        )
    return NamedResult(mutant, verdict, ok, killers, run.seconds, detail)


_IMPORTS_CORE = re.compile(
    r"^\s*(from|import)\s+taskcustody(?!\.verify\.designs\b)(\.|\s|$)", re.MULTILINE
)
#: The designs table: data about the model's variants, which the model's tests read. It imports
#: only the model (checked below), so no named mutant can change what it holds.
DESIGNS_TABLE = "src/taskcustody/verify/designs.py"


def independent_of_core(snapshot: Path, folders: Sequence[str]) -> bool:
    """True when no Python file under `folders` imports the `taskcustody` package, the designs
    table aside (itself importing nothing of `taskcustody`): then no named mutant (they all edit
    src/taskcustody) can change what those tests see."""
    files = [path for folder in folders for path in (snapshot / folder).rglob("*.py")]
    files.append(snapshot / DESIGNS_TABLE)
    return not any(_IMPORTS_CORE.search(path.read_text(encoding="utf-8")) for path in files)


def named_gate(
    snapshot: Path,
    workdir: Path,
    jobs: int,
    test_timeout: float,
    suite_timeout: float,
    pytest_args: Sequence[str],
    verbose: bool,
    all_killers: bool = False,
    with_model_tests: bool = False,
    only: Sequence[str] = (),
    full_suite: bool = False,
    record: bool = False,
    confirm_only: bool = False,
) -> bool:
    """`snapshot`: one copy of the tree taken at the start, so that every run (the unmutated one
    and each mutant's) sees the same code and tests while people keep editing the tree. `only`:
    the names of the mutants to run (default: all)."""
    unknown = sorted(set(only) - {m.name for m in MUTANTS})
    if unknown:
        print(f"named mutants: FAIL: no mutant named {', '.join(unknown)}")
        return False
    mutants = [m for m in MUTANTS if not only or m.name in only]
    print("== named mutants: checking anchors", flush=True)
    stale = []
    for m in mutants:
        try:
            apply_edits(m, lambda p: (snapshot / p).read_text(encoding="utf-8"))
        except Stale as exc:
            stale.append(str(exc))
    for s in stale:
        print(f"STALE {s}")
    if stale:
        print("named mutants: FAIL (stale anchors; rewrite the mutants to hit the code again)")
        return False

    workdir.mkdir(parents=True, exist_ok=True)
    pytest_args = list(pytest_args)
    if not with_model_tests and independent_of_core(snapshot, ["model", "tests/model"]):
        # The model's own tests import only the model, which no named mutant touches; they run
        # in the documented test command. Leaving them out here saves their deep searches.
        print("   tests/model left out: they import only the model (checked)", flush=True)
        pytest_args.append("--ignore=tests/model")
    # The cluster tests (marker `cluster`) start a 6-node Redis Cluster per run and check the
    # client layer's routing; every named mutant rewrites a protocol line that the rest of the
    # suite exercises on one node. They run in the documented test command, not once per mutant.
    markers = "not cluster"
    if not full_suite:
        # The searches for the broken designs check the stateful machine against the
        # demonstrations of those designs (verify/broken.py), and the tests marked `slow` are
        # end-to-end runs of real processes and the longest searches; all run in the documented
        # test command (docs/development/testing.md). Under a mutant they would only add
        # minutes: no named mutant is
        # caught by them alone (a mutant that only they caught would show here as SURVIVED, so
        # leaving them out can fail the gate, never pass it wrongly). `--full-suite` keeps them.
        # The same holds for the tests of how verify presents a run (its report, JUnit file,
        # budget, pytest plugin) and of the docs and the bench's audit: no named mutant changes
        # a presentation, and they run in the test command.
        print(
            f"   left out: {', '.join(PRESENTATION_TESTS)} and tests marked slow "
            "(--full-suite keeps them)",
            flush=True,
        )
        pytest_args += [f"--ignore={path}" for path in PRESENTATION_TESTS]
        markers += " and not slow"
    pytest_args += ["-m", markers]
    base = clone(snapshot, workdir / "unmutated")
    check_imports_from(base)
    if confirm_only:
        # The caller ran the whole suite green just before (CI: the documented test command), so
        # the unmutated run is not repeated: each kill is confirmed afterwards by its test
        # passing on the unmutated copy (`confirm_kills`), and the per-test limits are those of
        # the last recorded unmutated run.
        limits = load_recorded_limits(snapshot)
        print(
            f"== named mutants: no whole-suite run on the unmutated copy (--confirm-kills); "
            f"per-test limits from {RECORDED_LIMITS} ({len(limits)} tests)",
            flush=True,
        )
    else:
        print("== named mutants: the suite on the unmutated copy", flush=True)
        # The unmutated run has no per-test limit but the suite's; each test's limit under a
        # mutant is then the larger of --test-timeout and five times its own duration here.
        # On `jobs` cores, as the mutants after it run `jobs` at a time: the run is long (the
        # whole suite but what is left out above) and nothing else runs beside it.
        baseline = run_suite(base, suite_timeout, suite_timeout, pytest_args, workers=jobs)
        if baseline.returncode != 0 or baseline.hung:
            print(
                f"named mutants: FAIL: the suite is red on the unmutated copy (exit "
                f"{baseline.returncode}); failures: "
                f"{[f['test'] for f in baseline.failures][:10]}; log: {baseline.log}"
            )
            print(_tail(baseline.log))
            return False
        print(f"   green in {baseline.seconds:.1f} s", flush=True)
        limits = {
            test: 5 * seconds
            for test, seconds in baseline.durations.items()
            if 5 * seconds > test_timeout
        }
        if record:
            (ROOT / RECORDED_LIMITS).write_text(
                json.dumps(dict(sorted(limits.items())), indent=1) + "\n", encoding="utf-8"
            )
    (workdir / LIMITS).write_text(json.dumps(limits, indent=1), encoding="utf-8")

    killers = load_killers(snapshot)
    print(
        f"== named mutants: {len(mutants)} mutants, {jobs} at a time, each starting with the "
        f"tests that caught it last ({KILLERS}: {len(killers)} recorded)",
        flush=True,
    )
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(
            pool.map(
                lambda m: run_named(
                    snapshot,
                    workdir,
                    m,
                    test_timeout,
                    suite_timeout,
                    pytest_args,
                    all_killers,
                    killers.get(m.name, []),
                ),
                mutants,
            )
        )
    print_named_table(results, verbose)
    confirmed = not confirm_only or confirm_kills(
        base, results, test_timeout, suite_timeout, pytest_args, jobs
    )
    moved = killers_moved(results, killers)
    if record:
        record_killers(ROOT, results)
        print(f"   recorded the first killer of {len(results)} mutants in {KILLERS}")
    elif moved:
        print(
            f"   {KILLERS} is out of date for {', '.join(moved)} (slower, same verdicts): "
            "`python -m mutation.gate --named-only --record-killers` writes it again"
        )
    ok = all(r.ok for r in results) and confirmed
    print(
        f"named mutants: {'PASS' if ok else 'FAIL'} "
        f"({sum(r.verdict == 'killed' for r in results)} killed, "
        f"{sum(r.verdict == 'equivalent' for r in results)} reviewed equivalent, "
        f"{sum(not r.ok for r in results)} failing the gate)"
    )
    return ok


def _short(test: str) -> str:
    return test.removeprefix("tests/")


def print_named_table(results: list[NamedResult], verbose: bool) -> None:
    rows = []
    for r in results:
        names = [_short(f["test"]) for f in r.caught_by]
        unique = list(dict.fromkeys(names))
        if r.verdict == "killed" and unique:
            shown = unique if verbose else unique[:1]
            more = "" if verbose or len(unique) <= 1 else f" (+{len(unique) - 1} more)"
            caught = ", ".join(shown) + more
        else:
            caught = "-"
        rows.append((r.mutant.name, r.verdict, caught, f"{r.seconds:.0f}s"))
    widths = [
        max(len(row[i]) for row in [*rows, ("mutant", "result", "caught by", "time")])
        for i in range(4)
    ]
    line = "  ".join(f"{{:{w}}}" for w in widths)
    print(line.format("mutant", "result", "caught by", "time"))
    print(line.format(*("-" * w for w in widths)))
    for row in rows:
        print(line.format(*row))
    for r in results:
        if r.detail:
            print(f"  {r.mutant.name}: {r.detail}")
        if r.verdict == "killed" and r.caught_by:
            first = r.caught_by[0]
            print(
                f"  {r.mutant.name}: first failure {_short(first['test'])} "
                f"({first['when']}): {first['message']}"
            )


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8").splitlines()[-lines:])
    except OSError:
        return ""


# -- entry point ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mutation.gate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--named-only", action="store_true", help="only the named mutants")
    which.add_argument("--mutmut-only", action="store_true", help="only the mutmut sweep")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="named mutants run in parallel, and mutmut's --max-children",
    )
    parser.add_argument(
        "--test-timeout",
        type=float,
        default=45.0,
        help="fail one test that runs longer under a named mutant (seconds)",
    )
    parser.add_argument(
        "--suite-timeout",
        type=float,
        default=1800.0,
        help="give up on one suite run after this long (seconds)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the copies go (default: a temp dir, removed afterwards)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the copies")
    parser.add_argument("--verbose", "-v", action="store_true", help="list every failing test")
    parser.add_argument(
        "--with-model-tests",
        action="store_true",
        help="run tests/model under the named mutants too (left out by default "
        "when they do not import taskcustody)",
    )
    parser.add_argument(
        "--full-suite",
        action="store_true",
        help="run the broken-design searches and the tests marked slow under "
        "the named mutants too (left out by default: the test command runs them)",
    )
    parser.add_argument(
        "--all-killers",
        action="store_true",
        help="run the whole suite under each named mutant and list every test "
        "that catches it (default: stop at the first, fast tests first)",
    )
    parser.add_argument(
        "--reuse-mutmut",
        type=Path,
        default=None,
        metavar="COPY",
        help="read the verdicts of an earlier mutmut run in COPY (a kept copy "
        "with its mutants/) instead of running mutmut: for reviewing survivors",
    )
    parser.add_argument(
        "--pytest-arg",
        action="append",
        default=[],
        help="extra argument for the named mutants' pytest runs",
    )
    parser.add_argument(
        "--record-killers",
        action="store_true",
        help=f"write the test that caught each mutant into {KILLERS}, which "
        "the next runs start each mutant with",
    )
    parser.add_argument(
        "--confirm-kills",
        action="store_true",
        help="skip the whole-suite run on the unmutated copy (for a caller that "
        "just ran the suite green, as CI does) and confirm instead that each "
        f"test that caught a mutant passes there; limits from {RECORDED_LIMITS}",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this named mutant (repeatable; with --named-only)",
    )
    args = parser.parse_args(argv)

    started = time.monotonic()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="taskcustody-mutation-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ok = True
    try:
        snapshot = make_copy(workdir / "snapshot")
        print(f"== snapshot of the tree in {snapshot}", flush=True)
        if not args.mutmut_only:
            ok = (
                named_gate(
                    snapshot,
                    workdir / "named",
                    args.jobs,
                    args.test_timeout,
                    args.suite_timeout,
                    args.pytest_arg,
                    args.verbose,
                    args.all_killers,
                    args.with_model_tests,
                    args.only,
                    args.full_suite,
                    args.record_killers,
                    args.confirm_kills,
                )
                and ok
            )
        if not args.named_only:
            from mutation.mutmut_gate import mutmut_gate

            ok = (
                mutmut_gate(
                    workdir / "mutmut",
                    args.jobs,
                    args.verbose,
                    snapshot=snapshot,
                    reuse=args.reuse_mutmut,
                )
                and ok
            )
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.keep or args.workdir:
            print(f"copies kept in {workdir}")
    minutes, seconds = divmod(time.monotonic() - started, 60)
    print(f"mutation gate: {'PASS' if ok else 'FAIL'} in {int(minutes)} min {seconds:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
