"""The README's front door (issue 16, part 8): its sections come in the order a new user needs
them, and its five-line library example runs as written (against a throwaway redis-server: the
URL is the only thing replaced)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.redis_server import throwaway_redis_server

ROOT = Path(__file__).resolve().parent.parent
README_PATH = ROOT / "README.md"
# The mutation gate runs the suite in a copy without the README (mutation/gate.py, COPIED).
README = README_PATH.read_text() if README_PATH.exists() else ""
EXAMPLE_URL = "redis://127.0.0.1:6379/0"

pytestmark = pytest.mark.skipif(not README, reason="no README.md (e.g. the mutation gate's copy)")


def section(heading: str) -> str:
    start = README.index(f"\n{heading}\n")
    following = re.search(r"\n## ", README[start + 1:])
    return README[start: start + 1 + following.start()] if following else README[start:]


def first_example() -> str:
    match = re.search(r"```python\n(.*?)```", section("## A first queue"), re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_opens_with_install_example_cli_verify_then_the_tests() -> None:
    headings = re.findall(r"^#{2,3} .*$", README, re.M)
    order = ["## Install", "## A first queue", "## Using it", "## `taskcustody verify`",
             "## Running the tests", "## The protocol"]
    assert [h for h in headings if h in order] == order
    assert headings[0] == "## Install"  # right after the title and what it is
    # Headings other branches edit, kept as they were.
    for kept in ("## Tested with", "## Benchmarks", "### Retries, dead letters and poison pills"):
        assert kept in headings


def test_the_first_example_is_five_lines() -> None:
    assert len(first_example().strip().splitlines()) == 5


@pytest.mark.real_redis
def test_the_first_example_runs_as_written(tmp_path: Path) -> None:
    code = first_example()
    assert code.count(EXAMPLE_URL) == 1
    with throwaway_redis_server() as server:
        result = subprocess.run([sys.executable, "-c", code.replace(EXAMPLE_URL, server.url)],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "42\n"


@pytest.mark.real_redis
def test_the_asyncio_example_runs_as_written(tmp_path: Path) -> None:
    match = re.search(r"```python\n(.*?)```", section("### asyncio"), re.S)
    assert match is not None
    code = match.group(1)
    assert code.count(EXAMPLE_URL) == 1
    with throwaway_redis_server() as server:
        result = subprocess.run([sys.executable, "-c", code.replace(EXAMPLE_URL, server.url)],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "{'resized': 'https://...'}\n"


def test_every_python_block_of_the_readme_compiles_and_imports_what_exists() -> None:
    import ast

    import taskcustody

    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "taskcustody":
                missing = [a.name for a in node.names if not hasattr(taskcustody, a.name)]
                assert not missing, f"the README imports {missing} from taskcustody"


def test_the_ci_example_uses_options_that_exist() -> None:
    """The "Verify in your CI" workflow: every option it passes to `taskcustody verify` is in
    `verify --help`, every --taskcustody-* option it passes to pytest is the plugin's."""
    from click.testing import CliRunner

    from taskcustody.cli.app import main

    block = re.search(r"```yaml\n(.*?)```", section("### Verify in your CI"), re.S)
    assert block is not None and "image: redis:7" in block.group(1)
    text = block.group(1)
    verify_help = CliRunner().invoke(main, ["verify", "--help"]).output
    verify_options = re.findall(r"--[a-z-]+", text[text.index("taskcustody verify"):
                                                    text.index("python -m pytest")])
    assert {"--redis-url", "--junit-xml", "--max-seconds"} <= set(verify_options)
    for option in verify_options:
        assert option in verify_help, option
    plugin = (ROOT / "src" / "taskcustody_pytest" / "__init__.py").read_text()
    plugin_options = re.findall(r"--taskcustody-[a-z-]+", text)
    assert "--taskcustody-redis-url" in plugin_options
    for option in plugin_options:
        assert f"\"{option}\"" in plugin, option


def test_ci_runs_the_readmes_test_command() -> None:
    """`bash .ci/run` must run exactly the README's test command: a CI that ran something else
    (say without `-n auto`, or with a marker that skips a half) would not vouch for what the
    README tells users to run."""
    block = re.search(r"```bash\n(.*?)```", section("## Running the tests"), re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    test_command = next(c for c in commands if c.startswith("python -m pytest"))
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
