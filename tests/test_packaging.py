"""Packaging: the core install is the library and the CLI; `verify` needs the
`verify` extra and says so when it is missing; the development tools are the `dev` extra."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_cli_without(blocked: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`taskcustody ARGS` in a fresh interpreter where importing `blocked` fails, as if the
    extra that brings it were not installed."""
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from taskcustody.cli import main\n"
        f"main({list(args)!r}, prog_name='taskcustody')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


@pytest.mark.parametrize("blocked", ["hypothesis", "fakeredis", "lupa"])
def test_verify_without_its_extra_names_the_extra_in_one_line(blocked: str) -> None:
    result = run_cli_without(blocked, "verify", "--examples", "1")
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        f"Error: taskcustody verify needs the verify extra ({blocked} is not installed): "
        "pip install 'taskcustody[verify]'\n"
    )


def test_the_other_commands_work_without_the_verify_extra() -> None:
    listing = run_cli_without("hypothesis", "--help")
    assert listing.returncode == 0, listing.stderr
    assert "verify" in listing.stdout and "taskcustody[verify]" in listing.stdout
    assert "worker" in listing.stdout and "enqueue" in listing.stdout
    usage = run_cli_without("hypothesis", "enqueue", "--queue", "q", "NaN")
    assert usage.returncode == 2 and "not JSON" in usage.stderr


def test_the_library_imports_without_the_verify_extra() -> None:
    code = (
        "import sys\n"
        "for name in ('hypothesis', 'fakeredis', 'lupa'): sys.modules[name] = None\n"
        "import taskcustody, taskcustody.cli\n"
        "from taskcustody import Producer, Server, connect, get_result\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr


def test_the_extras_split_runtime_tests_and_development_tools() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    extras = project["optional-dependencies"]
    for tool in (
        "hypothesis",
        "fakeredis",
        "lupa",
        "prometheus",
        "pytest",
        "mypy",
        "ruff",
        "mutmut",
    ):
        assert tool not in core
    assert {d.split(">")[0] for d in extras["verify"]} == {"fakeredis", "lupa", "hypothesis"}
    # pytest-xdist: the documented test command runs on every core (`-n auto`)
    assert extras["test"] == ["taskcustody[verify,metrics,fast]", "pytest>=8", "pytest-xdist>=3.5"]
    assert extras["metrics"] == ["prometheus-client>=0.17"]
    # hiredis: redis-py's C reply parser, optional (the pure-Python one is the fallback)
    assert extras["fast"] == ["hiredis>=2"]
    assert not any(d.startswith("hiredis") for d in project["dependencies"])
    assert {d.split(">")[0] for d in extras["dev"]} == {
        "taskcustody[test,docs]",
        "mypy",
        "ruff",
        "mutmut",
    }
    # The documentation site (mkdocs.yml), built by .ci/run: its own extra, and in dev.
    assert [d.split(">")[0] for d in extras["docs"]] == ["mkdocs-material"]
    # CI installs what it runs: the static checks and the mutation gate need the dev extra,
    # from the lock. (The mutation gate's copy of the tree has no .ci/.)
    ci = ROOT / ".ci" / "run"
    assert not ci.exists() or (
        "pip install -q -c .ci/constraints.txt -e '.[dev]'" in ci.read_text()
    )


def test_the_version_has_one_source_the_package_reads_and_the_cli_prints() -> None:
    import re
    from importlib.metadata import version

    from click.testing import CliRunner

    import taskcustody
    from taskcustody.cli.app import main

    # Read as text (tomllib is 3.11+, and the matrix runs 3.10): no literal version anywhere.
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]$', pyproject, re.M)
    assert not re.search(r'^version = "', pyproject, re.M)
    assert version("taskcustody") == taskcustody.__version__
    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0 and taskcustody.__version__ in out.output


def test_the_pre_commit_hooks_run_the_locked_ruff() -> None:
    # The hooks and the gate must agree on what "formatted" means: the same ruff release.
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    locked = [
        line.split("==")[1].strip()
        for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines()
        if line.startswith("ruff==")
    ]
    assert locked and f"rev: v{locked[0]}" in config
    assert "id: ruff-check" in config and "id: ruff-format" in config


def test_the_package_data_ships_every_lua_script() -> None:
    """The scripts are read from files next to scripts.py: a wheel without them cannot import.
    Every .lua file under src/taskcustody matches a package-data pattern of `taskcustody`."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["taskcustody"]
    package = ROOT / "src" / "taskcustody"
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    lua = set(package.rglob("*.lua"))
    assert lua and lua <= shipped, sorted(str(p) for p in lua - shipped)


def test_a_build_holds_the_lua_scripts(tmp_path: Path) -> None:
    """What goes into the wheel (setuptools' build_py, which bdist_wheel packs), built from a copy
    of the sources (a build writes into the tree it runs in)."""
    pytest.importorskip("setuptools")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".hypothesis")
    for name in ("src", "model"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    out = tmp_path / "build-lib"
    built = subprocess.run(
        [
            sys.executable,
            "-c",
            "from setuptools import setup; setup()",
            "-q",
            "build_py",
            "--build-lib",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    source = ROOT / "src" / "taskcustody"
    expected = {p.relative_to(source) for p in source.rglob("*.lua")}
    assert (
        expected
        and {p.relative_to(out / "taskcustody") for p in (out / "taskcustody").rglob("*.lua")}
        == expected
    )


def test_the_gate_checks_what_the_hooks_enforce() -> None:
    # A contributor's pre-commit hooks and CI must fail on the same things.
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ruff check src model tests mutation bench" in ci
    assert "ruff format --check src model tests mutation bench" in ci
